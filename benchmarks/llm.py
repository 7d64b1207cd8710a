"""Decoder LM: time to first token and decode speed of the ExecuTorch programs against eager ``generate``, one run.

A model made from a transformers config with random weights (no hub) and a byte-level BPE tokenizer trained here:
``--size smoke`` (2 layers of 64: CI), ``19m`` (8 layers of 512), ``135m`` (SmolLM2-135M's shape: 30 layers of 576,
9 heads, 3 for keys and values, vocab 49152, tied embeddings) or ``500m`` (Qwen2.5-0.5B's shape: 24 layers of 896,
14 heads, 2 for keys and values, vocab 151936, tied), or ``gemma3-19m`` (Gemma 3's pattern: 6 layers of 512, five
with a sliding window of 32 positions to one global, so the program's sliding layers keep a ring cache and it
prefills in chunks of 32). Each program is built by the product (export child, timed, its peak resident memory
recorded).

On ``--target xnnpack`` (this CPU) the sides are:
  - ``program_float32`` and ``program_int8da4w``: today's default, the prompt prefilled in one call with ExecuTorch's
    custom SDPA and KV-cache ops, through ExecuTorch's LLM runner;
  - ``program_int8da4w_one_token``: the program as it was built before, one token per call with transformers'
    attention (``llm.prefill: token_by_token``, ``llm.attention: transformers``);
  - ``eager_float32``: eager ``generate`` with a static cache, not compiled; ``eager_float32_compiled``: the same with
    transformers' own compile of the decode step (its ``CompileConfig``, on the CPU as its ``_compile_all_devices``
    flag asks). The faster of the two is the baseline of each figure.
On ``--target cuda`` (a GPU worker with the CUDA stack): ``program_bf16`` through the runtime with CudaBackend (which
ships no LLM runner; the prompt in one call, or with ``--cuda-graphs`` a token a call, each replayed) and
``program_bf16_one_token`` (the prompt a token a call, as it was built before) beside eager bf16
``generate`` as transformers runs it on CUDA (a static cache compiled by default) and with ``disable_compile=True``.

Every side generates greedily from the same ``--prompt-tokens``-token prompt, first 1 token (its time is the time to
first token) and then ``--new-tokens`` tokens, in interleaved rounds (the load of a shared machine hits every side
alike); decode tokens/s is the tokens after the first over the difference. Figures are medians over ``--rounds``.
Torch's thread count is set (``--threads``, default every core) and recorded.

Goals (``RESULT llm ratio=<worst of the goals' ratios> goal=<=1``), on xnnpack: the int8da4w program's first token at
most 0.5x the baseline's, its decode at least 3x the baseline's and 1.5x the one-token program's, its size at most
0.3x float32's. On cuda (``RESULT llm_cuda``): the bf16 program's first token no slower than the baseline's, its
decode at least 1.5x the baseline's. A figure that was not measured fails the run.
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
from _common import interleaved, native_output_to_stderr, report, scratch, spread  # noqa: E402

from prefect_executorch.export.exporter import export_program  # noqa: E402
from prefect_executorch.spec.buildspec import parse_spec  # noqa: E402
from prefect_executorch.testing.tiny_llm import CORPUS, write_tiny_llm  # noqa: E402

#: Model shapes by ``--size``: write_tiny_llm's architecture and config.
SIZES: dict[str, tuple[str, dict[str, Any]]] = {
    "smoke": ("llama", {"hidden_size": 64, "layers": 2}),
    "19m": ("llama", {"hidden_size": 512, "layers": 8}),
    "135m": ("llama", {"hidden_size": 576, "layers": 30, "intermediate_size": 1536, "num_attention_heads": 9,
                       "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "tie_word_embeddings": True,
                       "rope_theta": 100000.0, "max_position_embeddings": 8192}),
    # Gemma 3's pattern, 5 sliding-window layers to 1 global, the window a quarter of the prompt: a ring cache.
    "gemma3-19m": ("gemma3_text", {"hidden_size": 512, "layers": 6, "sliding_window": 32,
                                   "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}),
    "500m": ("qwen2", {"hidden_size": 896, "layers": 24, "intermediate_size": 4864, "num_attention_heads": 14,
                       "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 151936, "tie_word_embeddings": True,
                       "max_position_embeddings": 32768}),
}
#: What each ``--target`` builds: variant -> spec fields.
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    "xnnpack": {
        "float32": {},
        "int8da4w": {"quantization": {"scheme": "int8da4w"}},
        "int8da4w_one_token": {"quantization": {"scheme": "int8da4w"},
                               "llm": {"prefill": "token_by_token", "attention": "transformers"}},
    },
    "cuda": {"bf16": {"target": {"kind": "cuda", "precision": "bf16"}},
             "bf16_one_token": {"target": {"kind": "cuda", "precision": "bf16"}, "llm": {"prefill": "token_by_token"}}},
}
EAGER = {"xnnpack": ("cpu", "float32"), "cuda": ("cuda", "bfloat16")}


def prompt_of(tokenizer_file: Path, tokens: int) -> tuple[str, int]:
    """Text of the corpus, repeated, that the tokenizer encodes to ``tokens`` tokens (or the nearest below)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    words: list[str] = []
    while len(tokenizer.encode(" ".join(words)).ids) < tokens:
        words += " ".join(CORPUS).split()
    while len(tokenizer.encode(" ".join(words)).ids) > tokens:
        words.pop()
    text = " ".join(words)
    return text, len(tokenizer.encode(text).ids)


def eager_side(model_dir: Path, prompt: str, device: str, dtype: str, compiled: bool) -> Any:
    """Greedy ``generate`` of the model in ``dtype`` on ``device`` with a static cache (``compiled``: transformers'
    compile of the decode step, else ``disable_compile``): (seconds, tokens) for ``tokens`` new tokens."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, CompileConfig

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=getattr(torch, dtype))
    model = model.to(device).eval()
    ids = torch.tensor([Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(prompt).ids], device=device)
    compile_config = None
    if compiled and device == "cpu":
        # transformers compiles a static cache's decode step by itself on CUDA; on the CPU its flag asks for it.
        compile_config = CompileConfig(mode="default")
        compile_config._compile_all_devices = True

    def timed(tokens: int) -> tuple[float, int]:
        started = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                           cache_implementation="static", disable_compile=not compiled, compile_config=compile_config,
                           pad_token_id=1)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started, tokens

    return timed


def program_side(bundle: Path, target: str, prompt: str, hints: dict[str, Any]) -> Any:
    """Greedy generation by what runs the program on ``target`` (ExecuTorch's ``TextLLMRunner`` on CPU; on CUDA the
    program's forward called here): (seconds, tokens generated) for ``tokens`` new tokens (fewer at an
    end-of-sequence token)."""
    from prefect_executorch.runtime.decoding import open_generator

    generator = open_generator(bundle / "model.pte", bundle / "tokenizer.json", target,
                               next(iter(sorted(bundle.glob("*.ptd"))), None), hints)

    def timed(tokens: int) -> tuple[float, int]:
        started = time.perf_counter()
        pieces, _ = generator.greedy(prompt, tokens)
        return time.perf_counter() - started, len(pieces)

    return timed


def goals(target: str, first: dict[str, float], decode: dict[str, float], sizes: dict[str, int],
          eager: list[str]) -> dict[str, float]:
    """Each goal's ratio, 1 at the goal and below it when met."""
    fastest_first = min(first[name] for name in eager)
    fastest_decode = max(decode[name] for name in eager)
    if target == "cuda":
        return {"first_token_vs_baseline": first["program_bf16"] / fastest_first,
                "decode_1.5x_baseline": 1.5 / (decode["program_bf16"] / fastest_decode)}
    return {
        "first_token_0.5x_baseline": first["program_int8da4w"] / fastest_first / 0.5,
        "decode_3x_baseline": 3.0 / (decode["program_int8da4w"] / fastest_decode),
        "decode_1.5x_one_token_program": 1.5 / (decode["program_int8da4w"] / decode["program_int8da4w_one_token"]),
        "size_0.3x_float32": sizes["int8da4w"] / sizes["float32"] / 0.3,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="19m")
    parser.add_argument("--smoke", action="store_true", help="--size smoke with a 16-token prompt: what CI runs.")
    parser.add_argument("--rounds", type=int, default=3, help="Interleaved timing rounds (at least 3).")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64, help="Tokens each decode generates.")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch's intra-op threads (recorded).")
    parser.add_argument("--target", choices=sorted(VARIANTS), default="xnnpack")
    parser.add_argument("--cuda-graphs", action="store_true", help="--target cuda: build with target.cuda_graphs.")
    parser.add_argument("--variants", nargs="+", help="build only these of the target's variants (the goals that "
                        "need another are reported as not measured, and the run fails)")
    args = parser.parse_args()
    if args.smoke:
        args.size, args.prompt_tokens = "smoke", 16
    if args.rounds < 3:
        parser.error("--rounds must be at least 3 (medians of 3 or more runs are compared)")
    native_output_to_stderr()

    import torch

    from prefect_executorch.targets import get_target

    torch.set_num_threads(args.threads)
    work = scratch("bench-llm-")
    architecture, shape = SIZES[args.size]
    model_dir = write_tiny_llm(work / "model", architecture, **shape)
    prompt, prompt_tokens = prompt_of(model_dir / "tokenizer.json", args.prompt_tokens)
    seq_len = prompt_tokens + args.new_tokens + 8
    bundles: dict[str, Path] = {}
    built: dict[str, dict[str, Any]] = {}
    hints: dict[str, dict[str, Any]] = {}
    chosen = {name: fields for name, fields in VARIANTS[args.target].items() if not args.variants or name in args.variants}
    if args.variants and set(args.variants) - set(chosen):
        parser.error(f"--variants: {sorted(set(args.variants) - set(chosen))} are not variants of {args.target}: "
                     f"{sorted(VARIANTS[args.target])}")
    for name, fields in chosen.items():
        if args.cuda_graphs:
            fields = {**fields, "target": {**fields["target"], "cuda_graphs": True}}
        spec = parse_spec({"name": "bench-llm", "version": name, "model": str(model_dir), **fields,
                           "llm": {"max_seq_len": seq_len, "new_tokens": 8, **fields.get("llm", {})}})
        hints[name] = get_target(spec.target_name).runtime_hints(spec)
        started = time.perf_counter()
        export = export_program(spec, work / "out")
        bundles[name] = export.path
        built[name] = {"export_s": round(time.perf_counter() - started, 1), "export_child_s": round(export.seconds, 1),
                       "export_child_peak_rss_mib": export.peak_rss_mib,
                       "program_bytes": (export.path / "model.pte").stat().st_size, "notes": export.warnings}
    device, dtype = EAGER[args.target]
    eager = [f"eager_{dtype}", f"eager_{dtype}_compiled"]
    sides = {eager[0]: eager_side(model_dir, prompt, device, dtype, compiled=False),
             eager[1]: eager_side(model_dir, prompt, device, dtype, compiled=True),
             **{f"program_{name}": program_side(path, args.target, prompt, hints[name]) for name, path in bundles.items()}}
    warm_s = {}
    for name, timed in sides.items():
        started = time.perf_counter()
        # The first calls load, initialise and (eager compiled) compile for each length a round uses: not timed.
        timed(1)
        timed(args.new_tokens)
        warm_s[name] = round(time.perf_counter() - started, 2)
    rounds = interleaved({name: lambda _, timed=timed: (timed(1), timed(args.new_tokens)) for name, timed in sides.items()},
                         args.rounds)
    parameters = sum(p.numel() for p in __import__("transformers").AutoModelForCausalLM.from_pretrained(
        model_dir, local_files_only=True).parameters())
    figures: dict[str, Any] = {
        "size": args.size, "architecture": architecture, "parameters": parameters, "prompt_tokens": prompt_tokens,
        "new_tokens": args.new_tokens, "target": args.target, "torch_threads": torch.get_num_threads(),
        "cuda_graphs": args.cuda_graphs, "builds": built, "first_call_s": warm_s,
    }
    if device == "cuda":
        figures.update(gpu=torch.cuda.get_device_name(0), torch=torch.__version__)
    first: dict[str, float] = {}
    decode: dict[str, float] = {}
    for name, times in rounds.items():
        firsts = [one for (one, _), _ in times]
        rates = [(count - 1) / (whole - one) for (one, _), (whole, count) in times if whole > one and count > 1]
        first[name] = statistics.median(firsts)
        decode[name] = statistics.median(rates) if rates else math.nan
        figures[name] = {"first_token": spread(firsts, digits=4), "decode_tokens_per_s": spread(rates, digits=1, unit="tps")}
    missing = [name for name, rate in decode.items() if math.isnan(rate)]
    if missing:
        print(f"no decode rate measured for {', '.join(missing)}: every round generated one token or none", file=sys.stderr)
        return 1
    figures["baseline"] = {"first_token": min(eager, key=lambda n: first[n]), "decode": max(eager, key=lambda n: decode[n])}
    try:
        ratios = goals(args.target, first, decode, {name: build["program_bytes"] for name, build in built.items()}, eager)
    except KeyError as missing_side:
        figures["not_measured"] = f"goals need {missing_side}, which --variants left out"
        report("llm_cuda" if args.target == "cuda" else "llm", math.inf, "<=1", figures)
        return 1
    figures["goal_ratios"] = {name: round(value, 3) for name, value in ratios.items()}
    worst = max(ratios.values())
    return 0 if report("llm_cuda" if args.target == "cuda" else "llm", worst, "<=1", figures) else 1


if __name__ == "__main__":
    sys.exit(main())
