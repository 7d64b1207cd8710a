"""The audio clips a speech model is validated on when its spec gives none: made the same way every time (numpy only,
so that the spec, the validation child and the tests' model maker share them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

#: The default clips by name.
DEFAULT_CLIPS = ("tone-440hz-1s", "chirp-200-2000hz-2s", "noise-1500ms")


def made_clip(name: str, rate: int) -> np.ndarray:
    """A default validation clip, the same samples every time: a 440 Hz tone, a 200-2000 Hz chirp, seeded noise."""
    import numpy as np

    if name == "tone-440hz-1s":
        return (0.3 * np.sin(2 * np.pi * 440 * np.arange(rate) / rate)).astype(np.float32)
    if name == "chirp-200-2000hz-2s":
        t = np.arange(2 * rate) / rate
        return (0.3 * np.sin(2 * np.pi * (200 * t + 450 * t**2))).astype(np.float32)
    return (0.05 * np.random.default_rng(0).standard_normal(int(1.5 * rate))).astype(np.float32)
