"""ExecuTorch's runtime backend options (``executorch::runtime::set_option``) set from Python.

A delegate reads some switches only from its backend options, set before a method loads (CudaBackend's
``enable_cuda_graph_for_method``), and ExecuTorch's Python runtime binds no setter for them. The runtime
wheel's extension exports the C++ function itself, so it is called here through ctypes with the
option array laid out as ``runtime/backend/options.h`` declares it (a 64-byte key, then a
``std::variant<bool, int, std::array<char, 256>>``).
"""

from __future__ import annotations

import ctypes
from typing import Any

from prefect_executorch.errors import ToolchainMismatch

#: ``executorch::runtime::set_option(const char*, Span<BackendOption>)``, as g++ mangles it.
SET_OPTION_SYMBOL = "_ZN10executorch7runtime10set_optionEPKcNS0_4SpanINS0_13BackendOptionEEE"
_KEY_BYTES = 64
_VALUE_BYTES = 256
#: ``runtime::Error`` codes (runtime/core/error.h) a set_option returns, by name.
_ERRORS = {0x01: "Internal", 0x12: "InvalidArgument", 0x20: "NotFound"}

OptionValue = bool | int | str


class _Value(ctypes.Union):
    _fields_ = [("flag", ctypes.c_bool), ("number", ctypes.c_int), ("text", ctypes.c_char * _VALUE_BYTES)]


class _Variant(ctypes.Structure):
    # libstdc++'s std::variant: the alternatives' storage, then a one-byte index (0 bool, 1 int, 2 the array).
    _fields_ = [("value", _Value), ("index", ctypes.c_ubyte)]


class BackendOption(ctypes.Structure):
    """``executorch::runtime::BackendOption``."""

    _fields_ = [("key", ctypes.c_char * _KEY_BYTES), ("value", _Variant)]


def backend_option(key: str, value: OptionValue) -> BackendOption:
    """One option as the runtime reads it; a string value is NUL-terminated in its 256 bytes."""
    encoded_key = key.encode()
    if len(encoded_key) >= _KEY_BYTES:
        raise ValueError(f"backend option key {key!r} is longer than {_KEY_BYTES - 1} bytes")
    option = BackendOption()
    option.key = encoded_key
    if isinstance(value, bool):
        option.value.value.flag, option.value.index = value, 0
    elif isinstance(value, int):
        option.value.value.number, option.value.index = value, 1
    else:
        text = value.encode()
        if len(text) >= _VALUE_BYTES:
            raise ValueError(f"backend option {key}: value {value!r} is longer than {_VALUE_BYTES - 1} bytes")
        option.value.value.text, option.value.index = text, 2
    return option


def set_backend_options(extension: Any, backend: str, options: dict[str, OptionValue]) -> None:
    """``set_option(backend, options)`` in the runtime ``extension`` (a loaded ``_portable_lib`` module).

    Raises ``ToolchainMismatch`` when that runtime does not export the function or refuses an option.
    """
    try:
        library = ctypes.CDLL(extension.__file__)
        set_option = getattr(library, SET_OPTION_SYMBOL)
    except (OSError, AttributeError):
        raise ToolchainMismatch(
            f"this ExecuTorch runtime ({getattr(extension, '__file__', extension)}) does not export "
            f"executorch::runtime::set_option, so {backend}'s options ({', '.join(options)}) cannot be set from "
            "Python; use the runtime wheel torch-tensorrt-executorch-runtime (docs/cuda.md) or set them in C++"
        ) from None
    array = (BackendOption * len(options))(*(backend_option(key, value) for key, value in options.items()))
    # Span<BackendOption> by value is {pointer, length}: two integer registers, as two arguments would be.
    set_option.argtypes = [ctypes.c_char_p, ctypes.POINTER(BackendOption), ctypes.c_size_t]
    set_option.restype = ctypes.c_uint32
    status = set_option(backend.encode(), array, len(options))
    if status != 0:
        raise ToolchainMismatch(
            f"ExecuTorch's runtime refused {backend} options {options} ({_ERRORS.get(status, hex(status))}): "
            f"{'no such backend is registered' if status == 0x20 else 'an option is unknown or of the wrong type'}"
        )
