"""How much of each method's graph the delegates took, counted on the lowered edge program."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import BaseModel, Field


class DelegationFacts(BaseModel):
    """Tensor operators of one method: how many a delegate runs and which were left outside."""

    delegated_ops: int = Field(description="Tensor operators inside delegates.")
    total_ops: int = Field(description="Tensor operators of the method, delegated or not.")
    undelegated: dict[str, int] = Field(
        default_factory=dict, description="Operators left outside the delegates, with their counts."
    )

    @property
    def fraction(self) -> float | None:
        """Delegated share of the operators; None for a graph without operators."""
        return self.delegated_ops / self.total_ops if self.total_ops else None


def _is_tensor_op(node: Any) -> bool:
    """A call that computes tensors (not ``getitem``, nor arithmetic on symbolic sizes)."""
    import operator

    import torch

    if node.op != "call_function" or node.target is operator.getitem:
        return False
    value = node.meta.get("val")
    values = value if isinstance(value, (list, tuple)) else [value]
    return any(isinstance(v, torch.Tensor) for v in values)


def delegation_facts(edge: Any) -> dict[str, DelegationFacts]:
    """Per method of an ``EdgeProgramManager``: operators inside each delegate vs those left outside.

    Count before ``to_executorch``, which rewrites the graphs in place (out variants, allocations).
    """
    from executorch.exir.delegate import executorch_call_delegate

    facts = {}
    for method in edge.methods:
        graph_module = edge.exported_program(method).graph_module
        delegated, outside = 0, Counter[str]()
        for node in graph_module.graph.nodes:
            if node.op == "call_function" and node.target is executorch_call_delegate:
                lowered = getattr(graph_module, node.args[0].target)
                delegated += sum(map(_is_tensor_op, lowered.original_module.graph.nodes))
            elif _is_tensor_op(node):
                outside[str(getattr(node.target, "__name__", node.target))] += 1
        facts[method] = DelegationFacts(
            delegated_ops=delegated, total_ops=delegated + sum(outside.values()), undelegated=dict(outside)
        )
    return facts


def _program_operator(name: str) -> bool:
    """A tensor operator of the model (not ExecuTorch's own symint arithmetic, views or device copies)."""
    namespace, _, op = name.partition("::")
    return namespace == "aten" and not op.startswith("sym_")


def facts_from_program(programs: dict[str, Any], methods: dict[str, Any]) -> dict[str, DelegationFacts]:
    """Delegation of a program whose delegates hide their graphs (TensorRT engines): read from the .pte.

    ``programs`` are the exported methods before lowering (their tensor operators are the total);
    ``methods`` are ``program.read_program`` facts: the operators ExecuTorch's own kernels run are the
    ones left outside, and everything else went into a delegate.
    """
    facts = {}
    for name, program in programs.items():
        total = sum(map(_is_tensor_op, program.graph_module.graph.nodes))
        outside = Counter(op for op in methods[name].operators if _program_operator(op))
        left = min(sum(outside.values()), total)
        facts[name] = DelegationFacts(delegated_ops=total - left, total_ops=total, undelegated=dict(outside))
    return facts
