"""Load the user's model from its import reference and optional state dict."""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import pickle
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from prefect_executorch.errors import SpecError

if TYPE_CHECKING:
    import torch

    from prefect_executorch.spec.buildspec import BuildSpec


class ModelRef(NamedTuple):
    """A reference ``package.module:function`` or ``path/to/file.py:function``, split at its last colon."""

    module: str
    function: str

    @classmethod
    def split(cls, reference: str) -> ModelRef:
        """The two sides of ``reference`` (either may be empty: ``check`` says whether it is well formed)."""
        module, _, function = reference.rpartition(":")
        return cls(module, function)

    @classmethod
    def check(cls, reference: str, noun: str = "function") -> ModelRef:
        """``reference`` split, or ValueError naming the two forms (``noun``: what the function is)."""
        ref = cls.split(reference)
        if not ref.module or not ref.function.isidentifier():  # no colon leaves the module side empty
            raise ValueError(f"{reference!r} must be 'package.module:{noun}' or 'path/to/file.py:{noun}'")
        return ref

    @property
    def is_file(self) -> bool:
        """Whether the module side is a path to a ``.py`` file."""
        return self.module.endswith(".py")


def module_source(module: str, field: str = "model") -> Path:
    """The source file of ``package.module``, found as import would find it but without running any of it.

    ``importlib.util.find_spec`` imports the parent packages (their ``__init__`` runs, torch with
    them); asking each finder on ``sys.meta_path`` for one level at a time runs nothing.
    """
    search: list[str] | None = None
    found = None
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        if depth > 1 and search is None:
            break  # the parent is a module, not a package
        found = next((spec for finder in sys.meta_path
                      if (spec := getattr(finder, "find_spec", lambda *_: None)(name, search)) is not None), None)
        if found is None:
            break
        search = list(found.submodule_search_locations) if found.submodule_search_locations is not None else None
    if found is None or found.name != module:
        raise SpecError(f"{field}: no module named {module!r}; check the name or install the package that provides it")
    if not found.origin or not Path(found.origin).is_file():
        raise SpecError(f"{field}: no source file for module {module!r}; install the package that provides it")
    return Path(found.origin)


def source_file(reference: str, field: str = "model") -> Path:
    """The file that defines the function of ``'path.py:function'`` or ``'package.module:function'``."""
    ref = ModelRef.split(reference)
    path = Path(ref.module) if ref.is_file else module_source(ref.module, field)
    if not path.is_file():
        raise SpecError(f"{field}: file {ref.module!r} does not exist (resolved relative to the spec file)")
    return path


#: CPython 3.11's parser is not safe to enter from two threads at once: concurrent builds of one flow run
#: (Prefect's thread task runner) parsing model files together failed with "SystemError: AST constructor
#: recursion depth mismatch" (CPython 3.11.7).
_PARSER = threading.Lock()


def model_dir_files(spec: BuildSpec) -> list[Path] | None:
    """The files of a model directory (an ``llm:`` or ``asr:`` spec's) that decide its build; None for a factory."""
    from prefect_executorch.spec.asr import speech_model_files
    from prefect_executorch.spec.llm import model_files

    if spec.llm is not None:
        return model_files(spec.model, spec.llm.tokenizer_path(spec.model))
    return speech_model_files(spec.model) if spec.asr is not None else None


def parse_python(text: str, filename: str) -> ast.Module:
    """``ast.parse``, one thread at a time."""
    with _PARSER:
        return ast.parse(text, filename=filename)


def check_factory(reference: str) -> None:
    """Check, without running user code, that the model factory of ``reference`` can be found."""
    ref = ModelRef.split(reference)
    path = source_file(reference)
    if not ref.is_file:
        return  # module_source found the module without running the package's code
    try:
        tree = parse_python(path.read_text(), str(path))
    except (SyntaxError, UnicodeDecodeError) as exc:
        where = f"{path}:{exc.lineno}" if isinstance(exc, SyntaxError) else str(path)
        reason = exc.msg if isinstance(exc, SyntaxError) else "it is not UTF-8 text"
        raise SpecError(f"model: {where} cannot be read as Python ({reason}); fix the file") from None
    names = {
        node.name
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    } | {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    if ref.function not in names:
        raise SpecError(f"model: {ref.module!r} defines no top-level {ref.function!r}; name a function that returns a torch.nn.Module")


def load_factory(reference: str, field: str = "model") -> Callable[[], Any]:
    """Import ``module:factory`` or ``path/file.py:factory`` (the spec's ``field``) and return the factory."""
    module_name, factory_name = ref = ModelRef.split(reference)
    try:
        if ref.is_file:
            unique = "_prefect_executorch_model_" + hashlib.sha256(module_name.encode()).hexdigest()[:12]
            spec = importlib.util.spec_from_file_location(unique, module_name)
            if spec is None or spec.loader is None:
                raise SpecError(f"{field}: cannot load {module_name!r} as a Python file")
            module = importlib.util.module_from_spec(spec)
            sys.modules[unique] = module
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except FileNotFoundError:
        raise SpecError(f"{field}: file {module_name!r} does not exist") from None
    except ModuleNotFoundError as exc:
        raise SpecError(f"{field}: cannot import {module_name!r}: {exc}") from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise SpecError(
            f"{field}: {module_name!r} has no callable {factory_name!r}; "
            + ("name a function that returns a torch.nn.Module" if field == "model" else "name a function")
        )
    return factory  # type: ignore[no-any-return]


def load_model(spec: BuildSpec) -> torch.nn.Module:
    """Build the model with its factory, load the weights, switch to eval mode."""
    import torch

    factory = load_factory(spec.model)
    try:
        model = factory()
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of user code is a bad model reference
        if "can't allocate memory" in str(exc):  # out of memory is the machine's limit, not a bad spec
            raise
        raise SpecError(f"model: factory {spec.model!r} raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, torch.nn.Module):
        raise SpecError(
            f"model: factory {spec.model!r} returned {type(model).__name__}, expected a torch.nn.Module"
        )
    if spec.weights is not None:
        try:
            state = torch.load(spec.weights, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise SpecError(
                f"weights: {spec.weights!r} cannot be loaded with weights_only=True (it needs pickle, which "
                f"is refused for safety): {first_line}; save it with torch.save(model.state_dict(), path)"
            ) from None
        except (OSError, RuntimeError, EOFError) as exc:
            raise SpecError(f"weights: cannot read {spec.weights!r}: {exc}") from None
        if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise SpecError(
                f"weights: {spec.weights!r} holds {type(state).__name__}, expected a state dict "
                "(a mapping of names to tensors) as saved by torch.save(model.state_dict(), path)"
            )
        try:
            model.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            raise SpecError(f"weights: {spec.weights!r} does not fit the model: {exc}") from None
    return model.eval()


def method_callable(model: torch.nn.Module, method: str, attribute: str | None) -> Callable[..., Any]:
    """The bound method that implements ``method`` (its ``attribute``, default its name)."""
    name = attribute or method
    function = getattr(model, name, None)
    if not callable(function):
        raise SpecError(f"methods.{method}: the model has no method {name!r}; set methods.{method}.attribute")
    return function  # type: ignore[no-any-return]


def method_module(model: torch.nn.Module, method: str, attribute: str | None) -> torch.nn.Module:
    """A module whose ``forward`` is ``method`` of ``model`` (``model`` itself for ``forward``)."""
    import torch

    function = method_callable(model, method, attribute)
    if (attribute or method) == "forward":
        return model

    class _Method(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: Any) -> Any:
            return function(*args)

    return _Method().eval()
