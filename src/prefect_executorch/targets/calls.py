"""Library calls described as data: built without the library, checked against its source, made where it runs.

A target that drives a library we cannot import here (torch-tensorrt needs TensorRT) describes
each call as a ``Call`` tree. The tree is what unit tests assert, what ``check_calls`` compares
with the library's real source (so an upstream rename fails before any work), and what
``run_steps`` finally turns into real calls on the machine that has the library.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from prefect_executorch.machine.apisource import ApiNotFound, Definition, Kind, Params, Sources


@dataclass(frozen=True)
class Ref:
    """An importable attribute used as a value, e.g. ``torch.float16``."""

    path: str


@dataclass(frozen=True)
class Slot:
    """A value only known while the calls run (an exported program, example tensors, a path)."""

    name: str


@dataclass(frozen=True)
class Call:
    """``callee(*args, **kwargs)``; a ``method`` callee takes its receiver as the first argument."""

    callee: str
    kind: Kind
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    """One call whose result, if ``result`` is set, becomes the slot of that name."""

    call: Call
    result: str | None = None


def walk(value: Any) -> Iterator[Call]:
    """Every ``Call`` in ``value``, outermost first."""
    if isinstance(value, Call):
        yield value
        for item in (*value.args, *value.kwargs.values()):
            yield from walk(item)
    elif isinstance(value, Step):
        yield from walk(value.call)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from walk(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from walk(item)


def import_object(path: str) -> Any:
    """The object at a dotted path: the longest importable module, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # Only "this prefix is not a module" means try a shorter one; a missing dependency
            # inside a real module must surface.
            if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
                continue
            raise
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(f"no module in {path!r} can be imported", name=parts[0])


def materialize(value: Any, slots: Mapping[str, Any]) -> Any:
    """Turn a described value into a real one, making every call in it."""
    if isinstance(value, Slot):
        return slots[value.name]
    if isinstance(value, Ref):
        return import_object(value.path)
    if isinstance(value, Call):
        function = import_object(value.callee)
        args = [materialize(a, slots) for a in value.args]
        kwargs = {k: materialize(v, slots) for k, v in value.kwargs.items()}
        return function(*args, **kwargs)
    if isinstance(value, Mapping):
        return {k: materialize(v, slots) for k, v in value.items()}
    if isinstance(value, list):
        return [materialize(v, slots) for v in value]
    if isinstance(value, tuple):
        return tuple(materialize(v, slots) for v in value)
    return value


def run_steps(steps: list[Step], slots: dict[str, Any]) -> dict[str, Any]:
    """Make each step's call in order, storing results into ``slots``; returns ``slots``."""
    for step in steps:
        result = materialize(step.call, slots)
        if step.result is not None:
            slots[step.result] = result
    return slots


class Api(Protocol):
    """What ``check_call`` asks of a library: what a dotted name is, and what it accepts."""

    def resolve(self, dotted: str) -> Definition: ...

    def params(self, definition: Definition) -> Params: ...


class LiveSources:
    """The installed library as Python sees it (``inspect.signature``), for a worker where it imports.

    A ``**kwargs`` parameter says nothing about which keywords are used, so for those the keywords
    its source reads (``source``, an ``apisource.Sources``) are added.
    """

    def __init__(self, source: Sources) -> None:
        self.source = source
        self._objects: dict[str, Any] = {}

    def resolve(self, dotted: str) -> Definition:
        try:
            obj = import_object(dotted)
        except (ImportError, AttributeError) as exc:
            raise ApiNotFound(f"{dotted}: cannot be imported here ({type(exc).__name__}: {exc})") from None
        self._objects[dotted] = obj
        return Definition(name=dotted, kind=self._kind(dotted, obj), module=getattr(obj, "__module__", "") or "")

    @staticmethod
    def _kind(dotted: str, obj: Any) -> Kind:
        if inspect.ismodule(obj):
            return "module"
        if inspect.isclass(obj):
            return "class"
        owner_path, _, attr = dotted.rpartition(".")
        owner = import_object(owner_path) if owner_path else None
        if not inspect.isclass(owner):
            return "function"
        static = inspect.getattr_static(owner, attr)
        for kind, wrapper in (("classmethod", classmethod), ("staticmethod", staticmethod), ("property", property)):
            if isinstance(static, wrapper):
                return kind  # type: ignore[return-value]
        return "method"

    def params(self, definition: Definition) -> Params:
        signature = inspect.signature(self._objects[definition.name])
        parameters = list(signature.parameters.values())
        if definition.kind == "method" and parameters:
            parameters = parameters[1:]  # self: a signature read through the class still has it
        positional_kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        params = Params(
            positional=[p.name for p in parameters if p.kind in positional_kinds],
            keywords={p.name for p in parameters
                      if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)},
            var_positional=any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in parameters),
            var_keyword=any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters),
        )
        if params.var_keyword:
            try:
                params.keywords |= self.source.params(self.source.resolve(definition.name)).keywords
            except ApiNotFound:
                pass  # no source to read: only the named parameters are known to be used
        return params


def check_call(call: Call, sources: Api) -> list[str]:
    """What in ``call`` (not its nested calls) the library's source does not accept."""
    try:
        definition = sources.resolve(call.callee)
    except ApiNotFound as exc:
        return [str(exc)]
    if definition.kind != call.kind:
        return [f"{call.callee} is a {definition.kind} in the installed source, expected a {call.kind}"]
    params = sources.params(definition)
    problems = []
    positional = len(call.args) - (1 if call.kind == "method" else 0)
    if positional > len(params.positional) and not params.var_positional:
        problems.append(f"{call.callee} takes {len(params.positional)} positional arguments, we pass {positional}")
    problems.extend(
        f"{call.callee} does not accept the keyword {name!r}" for name in call.kwargs if name not in params.keywords
    )
    return problems


def check_calls(values: Any, sources: Api) -> list[str]:
    """Every problem of every call in ``values`` against ``sources`` (empty when all fit)."""
    problems: list[str] = []
    for call in walk(values):
        problems.extend(p for p in check_call(call, sources) if p not in problems)
    return problems
