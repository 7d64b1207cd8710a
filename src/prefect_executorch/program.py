"""Facts read from a serialized ``.pte`` without loading it: methods, delegates, inputs."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

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


def read_program(path: str | Path) -> dict[str, MethodFacts]:
    """Per-method facts of the program at ``path``."""
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import DelegateCall, KernelCall, Tensor, TensorShapeDynamism

    parsed = deserialize_pte_binary(Path(path).read_bytes())
    program = getattr(parsed, "program", parsed)
    facts: dict[str, MethodFacts] = {}
    for plan in program.execution_plan:
        delegates: list[str] = []
        kernel_calls = 0
        operators: list[str] = []
        for chain in plan.chains:
            for instruction in chain.instructions:
                call = instruction.instr_args
                if isinstance(call, DelegateCall):
                    delegates.append(plan.delegates[call.delegate_index].id)
                elif isinstance(call, KernelCall):
                    kernel_calls += 1
                    op = plan.operators[call.op_index]
                    operators.append(f"{op.name}.{op.overload}" if op.overload else op.name)
        inputs: list[TensorFacts | None] = []
        for index in plan.inputs:
            value = plan.values[index].val
            if isinstance(value, Tensor):
                name = getattr(value.scalar_type, "name", str(value.scalar_type))
                inputs.append(
                    TensorFacts(
                        dtype=_SCALAR_TYPES.get(name, name.lower()),
                        sizes=list(value.sizes),
                        dynamic=value.shape_dynamism != TensorShapeDynamism.STATIC,
                    )
                )
            else:
                inputs.append(None)
        facts[plan.name] = MethodFacts(
            name=plan.name, delegates=delegates, kernel_calls=kernel_calls, operators=operators, inputs=inputs
        )
    return facts
