"""Property tests of every parser that takes outside input.

For each parser, over generated input: nothing raises but the project's typed errors; nothing
nonsensical is accepted (each ``assert_*`` below states its invariants, checked against torch's own
dtype limits where there is one); what is accepted round-trips (parse -> dump -> parse is equal).
Each test records its counts (``record_parser``) for the table printed at the end of the session.
"""

from __future__ import annotations

import functools
import json
import keyword
import math
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from prefect_executorch.artifacts.aliases import AliasRecord, parse_alias
from prefect_executorch.artifacts.locate import parse_manifest_url
from prefect_executorch.artifacts.manifest import BundleKey, FileEntry, Manifest, MethodEntry
from prefect_executorch.artifacts.publishing import manifest_bytes, parse_manifest
from prefect_executorch.artifacts.s3 import S3Store
from prefect_executorch.artifacts.signing import seal
from prefect_executorch.artifacts.store import LocalStore
from prefect_executorch.artifacts.urls import open_store
from prefect_executorch.cli.main import app
from prefect_executorch.errors import IntegrityError, PrefectExecutorchError, SpecError
from prefect_executorch.machine.compat import parse_compat
from prefect_executorch.spec.buildspec import BuildSpec, load_spec, parse_spec
from prefect_executorch.spec.methods import InputSpec
from prefect_executorch.validate.report import ValidationSummary

Record = Callable[[str, int, int, int], None]

#: The rules, restated here rather than imported, so a loosened rule in the code fails these tests.
SEGMENT = re.compile(r"[a-z0-9][a-z0-9._-]{0,127}")
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
SHA256 = re.compile(r"[0-9a-f]{64}")
BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
MAX_DIM = 2**31 - 1
DTYPES = ["float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool"]
DEMO_SPEC = (Path(__file__).parents[2] / "examples" / "convnet" / "spec.yaml").read_text()


class Tally:
    """Inputs seen and refused (with a typed error) by one parser, and the invariants they broke."""

    def __init__(self) -> None:
        self.seen = 0
        self.refused = 0
        self.violations: list[str] = []

    def parse(self, parse: Callable[[], Any], refusal: type[Exception] = PrefectExecutorchError) -> Any:
        """``parse()``'s result, or None when it refused with ``refusal``; any other exception fails the test."""
        self.seen += 1
        try:
            return parse()
        except refusal:
            self.refused += 1
            return None


def _counting(check: Callable[..., None], tally_of: Callable[[tuple[Any, ...]], Tally]) -> Callable[..., None]:
    """``check`` with its broken invariants and stray exceptions counted in a ``Tally``, not raised.

    Every generated input is then judged and counted; the test records the count and fails after
    (``recorded``), so the table shows what was observed, a failing run included.
    """

    @functools.wraps(check)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            check(*args, **kwargs)
        except AssertionError as exc:
            tally_of(args).violations.append(f"invariant broken: {str(exc)[:300]}")
        except Exception as exc:  # noqa: BLE001 - anything but a typed refusal is a violation
            tally_of(args).violations.append(f"raised {type(exc).__name__}: {str(exc)[:300]}")

    return run


def counted(check: Callable[..., None]) -> Callable[..., None]:
    """A module-level property check, its ``Tally`` its first argument (see ``_counting``)."""
    return _counting(check, lambda args: args[0])


def counted_in(tally: Tally) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A property check nested in its test, closing over ``tally`` (see ``_counting``)."""
    return lambda check: _counting(check, lambda args: tally)


def recorded(record: Record, parser: str, tally: Tally) -> None:
    """Write the parser's row with what was observed, then fail on any violation."""
    record(parser, tally.seen, tally.refused, len(tally.violations))
    assert not tally.violations, f"{len(tally.violations)} violations, first: {tally.violations[:3]}"


# -- values: plausible ones mixed with nonsense of every JSON/YAML type -----------------------------------

NONSENSE = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 2**31 - 1, 2**31, 2**63, 2**64]),
    st.floats(), st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, -1e308, 0.5, 3.0]),
    st.text(max_size=6), st.sampled_from(["", " ", "x\n", "..", "a/b", "1", "true", ".nan", "é"]),
    st.lists(st.integers(-2, 4), max_size=3), st.dictionaries(st.text(max_size=2), st.integers(0, 3), max_size=2),
)
SIZE = st.one_of(st.integers(1, 16), st.integers(1, 16), NONSENSE)
NUMBER = st.one_of(st.integers(-300, 300), st.floats(-1e3, 1e3), NONSENSE)
NAMEISH = st.one_of(st.from_regex(IDENTIFIER, fullmatch=True), st.text(max_size=5), NONSENSE)
SEGMENTISH = st.one_of(st.from_regex(SEGMENT, fullmatch=True).map(lambda s: s[:12]), st.text(max_size=6),
                       st.sampled_from(["aliases", "..", ".", "a..b", "X", "x\n", "a/b", ""]))


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``strategy`` most of the time, nonsense otherwise."""
    return st.one_of(strategy, strategy, strategy, NONSENSE)


DYNAMIC = st.dictionaries(
    st.one_of(st.integers(-1, 4), st.sampled_from(["0", "1", "01", "x", "-1"])),
    maybe(st.fixed_dictionaries({"min": SIZE, "max": SIZE}, optional={"opt": SIZE, "name": NAMEISH})),
    max_size=2,
)
INPUT = st.fixed_dictionaries(
    {"name": NAMEISH, "shape": maybe(st.lists(SIZE, max_size=4))},
    optional={"dtype": maybe(st.sampled_from(DTYPES)), "low": NUMBER, "high": NUMBER, "dynamic": DYNAMIC,
              "distribution": maybe(st.sampled_from(["uniform", "normal", "int_range"]))},
)
METHODS = st.dictionaries(
    st.one_of(st.sampled_from(["forward", "encode", "class", "é", "2x", "a.b"]), st.text(max_size=4)),
    maybe(st.fixed_dictionaries({"inputs": st.lists(INPUT, max_size=3)}, optional={"attribute": NAMEISH})),
    max_size=2,
)
VALIDATION = st.fixed_dictionaries({}, optional={
    "samples": SIZE, "seed": maybe(st.integers(0, 2**64)), "atol": NUMBER, "rtol": NUMBER, "min_cosine": NUMBER,
    "timeout_s": NUMBER, "latency_runs": SIZE, "memory_limit_mib": maybe(st.integers(0, 2**20)),
    "max_latency_ratio": NUMBER,
})
NONSENSE_SPEC = st.fixed_dictionaries(
    {"name": maybe(SEGMENTISH), "version": maybe(SEGMENTISH), "model": maybe(st.sampled_from(["m:f", "a.py:build"])),
     "methods": METHODS},
    optional={"target": maybe(st.sampled_from(["xnnpack", "portable", "tensorrt", "cuda"])), "validation": VALIDATION,
              "external_weights": maybe(st.booleans()), "export_timeout_s": NUMBER},
)
#: Specs a careful user writes (mostly accepted), so that acceptance and round trips are exercised too.
SENSIBLE_INPUT = st.fixed_dictionaries(
    {"name": st.from_regex(IDENTIFIER, fullmatch=True), "shape": st.lists(st.integers(2, 16), max_size=4)},
    optional={"dtype": st.sampled_from(DTYPES), "low": st.integers(-5, 0), "high": st.integers(1, 100),
              "dynamic": st.dictionaries(st.integers(0, 3), st.fixed_dictionaries(
                  {"min": st.integers(1, 2), "max": st.integers(16, MAX_DIM)}), max_size=2)},
)
SENSIBLE_SPEC = st.fixed_dictionaries(
    {"name": st.from_regex(SEGMENT, fullmatch=True), "version": st.sampled_from(["1", "1.0.0", "v2-rc.1"]),
     "model": st.just("a.py:build"),
     "methods": st.dictionaries(st.sampled_from(["forward", "encode", "_decode"]),
                                st.fixed_dictionaries({"inputs": st.lists(SENSIBLE_INPUT, min_size=1, max_size=2)}),
                                min_size=1, max_size=2)},
    optional={"target": st.sampled_from(["xnnpack", "portable"]),
              "validation": st.fixed_dictionaries({}, optional={"samples": st.integers(1, 1000),
                                                                "seed": st.integers(0, 2**63 - 1),
                                                                "atol": st.floats(0, 1)})},
)
SPEC = st.one_of(SENSIBLE_SPEC, NONSENSE_SPEC)


# -- invariants ------------------------------------------------------------------------------------------

def is_segment(value: object) -> bool:
    """A bundle-key path segment: lowercase name, no '..', no '/', no newline."""
    return isinstance(value, str) and SEGMENT.fullmatch(value) is not None and ".." not in value


def assert_sensible_input(spec: InputSpec, others: list[str]) -> None:
    """Invariants of an accepted input."""
    assert IDENTIFIER.fullmatch(spec.name) and not keyword.iskeyword(spec.name) and others.count(spec.name) == 1
    assert spec.dtype in DTYPES
    assert all(type(size) is int and 1 <= size <= MAX_DIM for size in spec.shape)
    for index, dim in spec.dynamic.items():
        assert type(index) is int and 0 <= index < len(spec.shape)
        assert all(type(b) is int for b in (dim.min, dim.max)) and 1 <= dim.min < dim.max <= MAX_DIM
        assert dim.name is None or (IDENTIFIER.fullmatch(dim.name) and not keyword.iskeyword(dim.name))
        assert 2 <= spec.shape[index] and dim.min <= spec.shape[index] <= dim.max
    bounds = [b for b in (spec.low, spec.high) if b is not None]
    assert all(type(b) is float and math.isfinite(b) for b in bounds)
    if spec.low is not None and spec.high is not None:
        assert spec.low < spec.high
    dtype = getattr(torch, spec.dtype)
    if spec.dtype == "bool":
        assert not bounds
    elif dtype.is_floating_point:
        assert all(abs(b) <= torch.finfo(dtype).max for b in bounds)
    else:
        info = torch.iinfo(dtype)
        assert all(b == int(b) for b in bounds)
        assert spec.low is None or info.min <= spec.low <= info.max
        assert spec.high is None or info.min < spec.high <= info.max + 1


def assert_sensible_spec(spec: BuildSpec) -> None:
    """Invariants of an accepted spec."""
    assert is_segment(spec.name) and is_segment(spec.version)
    for name, method in spec.methods.items():
        assert IDENTIFIER.fullmatch(name) and not keyword.iskeyword(name)
        assert method.inputs
        names = [i.name for i in method.inputs]
        symbols: dict[str, tuple[int, int, int]] = {}
        for spec_input in method.inputs:
            assert_sensible_input(spec_input, names)
            for index, dim in spec_input.dynamic.items():
                # A torch.export symbol has one range and one example size.
                seen = (dim.min, dim.max, spec_input.shape[index])
                assert symbols.setdefault(dim.name or f"{spec_input.name}_dim{index}", seen) == seen
    validation = spec.validation
    assert type(validation.samples) is int and 1 <= validation.samples <= 1000
    assert type(validation.seed) is int and validation.seed >= 0
    assert type(validation.latency_runs) is int and type(spec.external_weights) is bool
    floats = [validation.atol, validation.rtol, validation.min_cosine, validation.timeout_s,
              validation.max_latency_ratio, spec.export_timeout_s]
    assert all(math.isfinite(f) for f in floats if f is not None)


def assert_round_trips(spec: BuildSpec) -> None:
    """parse -> dump (JSON and YAML) -> parse gives the same spec and the same hash."""
    assert parse_spec(json.loads(spec.canonical_json())) == spec
    again = parse_spec(yaml.safe_load(yaml.safe_dump(spec.model_dump(mode="json"))))
    assert again == spec and again.sha256() == spec.sha256()


# -- the spec --------------------------------------------------------------------------------------------

@example({"name": "m", "version": "1", "model": "m:f", "methods": {"forward": {"inputs": [{"name": "", "shape": [2]}]}}})
@example({"name": "m", "version": "1", "model": "m:f", "validation": {"samples": True},
          "methods": {"forward": {"inputs": [{"name": "x", "shape": [2**63]}]}}})
@example({"name": "m", "version": "1", "model": "m:f",
          "methods": {"forward": {"inputs": [{"name": "x", "shape": [2], "low": 1e308}]}}})
@example({"name": "m", "version": "1", "model": "m:f",
          "methods": {"forward": {"inputs": [{"name": "x", "shape": [2], "dtype": "int8", "high": 1000}]}}})
@given(SPEC)
@counted
def check_spec_mapping(tally: Tally, data: dict[str, Any]) -> None:
    """The Python model (a mapping from a deployment's parameters or a script)."""
    spec = tally.parse(lambda: parse_spec(data), SpecError)
    if spec is not None:
        assert_sensible_spec(spec)
        assert_round_trips(spec)


def test_spec_mapping(record_parser: Record) -> None:
    tally = Tally()
    check_spec_mapping(tally)
    recorded(record_parser, "spec (mapping)", tally)


EDITS = st.lists(st.tuples(st.sampled_from(["insert", "delete", "replace"]), st.integers(0, len(DEMO_SPEC)),
                           st.sampled_from(list(":-[]{}\"'#&*!|>%@`,.0123456789eE \n\t") + ["true", ".nan", "1e308",
                                                                                          "2026-13-45", "é"])),
                 min_size=1, max_size=4)


def mutate(text: str, edits: list[tuple[str, int, str]]) -> str:
    """``text`` with each edit applied at its position (clamped to the text)."""
    for op, position, piece in edits:
        position = min(position, len(text))
        if op == "insert":
            text = text[:position] + piece + text[position:]
        elif op == "delete":
            text = text[:position] + text[position + len(piece):]
        else:
            text = text[:position] + piece + text[position + len(piece):]
    return text


def test_spec_text(record_parser: Record, tmp_path: Path) -> None:
    tally = Tally()
    path = tmp_path / "spec.yaml"

    @example([("replace", DEMO_SPEC.index("samples: 2") + 9, "true")])
    @example([("replace", DEMO_SPEC.index("version") + 9, "2026-13-45")])
    @example([("insert", DEMO_SPEC.index("image"), "[" * 2000)])
    @given(EDITS)
    @counted_in(tally)
    def check(edits: list[tuple[str, int, str]]) -> None:
        path.write_text(mutate(DEMO_SPEC, edits))
        spec = tally.parse(lambda: load_spec(path), SpecError)
        if spec is not None:
            assert_sensible_spec(spec)
            assert_round_trips(spec)

    check()
    recorded(record_parser, "spec (YAML/JSON text)", tally)


# -- manifests -------------------------------------------------------------------------------------------

def sample_manifest() -> Manifest:
    """A manifest as publish writes it (values are plausible; no export is needed to parse one)."""
    return Manifest(
        name="small-convnet", version="1.0.0", target="xnnpack", compat="cpu-xnnpack-x86_64",
        files=[FileEntry(path="model.pte", size=1234, sha256="a" * 64, role="program")],
        program="model.pte",
        methods={"forward": MethodEntry(
            inputs=[InputSpec(name="image", shape=[2, 3, 32, 32], dynamic={0: {"min": 1, "max": 8}})],  # type: ignore[dict-item]
            delegates=["XnnpackBackend"], kernel_calls=3)},
        toolchain={"torch": "2.13.0", "executorch": "1.4.1"}, platform={"os": "linux", "arch": "x86_64"},
        spec_sha256="b" * 64, validation=ValidationSummary(passed=True, cases=2, failed_cases=0,
                                                           shapes={"forward": ["min", "max"]}, worst_max_abs=1.5e-7),
        created_at=datetime(2026, 12, 3, tzinfo=UTC), builder="prefect-executorch on test@host",
    )


def paths(document: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside a JSON document."""
    found = [prefix] if prefix else []
    if isinstance(document, dict):
        for key, value in document.items():
            found += paths(value, prefix + (key,))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            found += paths(value, prefix + (index,))
    return found


def replaced(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A copy of ``document`` with the value at ``path`` replaced."""
    copy = json.loads(json.dumps(document))
    holder = copy
    for part in path[:-1]:
        holder = holder[part]
    holder[path[-1]] = value
    return copy


JSON_NONSENSE = NONSENSE.filter(lambda v: not (isinstance(v, float) and not math.isfinite(v)))


def assert_sensible_manifest(manifest: Manifest) -> None:
    """Invariants of an accepted manifest: its key is a key, its files are plain files with real digests."""
    assert all(is_segment(s) for s in (manifest.name, manifest.version, manifest.target, manifest.compat))
    assert manifest.version != "aliases"
    for entry in manifest.files:
        assert entry.size >= 0 and SHA256.fullmatch(entry.sha256)
        assert entry.path not in ("", ".", "..") and not set(entry.path) & {"/", "\\", "\x00"}
    for method in manifest.methods.values():
        names = [i.name for i in method.inputs]
        for spec_input in method.inputs:
            assert_sensible_input(spec_input, names)


def test_manifest_bytes(record_parser: Record) -> None:
    """Stored bytes, edited: refused unless byte for byte what was sealed."""
    tally = Tally()
    sealed = manifest_bytes(sample_manifest())

    @example([(sealed.index(b"e-07"), b"E")])  # the respelled exponent of issue 19
    @given(st.lists(st.tuples(st.integers(0, len(sealed) - 1), st.binary(min_size=1, max_size=2)), min_size=1,
                    max_size=3))
    @counted_in(tally)
    def check(edits: list[tuple[int, bytes]]) -> None:
        data = bytearray(sealed)
        for position, piece in edits:
            data[position:position + 1] = piece
        manifest = tally.parse(lambda: parse_manifest(bytes(data), "manifest.json"), IntegrityError)
        if manifest is not None:
            assert bytes(data) == sealed

    check()
    recorded(record_parser, "manifest (stored bytes)", tally)


def test_manifest_documents(record_parser: Record) -> None:
    """Documents with a nonsense value, sealed properly (as a careless or hostile publisher would)."""
    tally = Tally()
    document = sample_manifest().model_dump(mode="json")
    where = paths(document)

    @given(st.sampled_from(where), JSON_NONSENSE)
    @counted_in(tally)
    def check(path: tuple[Any, ...], value: Any) -> None:
        data = seal(replaced(document, path, value))
        manifest = tally.parse(lambda: parse_manifest(data, "manifest.json"), IntegrityError)
        if manifest is not None:
            assert_sensible_manifest(manifest)
            assert parse_manifest(manifest_bytes(manifest), "manifest.json") == manifest

    check()
    recorded(record_parser, "manifest (sealed documents)", tally)


# -- alias records ---------------------------------------------------------------------------------------

def sample_alias() -> AliasRecord:
    """An alias record as promote writes it."""
    return AliasRecord(name="small-convnet", alias="prod", version="1.0.0", target="xnnpack",
                       compat="cpu-xnnpack-x86_64", manifest_sha256="c" * 64,
                       moved_at=datetime(2026, 12, 3, 12, tzinfo=UTC), moved_by="ci@host",
                       validation_passed=True)


def test_alias_records(record_parser: Record) -> None:
    tally = Tally()
    document = sample_alias().model_dump(mode="json")

    @example(("alias",), "prod\n")
    @example(("manifest_sha256",), "not-a-digest")
    @given(st.sampled_from(paths(document)), JSON_NONSENSE)
    @counted_in(tally)
    def check(path: tuple[Any, ...], value: Any) -> None:
        data = json.dumps(replaced(document, path, value)).encode()
        record = tally.parse(lambda: parse_alias(data, "m/aliases/prod.json"), IntegrityError)
        if record is not None:
            assert all(is_segment(s) for s in (record.name, record.alias, record.version, record.target,
                                               record.compat))
            assert SHA256.fullmatch(record.manifest_sha256) and isinstance(record.moved_at, datetime)
            assert parse_alias(record.model_dump_json().encode(), "again") == record

    @given(st.binary(max_size=64))
    @counted_in(tally)
    def check_bytes(data: bytes) -> None:
        assert tally.parse(lambda: parse_alias(data, "m/aliases/prod.json"), IntegrityError) is None

    check()
    check_bytes()
    recorded(record_parser, "alias record", tally)


# -- bundle keys, manifest URLs, store URLs --------------------------------------------------------------

STORES = ["s3://bucket/prefix", "s3://bucket", "/srv/bundles", "file:///srv/bundles", "relative/dir"]


def test_bundle_keys_and_manifest_urls(record_parser: Record) -> None:
    tally = Tally()

    @example(["m", "aliases", "xnnpack", "cpu-xnnpack-x86_64"], "s3://bucket")
    @example(["m", "1", "xnnpack\n", "cpu-xnnpack-x86_64"], "/srv/bundles")
    @given(st.lists(SEGMENTISH, min_size=4, max_size=4), st.sampled_from(STORES))
    @counted_in(tally)
    def check_key(segments: list[str], store: str) -> None:
        key = tally.parse(lambda: BundleKey.of(*segments), SpecError)
        if key is not None:
            assert all(is_segment(s) for s in segments) and key.version != "aliases"
            assert parse_manifest_url(f"{store}/{key.prefix}/manifest.json") == (store, key)

    @example("s3:///m/1/xnnpack/cpu/manifest.json")
    @given(st.lists(st.one_of(SEGMENTISH, st.sampled_from(["s3:", "", "manifest.json", "file:"])), max_size=7)
           .map("/".join))
    @counted_in(tally)
    def check_url(url: str) -> None:
        parsed = tally.parse(lambda: parse_manifest_url(url), SpecError)
        if parsed is not None:
            store, key = parsed
            assert all(is_segment(s) for s in key.prefix.split("/")) and store not in ("s3://", "")
            assert parse_manifest_url(f"{store.rstrip('/')}/{key.prefix}/manifest.json")[1] == key

    check_key()
    check_url()
    recorded(record_parser, "bundle key / manifest URL", tally)


@settings(max_examples=30)  # an S3Store builds a boto3 client (~0.1 s)
@example("s3://Bucket/x")
@example("s3://ééé/x")
@example("s3://bucket/a/../b")
@example("~nosuchuser/bundles")
@given(st.one_of(
    st.tuples(st.sampled_from(["s3://", "file://", "", "http://", "S3://"]),
              st.one_of(st.from_regex(BUCKET, fullmatch=True), st.text(max_size=8)),
              st.sampled_from(["", "/", "/prefix", "/a/../b", "?x=1", "#f", "//x"])).map("".join),
    st.text(max_size=12),
))
@counted
def check_store_url(tally: Tally, url: str) -> None:
    store = tally.parse(lambda: open_store(url), SpecError)
    if isinstance(store, S3Store):
        assert BUCKET.fullmatch(store.bucket) and ".." not in store.bucket
        assert ".." not in store.prefix.split("/") and not store.prefix.startswith("/")
        assert open_store(store.url).url == store.url
    elif store is not None:
        assert isinstance(store, LocalStore) and store.root.is_absolute()
        assert open_store(store.url).url == store.url


def test_store_urls(record_parser: Record, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # relative directories resolve here; opening a store writes nothing
    tally = Tally()
    check_store_url(tally)
    assert list(tmp_path.iterdir()) == []
    recorded(record_parser, "store URL", tally)


# -- compat keys -----------------------------------------------------------------------------------------

@example("cpu-xnnpack-x86_64\n")
@example("cpu-" + "x" * 130 + "-x86_64")
@example("cu13٢-sm90-x86_64")
@example("cu132-sm90-trt11.1-x86_64")
@given(st.one_of(
    st.from_regex(r"cpu-[a-z0-9]{1,8}-[a-z0-9_]{1,8}", fullmatch=True),
    st.from_regex(r"cu\d{3}-sm\d{2,3}(plus)?(-trt(\d{1,2}(\.\d{1,2}){0,2}|-any))?-[a-z0-9_]{1,8}", fullmatch=True),
    st.text(max_size=20),
    st.from_regex(r"cu\d{3}-sm\d{2}-[a-z0-9_]{1,8}\s?"),
))
@counted
def check_compat(tally: Tally, key: str) -> None:
    compat = tally.parse(lambda: parse_compat(key), SpecError)
    if compat is not None:
        assert compat.key == key and is_segment(key)
        assert compat.arch and (compat.kind == "cpu") == (compat.cuda_channel is None)
        assert parse_compat(compat.key) == compat


def test_compat_keys(record_parser: Record) -> None:
    tally = Tally()
    check_compat(tally)
    recorded(record_parser, "compat key", tally)


# -- CLI arguments ---------------------------------------------------------------------------------------

CLI_VALUE = st.one_of(SEGMENTISH, st.text(max_size=6), st.sampled_from(["-", "--x", "1e308", "nan", "auto"]))


def cli_arguments() -> st.SearchStrategy[list[str]]:
    """Command lines of the store commands, with generated names (never a build)."""
    return st.one_of(
        st.tuples(st.just("ls"), CLI_VALUE).map(list),
        st.tuples(st.just("promote"), CLI_VALUE, CLI_VALUE, st.just("--alias"), CLI_VALUE).map(list),
        st.tuples(st.just("pull"), CLI_VALUE, st.just("--version"), CLI_VALUE, st.just("--compat"), CLI_VALUE)
        .map(list),
        st.tuples(st.just("gc"), CLI_VALUE, st.just("--grace-hours"), CLI_VALUE).map(list),
    )


@settings(max_examples=30)  # each is a whole CLI invocation (~0.2 s)
@example(["ls", "x\n"])
@example(["promote", "m", "1", "--alias", "../prod"])
@example(["gc", "m", "--grace-hours", "nan"])
@given(cli_arguments())
@counted
def check_cli(tally: Tally, store: Path, arguments: list[str]) -> None:
    tally.seen += 1
    result = CliRunner().invoke(app, [*arguments, "--store", str(store)] + (
        ["--to", str(store.parent / "pulled")] if arguments[0] == "pull" else []))
    # Typed errors and usage errors end in SystemExit with a code; anything else escaped as a traceback.
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code in (0, 1, 2) and "Traceback" not in result.output
    names = arguments[1:2] if arguments[0] == "gc" else [a for a in arguments[1:] if not a.startswith("--")]
    if result.exit_code == 2:
        tally.refused += 1
    else:
        # Accepted as far as the (empty) store: every name it used is a safe key segment, every number finite.
        assert all(is_segment(a) for a in names), (arguments, result.output)
        assert arguments[0] != "gc" or 0 <= float(arguments[3]) < math.inf, (arguments, result.output)
    assert arguments[0] in ("ls", "gc") or result.exit_code != 0  # nothing to pull or promote in an empty store
    assert not any(store.iterdir()) and not (store.parent / "pulled").exists()


def test_cli_arguments(record_parser: Record, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    tally = Tally()
    check_cli(tally, store)
    recorded(record_parser, "CLI arguments", tally)


def test_a_corrupt_alias_record_is_an_integrity_error(tmp_path: Path) -> None:
    # Before parse_alias, `ls` and `promote` ended in a pydantic traceback on such a record.
    path = tmp_path / "m" / "aliases" / "prod.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"name": "m", "alias": "prod"}')
    result = CliRunner().invoke(app, ["ls", "m", "--store", str(tmp_path)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    text = " ".join(result.output.split())  # however the console wrapped it
    assert "IntegrityError: m/aliases/prod.json is not a valid alias record (version: Field required)" in text
    assert "Traceback" not in result.output


def test_planted_violations_are_counted_not_hidden() -> None:
    tally = Tally()

    @example(3)
    @example(0)
    @given(st.integers(0, 3))
    @counted_in(tally)
    def check(n: int) -> None:
        tally.parse(lambda: 1 // (n - 1), SpecError)  # n == 1 raises an untyped error
        assert n < 3, "planted: accepted nonsense"

    check()
    assert tally.seen > 2 and tally.violations
    assert {v.split(":")[0] for v in tally.violations} <= {"invariant broken", "raised ZeroDivisionError"}
    assert any("planted: accepted nonsense" in v for v in tally.violations)
