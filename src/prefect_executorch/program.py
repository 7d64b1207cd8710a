"""Facts read from a serialized ``.pte`` without loading it: methods, delegates, inputs, outputs.

A ``.pte`` is a flatbuffer. ExecuTorch's wheel ships ``flatc`` and the schema, and ``flatc --json``
reads a program in milliseconds, where ``executorch.exir``'s own deserializer costs a 7-10 s import
in every (validating) child process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from prefect_executorch.errors import InvalidProgram, ToolchainMismatch
from prefect_executorch.scratch import scratch_dir

#: ExecuTorch ScalarType names -> spec dtype names.
_SCALAR_TYPES = {
    "FLOAT": "float32",
    "HALF": "float16",
    "BFLOAT16": "bfloat16",
    "LONG": "int64",
    "INT": "int32",
    "CHAR": "int8",
    "BYTE": "uint8",
    "BOOL": "bool",
    "DOUBLE": "float64",
}
#: The extended header after the flatbuffer's root offset and identifier: magic, length, program size.
_HEADER_MAGIC = b"eh00"
_HEAD_BYTES = 32
#: flatc writes non-finite doubles as bare words, which JSON does not allow.
_NON_FINITE = re.compile(r"(?<=[\s:\[,])(-?)(inf|nan)(?=[\s,\]}])")


class TensorFacts(BaseModel):
    """A method input as the program declares it (dynamic dims show their upper bound)."""

    dtype: str
    sizes: list[int]
    dynamic: bool = Field(description="Whether the program allows this tensor's shape to change.")


class MethodFacts(BaseModel):
    """What one method of a program runs on."""

    name: str
    delegates: list[str] = Field(description="Backend id of every delegate call, in execution order.")
    kernel_calls: int = Field(description="Operator calls left to ExecuTorch's own kernels.")
    operators: list[str] = Field(description="Names of the non-delegated operators.")
    inputs: list[TensorFacts | None] = Field(description="Declared inputs; None for non-tensor inputs.")
    output_spec: str | None = Field(
        None, description="The outputs' pytree structure as torch.export recorded it (treespec JSON)."
    )


def _executorch_dir() -> Path:
    found = importlib.util.find_spec("executorch")
    if found is None or not found.submodule_search_locations:
        raise ToolchainMismatch("reading a .pte needs ExecuTorch; install it with: pip install executorch==1.5.1")
    return Path(list(found.submodule_search_locations)[0])


def _flatc(root: Path) -> str:
    """The ``flatc`` that ExecuTorch ships (as its serializer finds it), else ``$FLATC_EXECUTABLE``/``PATH``."""
    bundled = root / "data" / "bin" / "flatc"
    if bundled.is_file() and os.access(bundled, os.X_OK):
        return str(bundled)
    # ExecuTorch's own variable (its serializer reads it too), not one of our settings.
    found = shutil.which(os.environ.get("FLATC_EXECUTABLE", "flatc"))
    if found is None:
        raise ToolchainMismatch(
            "reading a .pte needs flatc, which the executorch wheel ships in executorch/data/bin; "
            "reinstall executorch or set FLATC_EXECUTABLE"
        )
    return found


def _flatbuffer(path: Path) -> bytes:
    """The program's flatbuffer: the file without its segments (weights and delegate payloads)."""
    try:
        with open(path, "rb") as file:
            head = file.read(_HEAD_BYTES)
            if len(head) < 8 or head[4:6] != b"ET":
                raise InvalidProgram(f"{path} is not an ExecuTorch program (no 'ET' file identifier)")
            if head[8:12] == _HEADER_MAGIC:
                size = int.from_bytes(head[16:24], "little")
                data = head + file.read(max(size - len(head), 0))
                if len(data) < size:
                    raise InvalidProgram(f"{path} is truncated: its header says {size} bytes of program")
                return data[:size]
            return head + file.read()
    except OSError as exc:
        raise InvalidProgram(f"cannot read {path}: {exc.strerror}") from None


def program_json(path: str | Path) -> dict[str, Any]:
    """The program at ``path`` as JSON, decoded by ``flatc`` with ExecuTorch's schema."""
    path = Path(path)
    root = _executorch_dir()
    schema = root / "exir" / "_serialize" / "program.fbs"
    # An owned scratch folder (scratch.py), swept if this process is killed mid-read.
    with scratch_dir("pte") as tmp:
        binary = tmp / "program.bin"
        binary.write_bytes(_flatbuffer(path))
        done = subprocess.run(
            [_flatc(root), "--json", "--strict-json", "--defaults-json", "--raw-binary", "-o", str(tmp), str(schema), "--",
             str(binary)],
            capture_output=True, text=True, timeout=120,
        )
        out = tmp / "program.json"
        if done.returncode != 0 or not out.is_file():
            raise InvalidProgram(f"{path} is not a readable ExecuTorch program: {(done.stderr or done.stdout).strip()}")
        text = _NON_FINITE.sub(lambda m: m.group(1) + ("Infinity" if m.group(2) == "inf" else "NaN"), out.read_text())
    return json.loads(text)  # type: ignore[no-any-return]


def _tensor_facts(value: dict[str, Any]) -> TensorFacts | None:
    if value.get("val_type") != "Tensor":
        return None
    tensor = value["val"]
    name = tensor.get("scalar_type", "")
    return TensorFacts(
        dtype=_SCALAR_TYPES.get(name, name.lower()),
        sizes=list(tensor.get("sizes") or []),
        dynamic=tensor.get("shape_dynamism", "STATIC") != "STATIC",
    )


def read_program(path: str | Path) -> dict[str, MethodFacts]:
    """Per-method facts of the program at ``path``."""
    facts: dict[str, MethodFacts] = {}
    for plan in program_json(path).get("execution_plan") or []:
        table = plan.get("delegates") or []
        ops = plan.get("operators") or []
        delegates: list[str] = []
        operators: list[str] = []
        for chain in plan.get("chains") or []:
            for instruction in chain.get("instructions") or []:
                kind, call = instruction.get("instr_args_type"), instruction.get("instr_args") or {}
                if kind == "DelegateCall":
                    delegates.append(table[call.get("delegate_index", 0)]["id"])
                elif kind == "KernelCall":
                    op = ops[call.get("op_index", 0)]
                    operators.append(f"{op['name']}.{op['overload']}" if op.get("overload") else op["name"])
        values = plan.get("values") or []
        facts[plan["name"]] = MethodFacts(
            name=plan["name"],
            delegates=delegates,
            kernel_calls=len(operators),
            operators=operators,
            inputs=[_tensor_facts(values[index]) for index in plan.get("inputs") or []],
            output_spec=(plan.get("container_meta_type") or {}).get("encoded_out_str") or None,
        )
    return facts
