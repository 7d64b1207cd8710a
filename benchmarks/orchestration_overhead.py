"""Orchestration overhead: the build_bundle flow vs a plain script doing the same work.

Both build the demo model (examples/convnet) from scratch in a fresh process. What each side does:

- flow (``prefect-executorch build`` against a Prefect server started once): probe the toolchain
  in a child; export in a child; validate in a child (6 cases: batch 1, 2, 8, two samples each,
  compared with eager; windowed latency of eager vs program at batch 2, until stable or 5 s; the
  cases written to a ``model.bpte``); run the ``.bpte``'s cases in a second child; publish the
  program, the ``.bpte`` and the manifest with sha256s; Prefect task runs, events, assets,
  artifacts and cache records.
- plain script (executorch and hashlib directly, one process, no Prefect, no children): the same
  export, the same 6 cases compared with eager, the same windowed latency measurement
  (``prefect_executorch.validate.latency.measure_together``, a pure timing loop, with the spec's defaults:
  5 runs per window, 2 warm-up runs, 5 s cap), the cases written to a ``model.bpte`` and run by
  ExecuTorch's bundled-program verifier (in-process), then the program, the ``.bpte`` and a
  manifest of their sha256s written to a store folder.

So the ratio measures what Prefect, child isolation, the probe and the manifest/report bookkeeping
cost, not the latency windows or the bundled cases, which both sides do (until 2026-12-03 the plain
script did neither). The one-time Prefect server start is reported apart. Goal: flow / plain <= 1.15.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import report, scratch, spread  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "examples" / "convnet" / "spec.yaml"

PLAIN = textwrap.dedent('''
    import hashlib, json, sys, time
    from pathlib import Path
    import torch
    from torch.export import Dim
    from executorch.exir import to_edge_transform_and_lower
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from prefect_executorch.machine.hostprobe import stock_runtime  # ExecuTorch's runtime extension (1.5 renamed it _C)
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.core import BundledProgram
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer
    from prefect_executorch.validate.latency import measure_together
    sys.path.insert(0, sys.argv[2])
    from model import build
    out = Path(sys.argv[1]); out.mkdir(parents=True)
    model = build().eval()
    x = torch.rand(2, 3, 32, 32) * 2 - 1
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: Dim("b", min=1, max=8)},))
    prog = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
    (out / "model.pte").write_bytes(prog.buffer)
    module = stock_runtime()._load_for_executorch(str(out / "model.pte"))
    g = torch.Generator().manual_seed(0)
    cases = []
    with torch.no_grad():
        for batch in (1, 2, 8):
            for _ in range(2):
                inp = torch.rand(batch, 3, 32, 32, generator=g) * 2 - 1
                got, want = module.run_method("forward", (inp,))[0], model(inp)
                torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
                cases.append(MethodTestCase(inputs=[inp], expected_outputs=[want]))
        opt = cases[2].inputs[0]
        measure_together([lambda: model(opt), lambda: module.run_method("forward", (opt,))],
                         min_runs=5, warmup=2, max_seconds=5)
    suite = MethodTestSuite(method_name="forward", test_cases=cases)
    bundled = BundledProgram(None, [suite], pte_file_path=str(out / "model.pte"))
    (out / "model.bpte").write_bytes(serialize_from_bundled_program_to_flatbuffer(bundled))
    loaded = stock_runtime()._load_bundled_program_from_buffer((out / "model.bpte").read_bytes())
    for index in range(len(cases)):
        loaded.verify_result_with_bundled_expected_output("forward", index, 1e-4, 1e-4)
    store = out / "store"; store.mkdir()
    digests = {}
    for name in ("model.pte", "model.bpte"):
        data = (out / name).read_bytes()
        (store / name).write_bytes(data)
        digests[name] = hashlib.sha256(data).hexdigest()
    (store / "manifest.json").write_text(json.dumps(digests))
''')


def timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3, help="Builds per side (the median is compared).")
    args = parser.parse_args()
    if args.repeat < 3:
        parser.error("--repeat must be at least 3 (the medians are compared)")
    work = scratch("bench-orchestration-")
    env = {**os.environ, "DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_HOME": str(work / "prefect-home"), "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180"}
    script = work / "plain.py"
    script.write_text(PLAIN)

    # The flow runs against a Prefect server started once; its start-up is reported separately.
    port = 4200 + os.getpid() % 1000
    started = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port",
                               str(port), "--no-ui", "--analytics-off"], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    env["PREFECT_API_URL"] = f"http://127.0.0.1:{port}/api"
    try:
        import httpx

        while True:
            try:
                if httpx.get(f"{env['PREFECT_API_URL']}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        prefect_start = time.perf_counter() - started
        plain, flow = [], []
        for i in range(args.repeat):
            plain.append(timed([sys.executable, str(script), str(work / f"plain-{i}"), str(SPEC.parent)], env))
            flow.append(timed([sys.executable, "-m", "prefect_executorch.cli", "build", str(SPEC), "--store",
                               str(work / f"store-{i}")], env))
    finally:
        server.terminate()
        server.wait(timeout=30)
    p, f = spread(plain)["median_s"], spread(flow)["median_s"]
    return 0 if report("orchestration_overhead", f / p, "<=1.15", {
        "plain_script": spread(plain), "build_bundle_flow": spread(flow),
        "prefect_server_start_s (one-time, excluded)": round(prefect_start, 2), "repeat": args.repeat,
    }) else 1


if __name__ == "__main__":
    sys.exit(main())
