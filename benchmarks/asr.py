"""Speech recognition: real-time factor of the ExecuTorch programs against eager ``generate``, and their sizes.

A Whisper made from a transformers config with random weights (no hub): ``--size tiny`` (whisper-tiny's shape: 4
encoder and 4 decoder layers of 384, 6 heads, 80 mel bins, 448 decoder positions, a vocabulary of 51,865) or
``smoke`` (2 and 2 layers of 64: CI). Each program is built by the product (export child, timed).

Every side transcribes the same ``--audio-s``-second clip (a chirp; Whisper pads it to its 30-s window) greedily
from the same forced start tokens for exactly ``--new-tokens`` tokens (no end token stops a side), in interleaved
rounds: the log-mel features (``WhisperFeatureExtractor``, the same on every side), the encoder once, the decoder a
token a call. Sides:
  - ``program_float32``, ``program_int8da4w``: the XNNPACK programs (int8da4w: linears in 4 bits, the token
    embedding table in ``--embeddings`` bits) through ExecuTorch's runtime as ``transcribe`` drives them;
  - ``eager_float32``: ``generate`` with transformers' defaults (a dynamic cache); ``eager_float32_compiled``: with a
    static cache and transformers' compile of the decode step. The faster of the two is the baseline.
The real-time factor is a side's median seconds over the clip's seconds. Torch's thread count is set
(``--threads``, default every core) and recorded.

Goals (``RESULT asr ratio=<worst goal ratio> goal=<=1``): the int8da4w program's real-time factor at most 0.5x the
baseline's, its program at most 0.35x the float32 program's size. A figure that was not measured fails the run.
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

from prefect_executorch.clips import made_clip  # noqa: E402
from prefect_executorch.export.exporter import export_program  # noqa: E402
from prefect_executorch.spec.buildspec import parse_spec  # noqa: E402
from prefect_executorch.testing.tiny_speech import write_tiny_whisper  # noqa: E402

#: Model shapes by ``--size``: write_tiny_whisper's arguments.
SIZES: dict[str, dict[str, Any]] = {
    "smoke": {"d_model": 64, "layers": 2},
    "tiny": {"d_model": 384, "layers": 4, "encoder_attention_heads": 6, "decoder_attention_heads": 6,
             "encoder_ffn_dim": 1536, "decoder_ffn_dim": 1536, "max_target_positions": 448, "vocab_size": 51865},
}
#: The forced start: start of transcript, English, transcribe, no timestamps.
ASR = {"language": "en", "task": "transcribe"}
#: Goals: the int8da4w program's real-time factor against the baseline's, its size against float32's.
RTF_GOAL, SIZE_GOAL = 0.5, 0.35


def chirp(seconds: float, rate: int) -> Any:
    """``seconds`` of a rising tone (the default clips' chirp, repeated)."""
    import numpy as np

    one = made_clip("chirp-200-2000hz-2s", rate)
    return np.tile(one, math.ceil(seconds * rate / len(one)))[: int(seconds * rate)]


def eager_side(model_dir: Path, samples: Any, prompt: list[int], compiled: bool) -> Any:
    """Eager ``generate`` (``compiled``: a static cache and transformers' compile of the decode step on the CPU):
    seconds to transcribe ``tokens`` tokens, features included."""
    import torch
    from transformers import CompileConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    model = WhisperForConditionalGeneration.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32)
    model = model.eval()
    extractor = WhisperFeatureExtractor.from_pretrained(model_dir, local_files_only=True)
    options: dict[str, Any] = {}
    if compiled:
        compile_config = CompileConfig(mode="default")
        compile_config._compile_all_devices = True  # transformers compiles by itself on CUDA only
        options = {"cache_implementation": "static", "compile_config": compile_config}

    def timed(tokens: int) -> tuple[float, int]:
        started = time.perf_counter()
        features = extractor(samples, sampling_rate=extractor.sampling_rate, return_tensors="pt").input_features
        with torch.no_grad():
            out = model.generate(features, decoder_input_ids=torch.tensor([prompt]), max_new_tokens=tokens,
                                 min_new_tokens=tokens, do_sample=False, **options)
        return time.perf_counter() - started, out.shape[-1]

    return timed


def program_side(bundle: Path, samples: Any) -> Any:
    """The program as ``transcribe`` drives it, its end ids cleared: seconds to transcribe ``tokens`` tokens."""
    from prefect_executorch.runtime.loaded_program import LoadedProgram
    from prefect_executorch.runtime.speech import ProgramTranscriber
    from prefect_executorch.spec.speech_model import features_of, load_feature_extractor

    transcriber = ProgramTranscriber(LoadedProgram(bundle / "model.pte", None))
    transcriber.ends = set()  # exactly the tokens asked for, as on the eager side
    extractor = load_feature_extractor(bundle)

    def timed(tokens: int) -> tuple[float, int]:
        started = time.perf_counter()
        made, _ = transcriber.transcribe(features_of(extractor, samples), tokens)
        return time.perf_counter() - started, len(made)

    return timed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--smoke", action="store_true", help="--size smoke, 8 new tokens: what CI runs.")
    parser.add_argument("--rounds", type=int, default=3, help="Interleaved timing rounds (at least 3).")
    parser.add_argument("--audio-s", type=float, default=10.0, help="Seconds of audio (at most 30).")
    parser.add_argument("--new-tokens", type=int, default=64, help="Tokens each side transcribes.")
    parser.add_argument("--embeddings", choices=["int8", "int4"], default="int8",
                        help="The int8da4w program's token embedding table.")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch's intra-op threads (recorded).")
    args = parser.parse_args()
    if args.smoke:
        args.size, args.new_tokens = "smoke", 8
    if args.rounds < 3:
        parser.error("--rounds must be at least 3 (medians of 3 or more runs are compared)")
    if not 0 < args.audio_s <= 30:
        parser.error("--audio-s: give 0 to 30 seconds (Whisper's window)")

    native_output_to_stderr()

    import torch

    torch.set_num_threads(args.threads)
    work = scratch("bench-asr-")
    model_dir = write_tiny_whisper(work / "whisper", **SIZES[args.size])
    variants = {"float32": {}, "int8da4w": {"quantization": {"scheme": "int8da4w", "embeddings": args.embeddings}}}
    built: dict[str, dict[str, Any]] = {}
    bundles: dict[str, Path] = {}
    for name, fields in variants.items():
        spec = parse_spec({"name": "bench-asr", "version": name, "model": str(model_dir), **fields,
                           "asr": {**ASR, "max_new_tokens": args.new_tokens}})
        started = time.perf_counter()
        export = export_program(spec, work / "out")
        bundles[name] = export.path
        built[name] = {"export_s": round(time.perf_counter() - started, 1), "export_child_peak_rss_mib":
                       export.peak_rss_mib, "program_bytes": (export.path / "model.pte").stat().st_size}
    from prefect_executorch.runtime.loaded_program import LoadedProgram

    prompt = [int(token) for token in LoadedProgram(bundles["float32"] / "model.pte", None).execute(
        "get_decoder_prompt_ids", ())]
    samples = chirp(args.audio_s, 16000)
    eager = ["eager_float32", "eager_float32_compiled"]
    sides = {eager[0]: eager_side(model_dir, samples, prompt, compiled=False),
             eager[1]: eager_side(model_dir, samples, prompt, compiled=True),
             **{f"program_{name}": program_side(path, samples) for name, path in bundles.items()}}
    first_call_s = {}
    for name, timed in sides.items():
        started = time.perf_counter()
        timed(args.new_tokens)  # loads, initialises and (compiled) compiles: not timed
        first_call_s[name] = round(time.perf_counter() - started, 2)
    rounds = interleaved({name: lambda _, timed=timed: timed(args.new_tokens) for name, timed in sides.items()},
                         args.rounds)
    parameters = sum(p.numel() for p in __import__("transformers").WhisperForConditionalGeneration.from_pretrained(
        model_dir, local_files_only=True).parameters())
    figures: dict[str, Any] = {"size": args.size, "parameters": parameters, "audio_s": args.audio_s,
                               "new_tokens": args.new_tokens, "embeddings": args.embeddings,
                               "torch_threads": torch.get_num_threads(), "builds": built, "first_call_s": first_call_s}
    rtf: dict[str, float] = {}
    short = []
    for name, times in rounds.items():
        short += [f"{name} made {count} tokens" for _, count in times if count != args.new_tokens]
        rtf[name] = statistics.median(seconds for seconds, _ in times) / args.audio_s
        figures[name] = {"seconds": spread([seconds for seconds, _ in times], digits=3),
                         "real_time_factor": round(rtf[name], 4)}
    if short:
        figures["not_measured"] = f"every side must transcribe {args.new_tokens} tokens: {', '.join(sorted(set(short)))}"
        report("asr", math.inf, "<=1", figures)
        return 1
    baseline = min(eager, key=lambda name: rtf[name])
    figures["baseline"] = baseline
    ratios = {"rtf_int8da4w_vs_baseline": rtf["program_int8da4w"] / rtf[baseline] / RTF_GOAL,
              "size_int8da4w_vs_float32": built["int8da4w"]["program_bytes"] / built["float32"]["program_bytes"]
              / SIZE_GOAL}
    figures["measured"] = {"rtf_int8da4w_vs_baseline": round(rtf["program_int8da4w"] / rtf[baseline], 3),
                           "rtf_float32_vs_baseline": round(rtf["program_float32"] / rtf[baseline], 3),
                           "size_int8da4w_vs_float32": round(built["int8da4w"]["program_bytes"]
                                                             / built["float32"]["program_bytes"], 3)}
    figures["goal_ratios"] = {name: round(value, 3) for name, value in ratios.items()}
    return 0 if report("asr", max(ratios.values()), "<=1", figures) else 1


if __name__ == "__main__":
    sys.exit(main())
