"""A spec's validation errors as one message in the spec's own words."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any, get_args

from pydantic import (
    BaseModel,
    ValidationError,
)


def _spec_fields(model: type[BaseModel], seen: set[type] | None = None) -> set[str]:
    """Every field name ``model`` can have, at any depth: what a misspelt field is matched against."""
    seen = seen if seen is not None else set()
    if model in seen:
        return set()
    seen.add(model)
    names = set(model.model_fields)
    for field in model.model_fields.values():
        for part in _types_within(field.annotation):
            names |= _spec_fields(part, seen)
    return names


def _types_within(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (through unions, lists, dicts and Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _types_within(arg)]


def _nearest(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or nothing."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.7)
    return f" (did you mean {close[0]!r}?)" if close else ""


def format_validation_error(exc: ValidationError, spec: type[BaseModel]) -> str:
    """``exc``'s errors, one line each, a misspelt field matched against every field of ``spec``."""
    lines = []
    for err in exc.errors():
        location = ".".join(str(part) for part in err["loc"]) or "spec"
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            message = f"unknown field{_nearest(str(err['loc'][-1]), _spec_fields(spec))}; remove it or check its spelling"
        elif err["type"] == "union_tag_invalid":
            # The spec's own words: `target: xnnpak` names no `kind`, though that is the field the union reads.
            tag, expected = str(err["ctx"]["tag"]), [t.strip(" '") for t in str(err["ctx"]["expected_tags"]).split(",")]
            what = "target" if err["loc"][-1:] == ("target",) else "kind"
            message = f"unknown {what} {tag!r}{_nearest(tag, expected)}; expected one of: {', '.join(expected)}"
        elif err["type"] != "value_error" and isinstance(err.get("input"), (bool, int, float, str)):
            # A strict refusal ("Input should be a valid integer") is only clear next to what was given.
            found = repr(err["input"])
            message = f"{message} (got {found if len(found) <= 80 else found[:77] + '...'})"
        lines.append(f"{location}: {message}")
    return "invalid build spec:\n  " + "\n  ".join(lines)


