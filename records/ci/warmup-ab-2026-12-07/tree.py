"""Print, for each sampled run (a JSON of sample.py), the CPU-s of the command and each descendant (>= 0.1 s)."""
import json
import sys

for path in sys.argv[1:]:
    ps = json.load(open(path))
    kids: dict[int, list[dict]] = {}
    for q in ps:
        kids.setdefault(q["ppid"], []).append(q)
    def measured(q: dict) -> bool:  # the test's pytest, or the demo build (not ab2.py, whose arguments name it)
        return "pytest -q -p no:cacheprovider" in q["cmd"] or q["cmd"].startswith(
            "/work/main/.venv/bin/python -m prefect_executorch.cli build examples")

    pids = {q["pid"]: q for q in ps}
    roots = [q for q in ps if measured(q) and not measured(pids.get(q["ppid"], {"cmd": ""}))]
    print(f"== {path}")

    def show(q: dict, depth: int = 0) -> float:
        if q["cpu"] >= 0.1:
            print(f"{'  ' * depth}{q['cpu']:6.1f} {q['cmd'][:100].strip()}")
        return q["cpu"] + sum(show(k, depth + 1) for k in kids.get(q["pid"], []))

    total = sum(show(root) for root in roots)
    print(f"   total {total:.1f} CPU-s")
