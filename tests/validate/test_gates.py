"""Validation gates: a method whose delegation or latency is unknown or too low fails its gate."""

from __future__ import annotations

from prefect_executorch.spec.validation import ValidationSpec
from prefect_executorch.targets.delegation import DelegationFacts
from prefect_executorch.validate.report import LatencyResult
from prefect_executorch.validate.validator import check_gates


def test_gates_fail_on_unknown_or_low_figures() -> None:
    spec = ValidationSpec(min_delegated_fraction=0.5, max_latency_ratio=2)
    delegation = {"forward": DelegationFacts(delegated_ops=1, total_ops=4, undelegated={"aten.sort.default": 3})}
    latency = [LatencyResult(method="forward", shape_label="opt", input_shapes=[[1]], runs=5, eager_median_ms=1,
                             eager_p90_ms=1, program_median_ms=1.5, program_p90_ms=2, ratio=1.5)]
    gates = check_gates(spec, ["forward", "encode"], delegation, latency)
    assert [(g.gate, g.method, g.passed) for g in gates] == [
        ("min_delegated_fraction", "forward", False), ("min_delegated_fraction", "encode", False),
        ("max_latency_ratio", "forward", True), ("max_latency_ratio", "encode", False)]
    assert "0.250 of operators delegated (1 of 4), below 0.5; left outside: aten.sort.default x3" in gates[0].detail
    assert gates[1].detail.startswith("unknown") and gates[3].detail.startswith("not measured")
