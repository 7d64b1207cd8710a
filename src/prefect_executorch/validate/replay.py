"""CUDA-graph replay shown, not assumed: a method called until its runtime says it captured it, and the
replayed outputs compared with the first direct call's, bit for bit.

ExecuTorch 1.4.1's CudaBackend runs a graph method directly for ``WARMUP_CALLS`` calls, captures it on
the next (and replays the capture once to produce that call's outputs), then replays on every call after.
It reports the capture in its log (stderr), which is read here from the file descriptor, as the runtime
writes it from C++.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

#: ``kCudaGraphWarmupSteps`` of the backend: direct calls before the capture.
WARMUP_CALLS = 3
#: What the backend logs once a method is captured and instantiated.
CAPTURED = "CUDA graph: captured and instantiated for '{method}'"


class ReplayCheck(BaseModel):
    """One method's replay as observed."""

    method: str
    captured: bool = Field(description="The runtime logged that it captured and instantiated the method.")
    identical: bool = Field(description="The replayed call's outputs equal the first direct call's, bit for bit.")
    calls: int = Field(description="Calls made on the same inputs: direct, warm-up, capture, replay.")

    @property
    def problem(self) -> str | None:
        """What failed, in words, or None."""
        if not self.captured:
            return (f"method {self.method!r}: target.cuda_graphs is on but the runtime did not report capturing it "
                    f"after {self.calls} calls (no {CAPTURED.format(method=self.method)!r} in its log)")
        if not self.identical:
            return f"method {self.method!r}: the replayed CUDA graph's outputs differ from the direct call's"
        return None


def stderr_of(call: Callable[[], Any]) -> tuple[Any, str]:
    """``call()``'s result and what was written to this process's stderr (fd 2, C++ included) meanwhile."""
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    saved = os.dup(2)
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(read_end, 65536), b"")), daemon=True)
    reader.start()
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        result = call()
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last writer gone: the reader sees its end
        os.close(saved)
        reader.join(timeout=10)
        os.close(read_end)
    text = b"".join(chunks).decode(errors="replace")
    sys.stderr.write(text)  # passed on: the child's stderr is what a failed task shows
    return result, text


def check_replay(method: str, call: Callable[[], list[Any]]) -> ReplayCheck:
    """Call ``method`` (``call``: its outputs as tensors, same inputs each time) through the capture and one replay."""
    import torch

    calls = WARMUP_CALLS + 2

    def run_all() -> list[list[Any]]:
        return [[t.clone() if isinstance(t, torch.Tensor) else t for t in call()] for _ in range(calls)]

    outputs, log = stderr_of(run_all)
    direct, replayed = outputs[0], outputs[-1]
    identical = len(direct) == len(replayed) and all(
        torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(direct, replayed, strict=True))
    return ReplayCheck(method=method, captured=CAPTURED.format(method=method) in log, identical=identical, calls=calls)
