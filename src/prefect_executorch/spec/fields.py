"""Rules every part of the build spec shares: dtypes, sizes and names."""

from __future__ import annotations

import keyword
import re
from typing import Annotated, Literal

from pydantic import (
    Field,
)

from prefect_executorch.errors import SpecError
from prefect_executorch.spec.base import is_safe_name

Dtype = Literal["float32", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool"]
FLOAT_DTYPES = ("float32", "float16", "bfloat16")

#: Representable range of the integer dtypes, for checking low/high.
INT_RANGES: dict[str, tuple[int, int]] = {
    "int8": (-(2**7), 2**7 - 1),
    "uint8": (0, 2**8 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
}
#: Largest finite value of the float dtypes, for checking low/high.
FLOAT_MAX: dict[str, float] = {
    "float32": 3.4028234663852886e38,
    "float16": 65504.0,
    "bfloat16": 3.3895313892515355e38,
}
#: Bytes per element of each dtype, for the input-size budget.
DTYPE_SIZES: dict[str, int] = {
    "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int8": 1, "uint8": 1, "bool": 1,
}
#: Largest size of one dimension: torch.export and ExecuTorch hold sizes as 32-bit signed ints.
MAX_DIM = 2**31 - 1
#: A shape dimension or dynamic bound: [1, 2^31-1].
Dim = Annotated[int, Field(ge=1, le=MAX_DIM)]
#: Method, input and dynamic-dim names: ASCII identifiers. Methods become ExecuTorch method names and module
#: attributes, dim names (default ``<input>_dim<i>``) torch.export symbols, which must be identifiers; and
#: input names appear in reports (markdown tables) and error messages, where a plain word is safe.
_IDENTIFIER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_DECIMAL_RE = re.compile(r"^(0|[1-9][0-9]{0,9})$")


NAME_RULE = (
    "is not a valid name; use 1-128 lowercase letters, digits, '-', '_' or '.', "
    "starting with a letter or digit, with no '/' and no '..'"
)


def check_name(value: str, field: str) -> str:
    """Return ``value`` if it is a safe path segment, else raise ``SpecError`` naming ``field``."""
    if not is_safe_name(value):
        raise SpecError(f"{field}: {value!r} {NAME_RULE}")
    return value


def check_identifier(value: str, what: str) -> str:
    """Return ``value`` if it is an ASCII identifier and no Python keyword, else raise ``ValueError``."""
    if not _IDENTIFIER_RE.fullmatch(value) or keyword.iskeyword(value):
        raise ValueError(
            f"{value!r} is not a valid {what}; use an ASCII identifier (letters, digits, '_', not starting "
            "with a digit, at most 64 characters) that is not a Python keyword"
        )
    return value


