"""Read a Python library's API from its source files, without importing it.

torch-tensorrt cannot be imported without TensorRT, and parts of ExecuTorch's CUDA backend need
triton, yet we must know which names and keywords they accept before a build starts: an option
``dynamo.compile`` does not know is dropped silently. ``Sources`` parses the installed package
(or a downloaded wheel) with ``ast``, follows re-exports, and answers what a dotted name is and
which keywords it takes. Only the standard library is used, so the probe runs on bare GPU hosts.
"""

from __future__ import annotations

import ast
import importlib.util
import zipfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from prefect_executorch.spec.modelref import parse_python

Kind = Literal["module", "function", "class", "method", "classmethod", "staticmethod", "property"]

#: How many re-export hops a name may take before we give up (guards against import cycles).
_MAX_HOPS = 12


class SourceRoot(Protocol):
    """Somewhere package files can be read from: a site-packages directory or a wheel."""

    def read(self, relpath: str) -> str | None:
        """The text of ``relpath`` (``pkg/mod.py``), or None if absent."""


@dataclass(frozen=True)
class DirectoryRoot:
    """Files under a directory, e.g. site-packages."""

    path: Path

    def read(self, relpath: str) -> str | None:
        file = self.path / relpath
        return file.read_text(encoding="utf-8") if file.is_file() else None


class WheelRoot:
    """Files inside a wheel (a zip), read without unpacking it."""

    def __init__(self, wheel: Path) -> None:
        self.wheel = wheel
        self._zip = zipfile.ZipFile(wheel)
        self._names = set(self._zip.namelist())

    def read(self, relpath: str) -> str | None:
        return self._zip.read(relpath).decode("utf-8") if relpath in self._names else None

    def dist_info(self, filename: str) -> str | None:
        """A file of the wheel's ``.dist-info`` directory (``METADATA``, ``RECORD``)."""
        for name in self._names:
            if name.endswith(f".dist-info/{filename}") and name.count("/") == 1:
                return self._zip.read(name).decode("utf-8")
        return None


def installed_root(package: str) -> DirectoryRoot | None:
    """The directory holding an installed top-level ``package`` (found without importing it)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return DirectoryRoot(Path(next(iter(spec.submodule_search_locations))).parent)


@dataclass(frozen=True)
class Definition:
    """What a dotted name is: a module, or a def/class node inside one."""

    name: str
    kind: Kind
    module: str
    node: ast.AST | None = None
    owner: ast.ClassDef | None = None


@dataclass
class Params:
    """What a callable accepts."""

    positional: list[str] = field(default_factory=list)
    keywords: set[str] = field(default_factory=set)
    var_positional: bool = False
    var_keyword: bool = False


class ApiNotFound(LookupError):
    """A dotted name does not exist in the sources."""


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Top-level statements, including those under if/try/with (conditional exports)."""
    for statement in body:
        yield statement
        if isinstance(statement, (ast.If, ast.Try, ast.With)):
            nested = [*statement.body, *getattr(statement, "orelse", []), *getattr(statement, "finalbody", [])]
            for handler in getattr(statement, "handlers", []):
                nested.extend(handler.body)
            yield from _statements(nested)


def _decorator_names(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> set[str]:
    names = set()
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Name):
            names.add(target.id)
        elif isinstance(target, ast.Attribute):
            names.add(target.attr)
    return names


def _kind_of(node: ast.AST, in_class: bool) -> Kind:
    if isinstance(node, ast.ClassDef):
        return "class"
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    if not in_class:
        return "function"
    decorators = _decorator_names(node)
    for kind in ("classmethod", "staticmethod", "property"):
        if kind in decorators:
            return kind  # type: ignore[return-value]
    return "method"


def _kwargs_read(function: ast.FunctionDef | ast.AsyncFunctionDef, var: str) -> set[str]:
    """Names a ``**var`` function reads by key: ``var.pop("x")``, ``var["x"]``, ``"x" in var``.

    A function that pops its keywords consumes them and rejects what is left (as
    ``torch_tensorrt.save`` does for ExecuTorch output), so then only the popped names count.
    """
    names: set[str] = set()
    popped: set[str] = set()

    def is_var(node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and node.id == var

    for node in ast.walk(function):
        key: ast.AST | None = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_var(node.func.value):
            if node.func.attr in ("pop", "get", "setdefault") and node.args:
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and is_var(node.value):
            key = node.slice
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            if any(is_var(c) for c in node.comparators):
                key = node.left
        if isinstance(key, ast.Constant) and isinstance(key.value, str) and key.value.isidentifier():
            names.add(key.value)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "pop":
                popped.add(key.value)
    if popped:
        return popped
    # ``all(k in kwargs for k in ["a", "b"])``: the keys are the iterated literal.
    for node in ast.walk(function):
        if isinstance(node, (ast.GeneratorExp, ast.ListComp)) and isinstance(node.elt, ast.Compare):
            compare = node.elt
            if any(is_var(c) for c in compare.comparators):
                for generator in node.generators:
                    if isinstance(generator.iter, (ast.List, ast.Tuple, ast.Set)):
                        names.update(
                            e.value for e in generator.iter.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
                        )
    return names


def _function_params(function: ast.FunctionDef | ast.AsyncFunctionDef, bound: bool) -> Params:
    args = function.args
    positional = [a.arg for a in [*args.posonlyargs, *args.args]]
    keywords = {a.arg for a in args.args} | {a.arg for a in args.kwonlyargs}
    if bound and positional:  # self / cls
        keywords.discard(positional.pop(0))
    if args.kwarg is not None:
        keywords |= _kwargs_read(function, args.kwarg.arg)
    return Params(positional=positional, keywords=keywords, var_positional=args.vararg is not None,
                  var_keyword=args.kwarg is not None)


class Sources:
    """The source files of some top-level packages, each from a directory or a wheel."""

    def __init__(self, roots: Mapping[str, SourceRoot]) -> None:
        self.roots = dict(roots)
        self._parsed: dict[str, ast.Module | None] = {}
        self._params: dict[int, Params] = {}

    @classmethod
    def installed(cls, *packages: str) -> Sources:
        """The installed copies of ``packages`` (those not installed are left out)."""
        roots = {name: root for name in packages if (root := installed_root(name)) is not None}
        return cls(roots)

    def _parse(self, relpath: str, root: SourceRoot) -> ast.Module | None:
        text = root.read(relpath)
        return parse_python(text, relpath) if text is not None else None

    def module(self, dotted: str) -> ast.Module | None:
        """The parsed module ``dotted``, or None if the sources have no such module."""
        if dotted not in self._parsed:
            root = self.roots.get(dotted.split(".")[0])
            tree = None
            if root is not None:
                base = dotted.replace(".", "/")
                tree = self._parse(f"{base}.py", root) or self._parse(f"{base}/__init__.py", root)
            self._parsed[dotted] = tree
        return self._parsed[dotted]

    def _is_package(self, dotted: str) -> bool:
        root = self.roots.get(dotted.split(".")[0])
        return root is not None and root.read(dotted.replace(".", "/") + "/__init__.py") is not None

    def _absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        package = module if self._is_package(module) else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        return f"{package}.{node.module}" if node.module else package

    def _lookup(self, module: str, name: str, hops: int = 0) -> Definition | None:
        """``name`` as seen at the top level of ``module``, following imports."""
        tree = self.module(module)
        if tree is None or hops > _MAX_HOPS:
            return None
        stars: list[str] = []
        for statement in _statements(tree.body):
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and statement.name == name:
                return Definition(name=f"{module}.{name}", kind=_kind_of(statement, False), module=module, node=statement)
            if isinstance(statement, ast.ImportFrom):
                source = self._absolute(module, statement)
                for alias in statement.names:
                    if alias.name == "*":
                        stars.append(source)
                    elif (alias.asname or alias.name) == name:
                        if self.module(f"{source}.{alias.name}") is not None:
                            return Definition(name=f"{source}.{alias.name}", kind="module", module=f"{source}.{alias.name}")
                        found = self._lookup(source, alias.name, hops + 1)
                        if found is not None:
                            return found
        for source in stars:
            exported = self._all(source)
            if exported is None or name in exported:
                found = self._lookup(source, name, hops + 1)
                if found is not None:
                    return found
        return None

    def _all(self, module: str) -> set[str] | None:
        tree = self.module(module)
        for statement in _statements(tree.body if tree else []):
            if isinstance(statement, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in statement.targets
            ) and isinstance(statement.value, (ast.List, ast.Tuple)):
                return {e.value for e in statement.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        return None

    def _member(self, owner: Definition, name: str, hops: int = 0) -> Definition | None:
        """Attribute ``name`` of class ``owner``, searching its base classes too."""
        node = owner.node
        if not isinstance(node, ast.ClassDef) or hops > _MAX_HOPS:
            return None
        for statement in node.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and statement.name == name:
                return Definition(name=f"{owner.name}.{name}", kind=_kind_of(statement, True), module=owner.module,
                                  node=statement, owner=node)
        for base in node.bases:
            if isinstance(base, ast.Name):
                parent = self._lookup(owner.module, base.id)
                if parent is not None and parent.kind == "class":
                    found = self._member(parent, name, hops + 1)
                    if found is not None:
                        return found
        return None

    def resolve(self, dotted: str) -> Definition:
        """What ``dotted`` (``pkg.mod.Class.method``) is; raises ``ApiNotFound``."""
        parts = dotted.split(".")
        if parts[0] not in self.roots:
            raise ApiNotFound(f"{dotted}: no sources for package {parts[0]!r}")
        for cut in range(len(parts), 0, -1):
            module = ".".join(parts[:cut])
            if self.module(module) is None:
                continue
            current = Definition(name=module, kind="module", module=module)
            for attr in parts[cut:]:
                found = (
                    self._lookup(current.module, attr) if current.kind == "module" else self._member(current, attr)
                )
                if found is None:
                    raise ApiNotFound(f"{dotted}: {current.name} has no {attr!r}")
                current = found
            return current
        raise ApiNotFound(f"{dotted}: no module of that name in the sources")

    def params(self, definition: Definition) -> Params:
        """What a function, method or class (its constructor) accepts."""
        key = id(definition.node)
        if key not in self._params:
            self._params[key] = self._read_params(definition)
        return self._params[key]

    def _read_params(self, definition: Definition) -> Params:
        node = definition.node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = _function_params(node, bound=definition.kind in ("method", "classmethod", "property"))
            if node.args.kwarg is not None:
                self._params[id(node)] = params  # a helper that forwards back here must not recurse
                params.keywords |= self._forwarded_keywords(definition, node, node.args.kwarg.arg)
            return params
        if isinstance(node, ast.ClassDef):
            init = self._member(definition, "__init__")
            if init is not None and isinstance(init.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return _function_params(init.node, bound=True)
            if "dataclass" in _decorator_names(node):
                fields = [
                    s.target.id for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
                    and "ClassVar" not in ast.unparse(s.annotation)
                ]
                return Params(positional=fields, keywords=set(fields))
            return Params()
        raise ApiNotFound(f"{definition.name} is a {definition.kind}, not something that can be called")

    def _forwarded_keywords(self, definition: Definition, function: ast.FunctionDef | ast.AsyncFunctionDef,
                            var: str) -> set[str]:
        """Keywords read by the module's functions that ``function`` hands its ``**var`` to (``helper(**var)``).

        A newer ``save`` may consume an option in a helper rather than in its own body; that option is
        accepted all the same.
        """
        names: set[str] = set()
        for node in ast.walk(function):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            forwards = any(k.arg is None and isinstance(k.value, ast.Name) and k.value.id == var for k in node.keywords)
            helper = self._lookup(definition.module, node.func.id) if forwards else None
            if helper is not None and helper.kind == "function":
                names |= self.params(helper).keywords
        return names

    def constant(self, dotted: str) -> Any:
        """The literal value assigned to a module-level name (``pkg._version.__version__``)."""
        module, _, name = dotted.rpartition(".")
        tree = self.module(module)
        for statement in _statements(tree.body if tree else []):
            if isinstance(statement, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in statement.targets):
                try:
                    return ast.literal_eval(statement.value)
                except ValueError:
                    return None
        raise ApiNotFound(f"{dotted}: no literal assignment in the sources")
