"""README's benchmark table, generated from the result files of one published run.

    python benchmarks/publish                 # copies benchmarks/results/*.json to benchmarks/published/<UTC time>/
    python benchmarks/table.py benchmarks/published/<UTC time>

Every figure of the table is read from those files: the ratio, the goal and its verdict, the medians
and spreads the ratio was made of, and the machine each result was written on (load, commit).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _spreads(figures: dict[str, Any]) -> str:
    """The figures that are spreads of repeated runs, as ``name median [min–max]``."""
    parts = []
    for name, value in figures.items():
        if isinstance(value, dict):
            median = next((value[k] for k in value if k.startswith("median_")), None)
            low = next((value[k] for k in value if k.startswith("min_")), None)
            high = next((value[k] for k in value if k.startswith("max_")), None)
            unit = next((k.removeprefix("median_") for k in value if k.startswith("median_")), "")
            if median is not None:
                parts.append(f"{name.replace('_', ' ')} {median} [{low}–{high}] {unit}")
    return "; ".join(parts)


def rows(folder: Path) -> list[str]:
    """One markdown row per result file in ``folder``, by name."""
    lines = ["| benchmark | ratio | goal | result | what the ratio was made of (median [min–max]) | written (UTC) | load 1/5/15 min | commit |",
             "|---|---|---|---|---|---|---|---|"]
    for path in sorted(folder.glob("*.json")):
        result = json.loads(path.read_text())
        machine = result.get("machine", {})
        load = "/".join(str(x) for x in machine.get("load_average_1_5_15m", [])) or "-"
        tree = machine.get("commit") or "-"
        commit = tree[:8] + ("-dirty" if tree.endswith("-dirty") else "")
        lines.append(f"| {result['name']} | {result['ratio']:.3g} | {result['goal']} | "
                     f"{'PASS' if result['passed'] else 'FAIL'} | {_spreads(result['figures']) or '-'} | "
                     f"{result['time']} | {load} | {commit} |")
    return lines


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit("usage: python benchmarks/table.py benchmarks/published/<run>")
    print("\n".join(rows(Path(sys.argv[1]))))
