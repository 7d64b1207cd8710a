"""How much of each method's graph the delegates took: ExecuTorch's ``get_delegation_info`` on the lowered edge program."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import BaseModel, Field


class DelegationFacts(BaseModel):
    """Tensor operators of one method: how many a delegate runs and which were left outside."""

    delegated_ops: int = Field(description="Tensor operators inside delegates.")
    total_ops: int = Field(description="Tensor operators of the method, delegated or not.")
    undelegated: dict[str, int] = Field(
        default_factory=dict,
        description="Operators left outside the delegates, with their counts: by ExecuTorch's operator type "
        "(aten_topk_default) when counted at export, by the .pte's operator name (aten::cumsum.out) for TensorRT.",
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


def _is_operator(op_type: str) -> bool:
    """An edge-dialect operator type (``aten_topk_default``), not ``getitem`` (it picks one output of
    another node), a Python operator on sizes (``add``, ``floordiv``) or a size read (``sym_size_int``)."""
    return "_" in op_type and "sym_" not in op_type


def _edge_facts(graph_module: Any) -> DelegationFacts:
    """ExecuTorch's per-operator breakdown of one lowered edge graph (``get_delegation_info``), operators only.

    Edge-dialect node names carry their namespace (``aten_add_tensor``), which tells an operator from
    the size arithmetic ``_is_operator`` leaves out; ATen-dialect names (``add``) would not.
    """
    from executorch.devtools.backend_debug import get_delegation_info

    breakdown = [b for b in get_delegation_info(graph_module).delegation_by_operator.values() if _is_operator(b.op_type)]
    delegated = sum(b.delegated for b in breakdown)
    outside = {b.op_type: b.non_delegated for b in breakdown if b.non_delegated}
    return DelegationFacts(delegated_ops=delegated, total_ops=delegated + sum(outside.values()), undelegated=outside)


def delegation_facts(edge: Any) -> dict[str, DelegationFacts]:
    """Per method of an ``EdgeProgramManager``: operators inside each delegate vs those left outside.

    Count before ``to_executorch``, which rewrites the graphs in place (out variants, allocations).
    """
    return {method: _edge_facts(edge.exported_program(method).graph_module) for method in edge.methods}


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
