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

``--target cuda`` (a GPU worker with the CUDA stack) builds the bf16 program for ExecuTorch's CUDA backend and times
it, one token per call through the runtime that has CudaBackend (which ships no LLM runner), beside eager bf16
``generate`` on the same GPU twice: as transformers runs it by default (a static cache on CUDA is compiled with
``torch.compile`` on the first calls) and with ``disable_compile=True``; the faster decode is the baseline.
``--cuda-graphs`` builds with ``target.cuda_graphs`` (the program's ``forward`` replayed as a CUDA graph). Its last
line is ``RESULT llm_cuda ratio=<baseline decode / program decode> goal=<=1``.

Torch's thread count is set (``--threads``, default every core) and recorded with the results.
"""

from __future__ import annotations

import argparse
import math
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


def eager_side(model_dir: Path, device: str = "cpu", dtype: str = "float32", compiled: bool = False) -> Any:
    """Greedy ``generate`` of the model in ``dtype`` on ``device`` with a static cache (``compiled``: transformers'
    default, which compiles it on CUDA; else ``disable_compile``): (seconds, tokens) for ``tokens`` new tokens."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=getattr(torch, dtype))
    model = model.to(device).eval()
    ids = torch.tensor([Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(PROMPT).ids], device=device)

    def timed(tokens: int) -> tuple[float, int]:
        started = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                           cache_implementation="static", disable_compile=not compiled, pad_token_id=1)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started, tokens

    return timed


def program_side(bundle: Path, target: str, hints: dict[str, Any]) -> Any:
    """Greedy generation by what runs the program on ``target`` (ExecuTorch's ``TextLLMRunner`` on CPU; on CUDA,
    whose runtime wheel has no LLM runner, the program one token per call): (seconds, tokens generated) for
    ``tokens`` new tokens (fewer at an end-of-sequence token: generation stops there)."""
    from prefect_executorch.validate.generation import open_generator

    generator = open_generator(bundle / "model.pte", bundle / "tokenizer.json", target,
                               next(iter(sorted(bundle.glob("*.ptd"))), None), hints)

    def timed(tokens: int) -> tuple[float, int]:
        started = time.perf_counter()
        pieces, _ = generator.greedy(PROMPT, tokens)
        return time.perf_counter() - started, len(pieces)

    return timed


#: What each ``--target`` builds (name -> spec fields) and times beside eager (device, dtype).
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "xnnpack": {"float32": {}, "int8da4w": {"quantization": {"scheme": "int8da4w"}}},
    "cuda": {"bf16": {"target": {"kind": "cuda", "precision": "bf16"}}},
}
EAGER = {"xnnpack": ("cpu", "float32"), "cuda": ("cuda", "bfloat16")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="2 layers of 64: the small size CI runs.")
    parser.add_argument("--rounds", type=int, default=5, help="Interleaved timing rounds (at least 3).")
    parser.add_argument("--new-tokens", type=int, default=64, help="Tokens each decode generates.")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch's intra-op threads (recorded).")
    parser.add_argument("--cuda-graphs", action="store_true", help="--target cuda: build with target.cuda_graphs.")
    parser.add_argument("--target", choices=sorted(VARIANTS), default="xnnpack",
                        help="xnnpack: float32 and int8da4w programs beside eager float32 on the CPU; cuda: the bf16 "
                        "program beside eager bf16 on the GPU.")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error("--rounds must be at least 3 (medians of 3 or more runs are compared)")
    # The runner logs to the process's stdout from C++, flushed whenever: to stderr with it, so that the RESULT
    # line stays the last of stdout.
    sys.stdout.flush()
    sys.stdout = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    import torch

    from prefect_executorch.targets import get_target

    torch.set_num_threads(args.threads)
    work = scratch("bench-llm-")
    size = {"hidden_size": 64, "layers": 2} if args.smoke else {"hidden_size": 512, "layers": 8}
    model_dir = write_tiny_llm(work / "model", "llama", **size)
    seq_len = args.new_tokens + 64
    bundles: dict[str, Path] = {}
    build_s: dict[str, float] = {}
    hints: dict[str, dict[str, Any]] = {}
    for name, fields in VARIANTS[args.target].items():
        if args.cuda_graphs:
            fields = {**fields, "target": {**fields["target"], "cuda_graphs": True}}
        spec = parse_spec({"name": "bench-llm", "version": name, "model": str(model_dir),
                           "llm": {"max_seq_len": seq_len, "new_tokens": 8}, **fields})
        hints[name] = get_target(spec.target_name).runtime_hints(spec)
        started = time.perf_counter()
        bundles[name] = export_program(spec, work / "out").path
        build_s[name] = round(time.perf_counter() - started, 1)
    device, dtype = EAGER[args.target]
    eager = f"eager_{dtype}"
    # On CUDA transformers compiles a static cache by default: that is what a user runs; plain eager beside it.
    eager_sides = {f"{eager}_compiled": eager_side(model_dir, device, dtype, compiled=True)} if device == "cuda" else {}
    sides = {eager: eager_side(model_dir, device, dtype), **eager_sides,
             **{f"program_{name}": program_side(path, args.target, hints[name]) for name, path in bundles.items()}}
    for timed in sides.values():
        timed(2)  # the first call loads and initialises: not timed
    rounds = interleaved({name: lambda _, timed=timed: (timed(1), timed(args.new_tokens)) for name, timed in sides.items()},
                         args.rounds)
    figures: dict[str, Any] = {"model": size, "new_tokens": args.new_tokens, "build_s": build_s, "target": args.target,
                               "torch_threads": torch.get_num_threads(), "cuda_graphs": args.cuda_graphs}
    if device == "cuda":
        figures.update(gpu=torch.cuda.get_device_name(0), torch=torch.__version__)
    decode: dict[str, float] = {}
    for name, times in rounds.items():
        first = [one for (one, _), _ in times]
        rates = [(count - 1) / (whole - one) for (one, _), (whole, count) in times if whole > one and count > 1]
        decode[name] = statistics.median(rates) if rates else float("nan")
        figures[name] = {"first_token": spread(first, digits=4), "decode_tokens_per_s": spread(rates, digits=1, unit="tps")}
    missing = [name for name, rate in decode.items() if math.isnan(rate)]
    if missing:
        print(f"no decode rate measured for {', '.join(missing)}: every round generated one token or none", file=sys.stderr)
        return 1
    if args.target == "cuda":
        baseline = max(eager_sides | {eager: None}, key=lambda name: decode[name])
        speedup = decode["program_bf16"] / decode[baseline]
        figures.update(baseline=baseline, decode_bf16_program_vs_baseline=round(speedup, 3),
                       decode_bf16_program_vs_eager_uncompiled=round(decode["program_bf16"] / decode[eager], 3),
                       goals={"decode": "the bf16 program >= the faster of eager bf16 generate compiled and not"})
        return 0 if report("llm_cuda", 1 / speedup, "<=1", figures) else 1
    sizes = {name: (path / "model.pte").stat().st_size for name, path in bundles.items()}
    size_ratio = sizes["int8da4w"] / sizes["float32"]
    speedup = decode["program_int8da4w"] / decode[eager]
    figures.update(program_bytes=sizes, size_int8da4w_vs_float32=round(size_ratio, 4),
                   decode_int8da4w_vs_eager_float32=round(speedup, 3),
                   decode_float32_program_vs_eager_float32=round(decode["program_float32"] / decode[eager], 3),
                   goals={"size": f"int8da4w <= {SIZE_GOAL}x float32", "decode": f"int8da4w >= {DECODE_GOAL}x eager float32"})
    ratio = max(size_ratio / SIZE_GOAL, DECODE_GOAL / speedup)
    return 0 if report("llm", ratio, "<=1", figures) else 1


if __name__ == "__main__":
    sys.exit(main())
