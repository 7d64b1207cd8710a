"""``generate``: one prompt through a decoder-LM bundle's program in a child process, its text handed over as the
child makes it; and the child that ``verify`` runs the bundle's own prompts in (judged by ``validate.generation``).
(A target whose runtime ships no LLM runner runs the program through its forward instead: ``decoding.open_generator``.)
"""

from __future__ import annotations

import codecs
import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from prefect_executorch.errors import ChildProcessFailed, GenerationFailed, ValidationFailed
from prefect_executorch.isolation import StartMethod, run_isolated
from prefect_executorch.runtime.decoding import GenerationStats, Generator, open_generator
from prefect_executorch.scratch import scratch_dir
from prefect_executorch.spec.llm import TOKENIZER_FILE
from prefect_executorch.targets import PROGRAM_FILE

#: Wall-time limit of a child that runs a bundle's prompts (a small model takes seconds).
CASES_TIMEOUT_S = 600.0
#: How often ``generate`` looks for new text from its child (s).
STREAM_POLL_S = 0.05


class RunnerRequest(BaseModel):
    """What a child that drives the LLM runner over a bundle gets."""

    bundle_dir: str
    target: str = Field(description="The bundle's target: which runtime runs it.")
    data_files: list[str] = Field(default_factory=list, description="The bundle's .ptd files.")
    prompt: str | None = None
    new_tokens: int | None = None
    stream_to: str | None = Field(None, description="A file the child appends each token's text to as it comes.")
    runtime_hints: dict[str, Any] = Field(default_factory=dict, description="The bundle's runtime hints (its manifest's).")


    def open(self) -> Generator:
        """What generates with the bundle's program on this machine."""
        bundle = Path(self.bundle_dir)
        data = bundle / self.data_files[0] if self.data_files else None
        return open_generator(bundle / PROGRAM_FILE, bundle / TOKENIZER_FILE, self.target, data, self.runtime_hints)


class Generated(BaseModel):
    """One prompt's text through the runner, and the runner's timing."""

    pieces: list[str]
    stats: GenerationStats
    generated_by: str = Field(description="What ran the program.")


def generate_in_child(request: dict[str, Any]) -> Generated:
    """Child side: one prompt through the runner, greedily, each token's text written to ``stream_to`` as it comes,
    special tokens (the EOS that ends it) left out, as transformers' ``decode(skip_special_tokens=True)`` prints."""
    from tokenizers import Tokenizer

    req = RunnerRequest.model_validate(request)
    assert req.prompt is not None and req.new_tokens is not None and req.stream_to is not None
    added = Tokenizer.from_file(str(Path(req.bundle_dir) / TOKENIZER_FILE)).get_added_tokens_decoder().values()
    special = {token.content for token in added if token.special}
    with open(req.stream_to, "a", encoding="utf-8") as stream:

        def write(piece: str) -> None:
            if piece in special:
                return
            stream.write(piece)
            stream.flush()

        generator = req.open()
        pieces, stats = generator.greedy(req.prompt, req.new_tokens, write)
    return Generated(pieces=pieces, stats=stats, generated_by=generator.name)


def generate(bundle_dir: Path, target: str, data_files: list[str], prompt: str, new_tokens: int, *,
             on_text: Callable[[str], None] | None = None, start: StartMethod | None = None,
             runtime_hints: dict[str, Any] | None = None) -> Generated:
    """``prompt`` continued greedily by the bundle's program through ExecuTorch's LLM runner (in a child, its
    runtime set up as ``runtime_hints`` say); ``on_text`` gets the text as the child makes it."""
    with scratch_dir("generate") as streams:
        stream = streams / "text"
        stream.touch()
        request = RunnerRequest(bundle_dir=str(bundle_dir), target=target, data_files=data_files, prompt=prompt,
                                new_tokens=new_tokens, stream_to=str(stream), runtime_hints=runtime_hints or {})
        with _following(stream, on_text):
            try:
                return in_runner_child("generate", request, Generated, f"generation with {bundle_dir}", None, start)
            except ValidationFailed as exc:  # what the child's failure is called when a check runs the prompts
                raise GenerationFailed(str(exc).replace("; the program did not generate", "; the program stopped "
                                                        "generating"), child_output=exc.child_output) from None


@contextlib.contextmanager
def _following(path: Path, on_text: Callable[[str], None] | None) -> Iterator[None]:
    """Pass what is appended to ``path`` to ``on_text`` while the block runs, and the rest when it ends."""
    if on_text is None:
        yield
        return
    done = threading.Event()
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a read may end inside a character

    def follow() -> None:
        with path.open("rb") as file:
            while True:
                finished = done.is_set()  # read once more after the block ends: what came last
                text = decoder.decode(file.read())
                if text:
                    on_text(text)
                if finished:
                    return
                done.wait(STREAM_POLL_S)

    follower = threading.Thread(target=follow, name="generate-stream", daemon=True)
    follower.start()
    try:
        yield
    finally:
        done.set()
        follower.join()


def in_runner_child(command: str, request: RunnerRequest, result: type[Any], what: str, parent: Path | None,
                    start: StartMethod | None) -> Any:
    """``command`` run over the bundle in a child; its failure as ``ValidationFailed`` naming ``what``."""
    # ``parent`` (the caller's scratch) when given, else an owned scratch folder: a killed run's is swept.
    with scratch_dir("llm", parent) as scratch:
        try:
            return run_isolated(command, request, result, timeout_s=CASES_TIMEOUT_S, scratch_dir=scratch, what=what,
                                start=start)
        except ChildProcessFailed as exc:
            raise ValidationFailed(f"{exc}; the program did not generate on this machine",
                                   child_output=exc.child_output) from exc
