"""Quantized builds: the spec, the targets' refusals, compat keys, and real quantized XNNPACK exports
validated against the float eager model with quantization and lowering error kept apart.

Two real exports (an export takes 20-60 s on the shared machine): ``da4w`` (int8da4w through the
``build_bundle`` flow into a local store) and ``static`` (int8-static calibrated on a dataset).
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import torch

from prefect_executorch.artifacts.manifest import Manifest
from prefect_executorch.artifacts.publishing import verify_bundle_dir
from prefect_executorch.artifacts.store import LocalStore
from prefect_executorch.errors import SpecError, ValidationFailed
from prefect_executorch.export.exporter import export_program
from prefect_executorch.export.fingerprint import build_fingerprint
from prefect_executorch.machine.compat import cpu_compat, fit, parse_compat
from prefect_executorch.machine.toolchain import Toolchain
from prefect_executorch.spec.buildspec import BuildSpec, parse_spec
from prefect_executorch.spec.schemes import SCHEMES
from prefect_executorch.spec.validation import ValidationSpec
from prefect_executorch.targets import get_target
from prefect_executorch.validate.compare import compare_outputs, limits_for
from prefect_executorch.validate.report import ValidationReport
from prefect_executorch.validate.validator import require_passed, validate_program

from helpers import TESTS

MODELS = TESTS / "quantized_models.py"
CPU = Toolchain(python="3.11", os="Linux", arch="x86_64", torch="2.13.0", executorch="1.4.1")


def quantized_spec(quantization: dict[str, Any] | None, target: str = "xnnpack", **validation: Any) -> BuildSpec:
    data: dict[str, Any] = {
        "name": "two-linears", "version": "1", "model": f"{MODELS}:two_linears", "target": target,
        "methods": {"forward": {"inputs": [{"name": "x", "shape": [4, 64], "dynamic": {0: {"min": 1, "max": 8}}}]}},
        "validation": {"samples": 2, "latency_runs": 3, **validation},
    }
    if quantization is not None:
        data["quantization"] = quantization
    return parse_spec(data)


def test_unknown_scheme_is_a_spec_error_naming_every_scheme() -> None:
    with pytest.raises(SpecError) as info:
        quantized_spec({"scheme": "int4-weight-only"})
    message = str(info.value)
    assert "quantization.scheme: unknown scheme 'int4-weight-only'" in message
    assert all(scheme in message for scheme in SCHEMES)


@pytest.mark.parametrize(("quantization", "expected"), [
    ({"scheme": "int8-dynamic", "group_size": 64}, "group_size applies to int8da4w only"),
    ({"scheme": "int8da4w", "calibration": {}}, "calibration applies to int8-static, int8, fp8 only"),
    ({"scheme": "int8da4w", "group_size": 1}, "quantization.group_size"),
    ({"scheme": "int8-static", "calibration": {"dataset": "no-function"}}, "quantization.calibration.dataset"),
    ({"scheme": "int8-static", "calibrate": "validation"}, "quantization.calibrate: unknown field"),
])
def test_options_that_do_not_fit_the_scheme_are_spec_errors(quantization: dict[str, Any], expected: str) -> None:
    with pytest.raises(SpecError, match=expected):
        quantized_spec(quantization)


def test_group_size_defaults_to_32_and_a_relative_calibration_dataset_resolves_against_the_spec(tmp_path: Path) -> None:
    assert quantized_spec({"scheme": "int8da4w"}).quantization.effective_group_size == 32  # type: ignore[union-attr]
    spec = parse_spec({**quantized_spec(None).model_dump(mode="json"),
                       "quantization": {"scheme": "int8-static", "calibration": {"dataset": "data.py:batches"}}},
                      base_dir=tmp_path)
    assert spec.quantization.calibration.dataset == f"{tmp_path.resolve()}/data.py:batches"  # type: ignore[union-attr]


def test_a_float_spec_keeps_its_hash_and_a_quantized_one_gets_another() -> None:
    float_spec = quantized_spec(None)
    assert "quantization" not in float_spec.canonical_json()
    hashes = {quantized_spec(q).sha256() for q in (None, {"scheme": "int8da4w"}, {"scheme": "int8da4w", "group_size": 64})}
    assert len(hashes) == 3


def test_the_cache_key_of_a_quantized_build_covers_its_scheme_and_torchao() -> None:
    float_print = build_fingerprint(quantized_spec(None), CPU, "cpu-xnnpack-x86_64", "/s")
    assert "quantization" not in float_print.spec and "torchao" not in float_print.toolchain
    da4w_print = build_fingerprint(quantized_spec({"scheme": "int8da4w"}), CPU, "cpu-xnnpack-x86_64-int8da4wg32", "/s")
    assert da4w_print.spec["quantization"] == {"scheme": "int8da4w", "group_size": None, "calibration": None}
    assert da4w_print.toolchain["torchao"] == version("torchao")
    group_64 = quantized_spec({"scheme": "int8da4w", "group_size": 64})
    assert build_fingerprint(group_64, CPU, "cpu-xnnpack-x86_64-int8da4wg32", "/s").key() != da4w_print.key()


@pytest.mark.parametrize(("target", "scheme", "reason"), [
    ("portable", "int8-dynamic", "torchao's *_affine operators have no ExecuTorch kernel"),
    ("portable", "int8-static", "fails with OperatorMissing); use target xnnpack"),
    ("xnnpack", "int8-weight-only", "no float-activation/int8-weight linear"),
    ("tensorrt", "int8da4w", "produce CPU (XNNPACK) programs"),
    ("tensorrt", "int8-static", "produce CPU (XNNPACK) programs"),
])
def test_a_target_refuses_a_scheme_it_cannot_build_in_its_check(target: str, scheme: str, reason: str) -> None:
    spec = quantized_spec({"scheme": scheme}, target=target)
    with pytest.raises(SpecError) as info:
        get_target(target).check(spec, CPU)
    assert f"quantization.scheme: target {target!r} cannot build {scheme!r}" in str(info.value)
    assert reason in str(info.value)


@pytest.mark.parametrize("scheme", ["int8-dynamic", "int8da4w", "int8-static"])
def test_xnnpack_takes_the_schemes_it_lowers(scheme: str) -> None:
    assert get_target("xnnpack").check(quantized_spec({"scheme": scheme}), CPU) == []


def test_quantized_compat_key_names_the_scheme_and_is_never_picked_over_float_by_auto() -> None:
    target = get_target("xnnpack")
    schemes: list[dict[str, Any]] = [{"scheme": "int8da4w"}, {"scheme": "int8da4w", "group_size": 64},
                                     {"scheme": "int8-dynamic"}]
    keys = {q["scheme"] + str(q.get("group_size", "")): target.compat(quantized_spec(q), CPU) for q in schemes}
    assert keys == {"int8da4w": "cpu-xnnpack-x86_64-int8da4wg32", "int8da4w64": "cpu-xnnpack-x86_64-int8da4wg64",
                    "int8-dynamic": "cpu-xnnpack-x86_64-int8dynamic"}
    assert target.compat(quantized_spec(None), CPU) == "cpu-xnnpack-x86_64"
    parsed = parse_compat("cpu-xnnpack-x86_64-int8static")
    assert (parsed.backend, parsed.arch, parsed.quantization) == ("xnnpack", "x86_64", "int8static")
    assert cpu_compat("xnnpack", "aarch64", quantization="int8dynamic") == "cpu-xnnpack-aarch64-int8dynamic"
    quantized, float_portable = fit("cpu-xnnpack-x86_64-int8da4wg32", CPU), fit("cpu-portable-x86_64", CPU)
    assert quantized.ok and quantized.rank < float_portable.rank < fit("cpu-xnnpack-x86_64", CPU).rank
    assert not fit("cpu-xnnpack-aarch64-int8dynamic", CPU).ok
    with pytest.raises(SpecError):
        parse_compat("cpu-xnnpack-x86_64-fp8")


def test_quantized_defaults_are_a_cosine_floor_and_a_relative_error_which_outputs_can_override() -> None:
    spec = ValidationSpec(outputs={"[1]": {"max_rel_error": 0.5}}, methods={"forward": {"outputs": {"[2]": {"atol": 0.01}}}})
    assert limits_for(spec, "forward", "[0]", "float32", quantization="int8da4w") == (
        None, None, 0.98, "default for int8da4w quantization", 0.2)
    assert limits_for(spec, "forward", "[1]", "float32", quantization="int8-dynamic") == (
        None, None, 0.995, "validation.outputs['[1]']", 0.5)
    assert limits_for(spec, "forward", "[2]", "float32", quantization="int8-static")[:2] == (0.01, None)
    eager = (torch.linspace(-1, 1, 100),) * 3
    # 5% relative noise everywhere: far beyond float tolerances, within int8da4w's gate.
    program = [t + 0.05 * t.abs().mean() * torch.sign(torch.sin(torch.arange(100.0) * 7)) for t in eager]
    first, second, third = compare_outputs(program, eager, spec, "forward", quantization="int8da4w")
    assert first.passed and first.mismatch_fraction == 0.0 and first.rel_error == pytest.approx(0.0433, abs=1e-3)
    # An atol given for a quantized output turns the element-wise check back on, with rtol 0.
    assert second.passed and not third.passed
    assert third.reason is not None and "of elements beyond atol=0.01 + rtol=0*|eager|" in third.reason
    (strict,) = compare_outputs(program[:1], eager[:1], ValidationSpec(outputs={"[0]": {"max_rel_error": 0.01}}),
                                quantization="int8-dynamic")
    assert strict.reason is not None and strict.reason.startswith("relative error |program - eager| / |eager| = 0.04")


@pytest.fixture(scope="module")
def da4w(tmp_path_factory: pytest.TempPathFactory, prefect_harness: None) -> tuple[BuildSpec, Path, Manifest]:
    """An int8da4w build of ``two_linears`` through the build flow, published to a local store."""
    from prefect_executorch.flows.build import build_bundle

    spec = quantized_spec({"scheme": "int8da4w"})
    store = LocalStore(tmp_path_factory.mktemp("da4w") / "store")
    ref = build_bundle(spec, store=str(store.root))
    bundle = store.root / ref.key.prefix
    return spec, bundle, verify_bundle_dir(bundle)


def test_int8da4w_bundle_records_scheme_group_torchao_and_sizes(da4w: tuple[BuildSpec, Path, Manifest]) -> None:
    spec, bundle, manifest = da4w
    assert manifest.compat == "cpu-xnnpack-x86_64-int8da4wg32" and bundle.name == manifest.compat
    facts = manifest.quantization
    assert facts is not None and (facts.scheme, facts.group_size, facts.calibration) == ("int8da4w", 32, None)
    assert facts.torchao == version("torchao")
    # fc2 takes 40 features, which no group of 32 divides: it stays float and the facts say so.
    assert (facts.quantized_linears, facts.float_linears) == (1, ["fc2"])
    program = manifest.file("model.pte")
    assert program.size == (bundle / "model.pte").stat().st_size
    report = ValidationReport.model_validate_json((bundle / "validation.json").read_text())
    assert report.quantization == facts and report.file_sizes == {"model.pte": program.size}
    assert manifest.validation.quantization == facts


def test_int8da4w_validates_against_float_eager_with_the_two_errors_apart(da4w: tuple[BuildSpec, Path, Manifest]) -> None:
    spec, bundle, manifest = da4w
    report = ValidationReport.model_validate_json((bundle / "validation.json").read_text())
    assert report.passed and [c.shape_label for c in report.cases] == ["min", "min", "opt", "opt", "max", "max"]
    for case in report.cases:
        (gate,), (quantization,), (lowering,) = case.outputs, case.quantization_error, case.lowering_error
        assert gate.tolerance_source == "default for int8da4w quantization"
        assert (gate.atol, gate.rtol, gate.min_cosine, gate.max_rel_error) == (None, None, 0.98, 0.2)
        assert gate.mismatch_fraction == 0.0 and gate.rel_error is not None and gate.rel_error <= 0.2
        # Rounding weights to 4 bits costs far more than XNNPACK's kernels add on top.
        assert quantization.rel_error is not None and lowering.rel_error is not None
        assert 1e-3 < quantization.rel_error < 0.2 and lowering.rel_error < quantization.rel_error
        assert quantization.cosine is not None and 0.98 < quantization.cosine < 1.0
    summary = manifest.validation
    assert summary.quantization_rel_error == max(c.quantization_error[0].rel_error or 0.0 for c in report.cases)
    assert summary.lowering_rel_error == max(c.lowering_error[0].rel_error or 0.0 for c in report.cases)


def test_a_quantized_bundle_carries_its_cases_and_verifies_them_by_its_own_gates(
        da4w: tuple[BuildSpec, Path, Manifest], tmp_path: Path) -> None:
    from prefect_executorch.runtime.bundled_cases import BUNDLED_FILE, run_bundled_cases, verify_bundled

    _, bundle, manifest = da4w
    facts = manifest.bundled
    assert facts is not None and facts.file == BUNDLED_FILE and facts.skipped is None
    method = facts.methods["forward"]
    assert (method.atol, method.rtol, method.min_cosine, method.max_rel_error) == (None, None, 0.98, 0.2)
    check = run_bundled_cases(bundle, manifest.target, manifest.data_files, facts, scratch_dir=tmp_path)
    assert len(check.results) == 6 and not check.failures
    # And as a C++ service runs it: ExecuTorch's C++ runtime, the same gates, the libraries the manifest names.
    from prefect_executorch.runtime.cpp_consumer import run_cpp_consumer

    assert run_cpp_consumer(bundle, manifest).cases == 6
    assert manifest.runtime_hints["cpp_libraries"][:2] == ["libexecutorch", "libexecutorch_backend_xnnpack"]
    # The same cases held to a relative error the 4-bit weights cannot meet: every case fails, by that gate.
    strict = {"forward": method.model_copy(update={"max_rel_error": 1e-6})}
    failed = verify_bundled(bundle, manifest.target, manifest.data_files, strict, scratch_dir=tmp_path)
    assert len(failed.failures) == 6 and all("relative error" in (r.error or "") for r in failed.failures)


def test_a_tighter_relative_error_per_output_fails_and_names_both_parts(
    da4w: tuple[BuildSpec, Path, Manifest], tmp_path: Path
) -> None:
    _, bundle, _ = da4w
    strict = quantized_spec({"scheme": "int8da4w"}, latency_runs=0,
                            methods={"forward": {"outputs": {"[0]": {"max_rel_error": 1e-4}}}})
    report = validate_program(strict, bundle, [], scratch_dir=tmp_path)
    assert not report.passed
    first = report.cases[0].outputs[0]
    assert first.tolerance_source == "validation.methods.forward.outputs['[0]']" and first.max_rel_error == 1e-4
    with pytest.raises(ValidationFailed) as info:
        require_passed(report)
    message = str(info.value)
    assert "> max_rel_error 0.0001 from validation.methods.forward.outputs['[0]']" in message
    assert "quantization alone: rel error" in message and "; lowering: rel error" in message


def test_int8_static_calibrates_on_a_dataset_and_validates(tmp_path: Path) -> None:
    calibration = {"dataset": f"{MODELS}:calibration", "max_samples": 3}
    spec = quantized_spec({"scheme": "int8-static", "calibration": calibration}, latency_runs=0)
    assert get_target("xnnpack").compat(spec, CPU) == "cpu-xnnpack-x86_64-int8static"
    export = export_program(spec, tmp_path / "out")
    facts = export.quantization
    assert facts is not None and facts.scheme == "int8-static" and facts.group_size is None
    assert facts.calibration == f"dataset {MODELS}:calibration (3 samples)" and facts.calibration_samples == 3
    report = validate_program(spec, export.path, export.data_files, scratch_dir=tmp_path / "out")
    assert report.passed and report.quantization == facts
    for case in report.cases:
        assert case.outputs[0].tolerance_source == "default for int8-static quantization"
        assert case.quantization_error[0].rel_error is not None and case.quantization_error[0].rel_error > 0
        assert case.lowering_error[0].passed
    assert export.delegates()["forward"] == ["XnnpackBackend"]
