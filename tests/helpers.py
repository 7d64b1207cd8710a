"""Helpers shared by test modules (import as `helpers`; pytest puts tests/ on sys.path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TESTS = Path(__file__).parent
MODELS = TESTS / "models.py"


def spec_data(factory: str = "convnet", **overrides: Any) -> dict[str, Any]:
    """A spec mapping for a model in tests/models.py; fields may be overridden."""
    data: dict[str, Any] = {
        "name": factory.replace("_", "-"),
        "version": "1",
        "model": f"{MODELS}:{factory}",
        "methods": {"forward": {"inputs": [{"name": "x", "shape": [2, 3, 8, 8]}]}},
        "target": "xnnpack",
        "validation": {"samples": 1},
    }
    data.update(overrides)
    return data
