"""Scaling: build time, bundle size and publish time for models of growing weight size (XNNPACK).

Each size is built ``--runs`` times (at least 3, as new versions: bundles are never overwritten);
each row gives every stage's median, min and max over those runs. Writes results/scaling.json and
results/scaling.png (medians).

What a user pays for weights: the RESULT line's ratio is the marginal build time per MB of weights
(median build time of the largest model minus the smallest's, over the MB between them) against
``SECONDS_PER_MB``. Goal <= 1. Why that bound: on 2026-12-04 the build took about 0.03 s per extra MB
(export, validation, bundle, publish); a second full pass over the weights at disk speed, or a
quadratic step, doubles that and fails. The larger step (50 to 500 MB) must also cost no more per MB
than 1.5x the smaller one (1 to 50 MB), so growth faster than linear fails even when it starts cheap.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import RESULTS, report, scratch, spread  # noqa: E402

#: Marginal build seconds per MB of weights a user may pay (see the docstring for why).
SECONDS_PER_MB = 0.06

from prefect_executorch.artifacts.publishing import prepare_bundle, publish  # noqa: E402
from prefect_executorch.artifacts.store import LocalStore  # noqa: E402
from prefect_executorch.export.exporter import export_program  # noqa: E402
from prefect_executorch.machine.toolchain import probe  # noqa: E402
from prefect_executorch.spec.buildspec import parse_spec  # noqa: E402
from prefect_executorch.validate.validator import validate_program  # noqa: E402

MODELS = Path(__file__).parent / "scaling_models.py"


def build_one(megabytes: float, work: Path, run: int = 0) -> dict[str, float]:
    """Export, validate and publish one model of about ``megabytes`` of weights (version ``<mb>mb-<run>``)."""
    from scaling_models import factory_name, width

    spec = parse_spec({
        "name": "scaling", "version": f"{megabytes:g}mb-{run}", "model": f"{MODELS}:{factory_name(megabytes)}",
        "target": "xnnpack", "methods": {"forward": {"inputs": [{"name": "x", "shape": [2, width(megabytes)]}]}},
        "validation": {"samples": 1, "atol": 1e-3, "rtol": 1e-3},
    })
    started = time.perf_counter()
    export = export_program(spec, work / "out")
    exported = time.perf_counter()
    report_ = validate_program(spec, export.path, export.data_files, scratch_dir=work / "out")
    validated = time.perf_counter()
    manifest = prepare_bundle(spec, probe(), export, report_)
    publish(LocalStore(work / "store"), export.path, manifest)
    published = time.perf_counter()
    size = sum(entry.size for entry in manifest.files)
    return {"weights_mb": megabytes, "bundle_mb": round(size / 2**20, 2), "export_s": round(exported - started, 2),
            "validate_s": round(validated - exported, 2), "publish_s": round(published - validated, 3),
            "build_s": round(published - started, 2), "passed": float(report_.passed)}


def plot(rows: list[dict[str, float]]) -> Path:
    """Build and publish time against bundle size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    sizes = [r["bundle_mb"] for r in rows]
    for key in ("export_s", "validate_s", "build_s"):
        left.plot(sizes, [r[key] for r in rows], marker="o", label=key)
    left.set(xscale="log", xlabel="bundle size (MB)", ylabel="seconds", title="build cost")
    left.legend()
    right.plot(sizes, [r["publish_s"] for r in rows], marker="o")
    right.set(xscale="log", xlabel="bundle size (MB)", ylabel="seconds", title="publish (local store)")
    fig.tight_layout()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / "scaling.png"
    fig.savefig(path, dpi=100)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 50, 500])
    parser.add_argument("--runs", type=int, default=3, help="Builds per size (at least 3; medians are compared).")
    args = parser.parse_args()
    if args.runs < 3:
        parser.error("--runs must be at least 3")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    work = scratch("bench-scaling-")
    # The first export in a process pays for the export server's imports: not a cost of model size.
    warm_up_s = build_one(0.1, work)["build_s"]
    rows, spreads = [], {}
    for megabytes in args.sizes_mb:
        runs = [build_one(megabytes, work, run) for run in range(args.runs)]
        stages = {key: spread([r[key] for r in runs], digits=3) for key in ("export_s", "validate_s", "publish_s", "build_s")}
        rows.append({**runs[0], **{key: value["median_s"] for key, value in stages.items()},
                     "passed": min(r["passed"] for r in runs)})
        spreads[f"{megabytes:g}MB"] = {"bundle_mb": runs[0]["bundle_mb"], **stages}
        print(spreads[f"{megabytes:g}MB"])
    figures: dict[str, object] = dict(spreads)
    figures["plot"] = str(plot(rows))
    figures["warm_up_build_s (excluded)"] = warm_up_s
    marginal = [(b["build_s"] - a["build_s"]) / max(b["bundle_mb"] - a["bundle_mb"], 1e-9) for a, b in zip(rows, rows[1:], strict=False)]
    figures["marginal_s_per_mb"] = [round(m, 4) for m in marginal]
    per_mb = (rows[-1]["build_s"] - rows[0]["build_s"]) / max(rows[-1]["bundle_mb"] - rows[0]["bundle_mb"], 1e-9)
    superlinear = len(marginal) > 1 and marginal[-1] > 1.5 * max(marginal[0], 0.0)
    ratio = per_mb / SECONDS_PER_MB
    checks = {"no superlinear growth (last marginal s/MB at most 1.5x the first)": not superlinear,
              "every build's validation passed": all(row["passed"] for row in rows)}
    return 0 if report("scaling", ratio, "<=1", figures, checks) else 1


if __name__ == "__main__":
    sys.exit(main())
