"""Run a command with /proc sampled; print each descendant's CPU-s."""
import json, os, subprocess, sys, time
tree = sys.argv[1]; cmd = sys.argv[2:]
out = f"/tmp/ab2-{os.path.basename(tree)}-{int(time.time())}.json"
sampler = subprocess.Popen([sys.executable, "/work/main/records/ci/suite-cpu-2026-12-07-4de7476/sample.py", out])
env = dict(os.environ, PYTHONPATH=f"{tree}/src", DO_NOT_TRACK="1", PREFECT_SERVER_ANALYTICS_ENABLED="false")
t = time.monotonic()
p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
wall = time.monotonic() - t
time.sleep(1); sampler.terminate(); sampler.wait()
ps = json.load(open(out)); kids = {}
for q in ps: kids.setdefault(q["ppid"], []).append(q)
total = 0.0
def show(q, d=0):
    global total
    total += q["cpu"]
    if q["cpu"] > 0.05: print(f'{"  "*d}{q["cpu"]:6.1f} {q["cmd"][:90]}')
    for k in kids.get(q["pid"], []): show(k, d + 1)
for q in ps:
    if q["pid"] == p.pid if hasattr(p, "pid") else False: show(q)
roots = [q for q in ps if q["cmd"].startswith(cmd[0]) and " ".join(cmd[1:3]) in q["cmd"]]
for r in roots: show(r)
print(f"{os.path.basename(tree)} rc={p.returncode} wall={wall:.0f}s cpu={total:.0f}s | {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ''} {p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ''}")
