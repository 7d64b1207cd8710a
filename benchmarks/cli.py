"""The CLI end to end: full build, unchanged rebuild, and a plain script doing the same work, in one run.

Each round runs, as fresh processes: a plain script (probe, export, validate, publish with the
library, no Prefect) into a new store; ``prefect-executorch build`` of the same spec into another new
store (a fresh build: Prefect's ephemeral API included); the same command again (an unchanged
rebuild). Goals on the medians of ``--rounds`` rounds: rebuild / full build <= 0.3 and
full build / plain script <= 1.3. One untimed CLI build first creates Prefect's database and fills
the toolchain probe's cache (``machine/probecache.py``, in this run's own ``XDG_CACHE_HOME``), as any earlier
build on a machine does: the rebuild answers from that cache without starting a child or Prefect;
the full build still probes for real in its flow, and the plain script probes once, in a child.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import report, scratch, spread  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "convnet" / "spec.yaml"
PLAIN_SCRIPT = '''
import sys
from pathlib import Path

from prefect_executorch.artifacts.publishing import prepare_bundle, publish
from prefect_executorch.artifacts.urls import open_store
from prefect_executorch.export.exporter import export_program
from prefect_executorch.isolation import warm_up
from prefect_executorch.spec.buildspec import load_spec
from prefect_executorch.targets import get_target
from prefect_executorch.machine.toolchain import probe_isolated
from prefect_executorch.validate.validator import require_passed, validate_program

if __name__ == "__main__":
    warm_up()
    spec = load_spec(sys.argv[1])
    toolchain = probe_isolated()
    get_target(spec.target_name).check(spec, toolchain)
    out = Path(sys.argv[3])
    export = export_program(spec, out)
    report = validate_program(spec, export.path, export.data_files, scratch_dir=out, delegation=export.delegation)
    require_passed(report)
    print(publish(open_store(sys.argv[2]), export.path, prepare_bundle(spec, toolchain, export, report)).key.prefix)
'''


def _timed(argv: list[str], env: dict[str, str], expect: str) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    seconds = time.perf_counter() - started
    if done.returncode != 0 or expect not in done.stdout:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3, help="At least 3: the medians are compared.")
    rounds = parser.parse_args().rounds
    if rounds < 3:
        parser.error("--rounds must be at least 3")
    work = scratch("bench-cli-")
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect-home"), "DO_NOT_TRACK": "1",
           "XDG_CACHE_HOME": str(work / "cache")}
    script = work / "plain.py"
    script.write_text(PLAIN_SCRIPT)
    cli = [sys.executable, "-m", "prefect_executorch.cli", "build", str(SPEC)]
    _timed([*cli, "--store", str(work / "store-warmup")], env, "fresh build")
    plain, full, rebuild = [], [], []
    for index in range(rounds):
        plain.append(_timed([sys.executable, str(script), str(SPEC), str(work / f"store-plain-{index}"),
                             str(work / f"out-plain-{index}")], env,
                            "small-convnet/1.0.0/xnnpack/"))
        store = str(work / f"store-cli-{index}")
        full.append(_timed([*cli, "--store", store], env, "fresh build"))
        rebuild.append(_timed([*cli, "--store", store], env, "cache hit"))
    figures = {"plain_script": spread(plain), "cli_full_build": spread(full), "cli_unchanged_rebuild": spread(rebuild),
               "rounds": rounds}
    hit = report("cli_cache_hit", spread(rebuild)["median_s"] / spread(full)["median_s"], "<=0.3", figures)
    overhead = report("cli_overhead", spread(full)["median_s"] / spread(plain)["median_s"], "<=1.3", figures)
    return 0 if hit and overhead else 1


if __name__ == "__main__":
    raise SystemExit(main())
