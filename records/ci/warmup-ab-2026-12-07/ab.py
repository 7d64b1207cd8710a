"""Run one pytest node at a tree with /proc sampled; print the CPU-s of the pytest process and its descendants."""
import json, os, subprocess, sys, time
tree, node = sys.argv[1], sys.argv[2]
out = f"/tmp/ab-{os.path.basename(tree)}-{int(time.time())}.json"
sampler = subprocess.Popen([sys.executable, "/work/main/records/ci/suite-cpu-2026-12-07-4de7476/sample.py", out])
env = dict(os.environ, PYTHONPATH=f"{tree}/src", DO_NOT_TRACK="1", PREFECT_SERVER_ANALYTICS_ENABLED="false")
t = time.monotonic()
p = subprocess.Popen(["/work/main/.venv/bin/python", "-m", "pytest", "-q", "-p", "no:cacheprovider", node], cwd=tree, env=env,
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
text, _ = p.communicate()
wall = time.monotonic() - t
time.sleep(1)
sampler.terminate(); sampler.wait()
ps = json.load(open(out))
kids = {}
for q in ps: kids.setdefault(q["ppid"], []).append(q)
total, stack = 0.0, [q for q in ps if q["pid"] == p.pid]
n = 0
while stack:
    q = stack.pop(); total += q["cpu"]; n += 1; stack += kids.get(q["pid"], [])
print(f"{os.path.basename(tree)} {node.split('::')[-1][:50]} rc={p.returncode} wall={wall:.0f}s cpu={total:.0f}s procs={n} | {text.strip().splitlines()[-1]}")
