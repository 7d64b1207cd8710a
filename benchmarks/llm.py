"""Decoder LM: prefill and decode speed of the ExecuTorch program through ExecuTorch's LLM runner, float32 and
int8da4w (XNNPACK), against eager ``generate`` with a static cache in float32, and the programs' sizes.

A Llama made from a transformers config with random weights (``--smoke``: 2 layers of 64, else 8 layers of
512 with 4 heads, 2 of them for keys and values: about 19 M parameters) and a byte-level BPE tokenizer trained here, exported by the product (float32 and
int8da4w linears). Each side generates greedily from the same prompt, 1 token and then ``--new-tokens`` tokens, in interleaved
rounds (the load of a shared machine hits every side alike): the first token's time is the prefill's, decode
tokens/s the tokens after the first over the difference (the runner stops early at an end-of-sequence token;
its count is taken as generated).
Each figure is the median over ``--rounds`` rounds, with min and max.

The last line is ``RESULT llm ratio=<worst of (size ratio / 0.3) and (2 / decode speed-up)> goal=<=1``: the
int8da4w program at most 0.3x the float32 program's size, and decoding at least 2x as fast as eager float32.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _common import interleaved, report, scratch, spread  # noqa: E402

from prefect_executorch.export.exporter import export_program  # noqa: E402
from prefect_executorch.spec.buildspec import parse_spec  # noqa: E402
from prefect_executorch.testing.tiny_llm import write_tiny_llm  # noqa: E402

PROMPT = "the quick brown fox jumps over the lazy dog. prefect runs flows of tasks on workers"
#: int8da4w program size over float32's, at most; its decode speed over eager float32's, at least.
SIZE_GOAL, DECODE_GOAL = 0.3, 2.0


def eager_side(model_dir: Path) -> Any:
    """Greedy ``generate`` of the model in float32 with a static cache: (seconds, tokens) for ``tokens`` new tokens."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()
    ids = torch.tensor([Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(PROMPT).ids])

    def timed(tokens: int) -> tuple[float, int]:
        started = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                           cache_implementation="static", disable_compile=True, pad_token_id=1)
        return time.perf_counter() - started, tokens

    return timed


def runner_side(bundle: Path) -> Any:
    """Greedy generation through ExecuTorch's ``TextLLMRunner``: (seconds, tokens generated) for ``tokens`` new tokens
    (fewer if it generates the end-of-sequence token: the runner stops there)."""
    from executorch.extension.llm.runner import GenerationConfig

    from prefect_executorch.validate.generation import load_runner

    runner = load_runner(bundle / "model.pte", bundle / "tokenizer.json")

    def timed(tokens: int) -> tuple[float, int]:
        pieces: list[str] = []
        runner.reset()
        started = time.perf_counter()
        runner.generate(PROMPT, GenerationConfig(echo=False, max_new_tokens=tokens, temperature=0.0),
                        token_callback=pieces.append)
        return time.perf_counter() - started, len(pieces)

    return timed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="2 layers of 64: the small size CI runs.")
    parser.add_argument("--rounds", type=int, default=5, help="Interleaved timing rounds (at least 3).")
    parser.add_argument("--new-tokens", type=int, default=64, help="Tokens each decode generates.")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds must be at least 3 (medians of 3 or more runs are compared)")
    # The runner logs to the process's stdout from C++, flushed whenever: to stderr with it, so that the RESULT
    # line stays the last of stdout.
    sys.stdout.flush()
    sys.stdout = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    work = scratch("bench-llm-")
    size = {"hidden_size": 64, "layers": 2} if args.smoke else {"hidden_size": 512, "layers": 8}
    model_dir = write_tiny_llm(work / "model", "llama", **size)
    seq_len = args.new_tokens + 64
    bundles: dict[str, Path] = {}
    build_s: dict[str, float] = {}
    for name, quantization in (("float32", None), ("int8da4w", {"scheme": "int8da4w"})):
        spec = parse_spec({"name": "bench-llm", "version": name, "model": str(model_dir),
                           "llm": {"max_seq_len": seq_len, "new_tokens": 8},
                           **({"quantization": quantization} if quantization else {})})
        started = time.perf_counter()
        bundles[name] = export_program(spec, work / "out").path
        build_s[name] = round(time.perf_counter() - started, 1)
    sides = {"eager_float32": eager_side(model_dir),
             **{f"program_{name}": runner_side(path) for name, path in bundles.items()}}
    for timed in sides.values():
        timed(2)  # the first call loads and initialises: not timed
    rounds = interleaved({name: lambda _, timed=timed: (timed(1), timed(args.new_tokens)) for name, timed in sides.items()},
                         args.rounds)
    figures: dict[str, Any] = {"model": size, "new_tokens": args.new_tokens, "build_s": build_s}
    decode: dict[str, float] = {}
    for name, times in rounds.items():
        first = [one for (one, _), _ in times]
        rates = [(count - 1) / (whole - one) for (one, _), (whole, count) in times if whole > one and count > 1]
        decode[name] = statistics.median(rates) if rates else float("nan")
        figures[name] = {"first_token": spread(first, digits=4), "decode_tokens_per_s": spread(rates, digits=1, unit="tps")}
    sizes = {name: (path / "model.pte").stat().st_size for name, path in bundles.items()}
    size_ratio = sizes["int8da4w"] / sizes["float32"]
    speedup = decode["program_int8da4w"] / decode["eager_float32"]
    figures.update(program_bytes=sizes, size_int8da4w_vs_float32=round(size_ratio, 4),
                   decode_int8da4w_vs_eager_float32=round(speedup, 3),
                   decode_float32_program_vs_eager_float32=round(decode["program_float32"] / decode["eager_float32"], 3),
                   goals={"size": f"int8da4w <= {SIZE_GOAL}x float32", "decode": f"int8da4w >= {DECODE_GOAL}x eager float32"})
    ratio = max(size_ratio / SIZE_GOAL, DECODE_GOAL / speedup)
    return 0 if report("llm", ratio, "<=1", figures) else 1


if __name__ == "__main__":
    sys.exit(main())
