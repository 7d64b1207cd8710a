"""What spec models and target options share: the strict base model and the rule for names.

It lives apart from ``buildspec.py`` because ``buildspec.py`` builds its target union from the options
models (``options.py``), which need these too, as do the compat keys.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,127}$"
_NAME_RE = re.compile(NAME_PATTERN)


def is_safe_name(value: object) -> bool:
    """Whether ``value`` can be one path segment of a bundle key."""
    # fullmatch: "$" also matches before a final newline, which would let "name\n" through.
    return isinstance(value, str) and bool(_NAME_RE.fullmatch(value)) and ".." not in value


class StrictModel(BaseModel):
    """Base of every spec model: unknown fields are an error, no value is coerced, every float is finite."""

    # strict: `samples: true` is not 1 and `atol: "0.1"` is not 0.1; a spec says what it means or is refused.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
