"""Backend options set from Python through ExecuTorch's exported ``set_option``: the ctypes layout checked
against the C++ one, by a library built here from ExecuTorch's own headers with the same signature."""

from __future__ import annotations

import importlib.util
import subprocess
import types
from pathlib import Path

import pytest

from prefect_executorch.errors import ToolchainMismatch
from prefect_executorch.machine.backend_options import SET_OPTION_SYMBOL, set_backend_options

# What the runtime's set_option receives, printed; a key "refuse" gets InvalidArgument, backend "Nobody" NotFound.
STAND_IN = r"""
#include <executorch/runtime/backend/options.h>
#include <executorch/runtime/core/span.h>
#include <cstdio>
#include <cstring>
namespace executorch { namespace runtime {
Error set_option(const char* backend, const Span<BackendOption> options) {
  if (std::strcmp(backend, "Nobody") == 0) return Error::NotFound;
  for (const auto& option : options) {
    if (std::strcmp(option.key, "refuse") == 0) return Error::InvalidArgument;
    if (auto* text = std::get_if<std::array<char, kMaxOptionValueLength>>(&option.value)) {
      std::printf("%s %s str %s\n", backend, option.key, text->data());
    } else if (auto* flag = std::get_if<bool>(&option.value)) {
      std::printf("%s %s bool %d\n", backend, option.key, *flag);
    } else if (auto* number = std::get_if<int>(&option.value)) {
      std::printf("%s %s int %d\n", backend, option.key, *number);
    }
  }
  std::fflush(stdout);
  return Error::Ok;
}
}}
"""


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> types.SimpleNamespace:
    """A stand-in runtime extension: a library exporting set_option, built against the installed ExecuTorch's headers."""
    found = importlib.util.find_spec("executorch")
    assert found is not None and found.submodule_search_locations
    include = Path(next(iter(found.submodule_search_locations))) / "include"
    folder = tmp_path_factory.mktemp("stand-in")
    (folder / "set_option.cpp").write_text(STAND_IN)
    library = folder / "libstandin.so"
    subprocess.run(["g++", "-std=c++17", "-shared", "-fPIC", "-O2", f"-I{include}", "-o", str(library),
                    str(folder / "set_option.cpp")], check=True, capture_output=True, timeout=120)
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True)
    assert SET_OPTION_SYMBOL in symbols.stdout  # the name the runtime wheel exports (nm of its _portable_lib)
    return types.SimpleNamespace(__file__=str(library))


def test_each_kind_of_value_arrives_as_the_runtime_reads_it(runtime: types.SimpleNamespace,
                                                            capfd: pytest.CaptureFixture[str]) -> None:
    set_backend_options(runtime, "CudaBackend", {"enable_cuda_graph_for_method": "forward,decode",
                                                 "weight_sharing_across_methods": True, "num_threads": 7})
    assert capfd.readouterr().out.splitlines() == [
        "CudaBackend enable_cuda_graph_for_method str forward,decode",
        "CudaBackend weight_sharing_across_methods bool 1",
        "CudaBackend num_threads int 7",
    ]


@pytest.mark.parametrize("backend, options, words", [
    ("CudaBackend", {"refuse": True}, "refused CudaBackend options {'refuse': True} (InvalidArgument): an option is "
                                      "unknown or of the wrong type"),
    ("Nobody", {"x": 1}, "refused Nobody options {'x': 1} (NotFound): no such backend is registered"),
])
def test_a_refusal_is_one_line_naming_backend_and_options(runtime: types.SimpleNamespace, backend: str,
                                                         options: dict[str, bool | int], words: str) -> None:
    with pytest.raises(ToolchainMismatch) as info:
        set_backend_options(runtime, backend, dict(options))
    assert words in str(info.value)


def test_a_runtime_without_the_function_is_named_with_what_to_use(tmp_path: Path) -> None:
    import ctypes.util

    libc = types.SimpleNamespace(__file__=ctypes.util.find_library("c") or "libc.so.6")
    with pytest.raises(ToolchainMismatch, match="does not export executorch::runtime::set_option, so CudaBackend's "
                                                "options \\(enable_cuda_graph_for_method\\) cannot be set from Python"):
        set_backend_options(libc, "CudaBackend", {"enable_cuda_graph_for_method": "forward"})


def test_values_too_long_for_the_runtime_are_refused_before_the_call(runtime: types.SimpleNamespace) -> None:
    with pytest.raises(ValueError, match="longer than 255 bytes"):
        set_backend_options(runtime, "CudaBackend", {"enable_cuda_graph_for_method": "m" * 256})
    with pytest.raises(ValueError, match="longer than 63 bytes"):
        set_backend_options(runtime, "CudaBackend", {"k" * 64: True})
