"""Figures in README.md and docs/*.md that name their record are checked against it.

A figure is written as a link to the committed JSON record that holds it, the fragment naming the value (a
dotted path, a space in a key written ``%20``; ``*N`` scales it, e.g. seconds shown as milliseconds):

    [1.7 ms](records/gpu/2026-12-06-h100-edbb4c9/llm/llm_cuda.json#figures.program_bf16.first_token.median_s*1000)

The link's text must show the value as recorded (to the digits it shows), the record must exist, and the tree that
made it (``machine.commit``) must be a clean commit of this repository that holds the benchmark that wrote it.

A figure a run's log holds (a committed ``.log`` or ``.txt`` record, such as a ``.ci/run`` log) links to its line, and
every number the link shows must be on that line as written:

    [774 passed](records/ci/ci-run-2026-12-06T0841Z-819768e.log#L512)
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s#]+\.json)#([^)\s]+)\)")
LOG_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s#]+\.(?:log|txt))#L(\d+)\)")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
#: Result names whose benchmark file is not ``benchmarks/<name>.py`` (records written before they named it).
BENCHMARK_OF = {"llm_cuda": "llm.py", "cli_cache_hit": "cli.py", "cli_overhead": "cli.py", "publish": "publish_1gib.py",
                "pull": "pull_verify.py"}


class Figure(BaseModel):
    """One figure link: where it is written, what it shows and the record value it names."""

    document: str
    line: int
    text: str
    record: str
    record_file: Path
    path: str


def figures_in(document: Path) -> list[Figure]:
    """The figure links of ``document``, each record resolved from the document's folder as a link is (a log
    record's path is ``L<line>``)."""
    found = []
    name = document.relative_to(ROOT).as_posix() if document.is_relative_to(ROOT) else document.name
    for number, line in enumerate(document.read_text().splitlines(), start=1):
        for match in [*LINK.finditer(line), *LOG_LINK.finditer(line)]:
            path = unquote(match[3]) if match.re is LINK else f"L{match[3]}"  # a key with spaces is written %20
            found.append(Figure(document=name, line=number, text=match[1], record=match[2],
                                record_file=document.parent / match[2], path=path))
    return found


def _value(record: Any, path: str) -> float:
    dotted, _, scale = path.partition("*")
    value = record
    for key in dotted.split("."):
        value = value[int(key)] if isinstance(value, list) else value[key]
    return float(value) * float(scale or 1)


def _has_file_at(commit: str, name: str) -> bool:
    done = subprocess.run(["git", "cat-file", "-e", f"{commit}:{name}"], cwd=ROOT, capture_output=True)
    return done.returncode == 0


def problems_of(figure: Figure, check_commits: bool = True) -> list[str]:
    """What is wrong with ``figure``: each a line naming the document, the figure and the record."""
    where = f"{figure.document}:{figure.line}: [{figure.text}]"
    if not figure.record_file.is_file():
        return [f"{where}: its record {figure.record} does not exist"]
    if figure.record_file.suffix in (".log", ".txt"):
        return _log_problems(figure, where)
    record = json.loads(figure.record_file.read_text())
    try:
        value = _value(record, figure.path)
    except (KeyError, IndexError, ValueError, TypeError):
        return [f"{where}: {figure.record} has no number at {figure.path}"]
    shown = NUMBER.search(figure.text)
    if shown is None:
        return [f"{where}: the link shows no number"]
    digits = len(shown[0].partition(".")[2])
    problems = []
    if abs(float(shown[0].replace(",", "")) - value) > 0.5 * 10 ** -digits + 1e-9:
        problems.append(f"{where}: {figure.record} holds {value:.{digits + 2}f} at {figure.path}")
    return problems + [f"{where}: {problem}" for problem in tree_problems(figure.record, record, check_commits)]


def _log_problems(figure: Figure, where: str) -> list[str]:
    lines = figure.record_file.read_text(errors="replace").splitlines()
    number = int(figure.path[1:])
    if not 1 <= number <= len(lines):
        return [f"{where}: {figure.record} has no line {number}"]
    shown = NUMBER.findall(figure.text)
    if not shown:
        return [f"{where}: the link shows no number"]
    on_line = NUMBER.findall(lines[number - 1])
    return [f"{where}: line {number} of {figure.record} does not hold {value}" for value in shown if value not in on_line]


def tree_problems(name: str, record: dict[str, Any], check_commits: bool = True) -> list[str]:
    """What is wrong with the tree ``record`` says made it: not a clean commit, or one without its benchmark."""
    commit = str(record.get("machine", {}).get("commit") or "")
    benchmark = "benchmarks/" + record.get("benchmark", BENCHMARK_OF.get(record.get("name", ""), f"{record.get('name')}.py"))
    if not re.fullmatch(r"[0-9a-f]{7,40}", commit):
        return [f"{name} was made from {commit or 'an unrecorded tree'}, not a clean commit"]
    if check_commits and not _has_file_at(commit, benchmark):
        return [f"{name}'s commit {commit[:12]} has no {benchmark} (or is not in this repository)"]
    return []


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _full_history() -> bool:
    done = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    return done.returncode == 0 and done.stdout.strip() == "false"


def test_every_figure_that_names_its_record_shows_what_the_record_holds() -> None:
    figures = [figure for document in documents() for figure in figures_in(document)]
    assert len(figures) >= 10, "the docs' figure links were not found"
    problems = [problem for figure in figures for problem in problems_of(figure, check_commits=_full_history())]
    assert not problems, "\n".join(problems)


def test_every_published_benchmark_record_names_a_commit_that_holds_its_benchmark() -> None:
    """What README's tables and the docs' figures come from: each result file of ``benchmarks/published/``."""
    records = sorted((ROOT / "benchmarks" / "published").glob("*/*.json"))
    assert len(records) >= 30
    problems = [problem for path in records
                for problem in tree_problems(path.relative_to(ROOT).as_posix(), json.loads(path.read_text()),
                                             check_commits=_full_history())]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("text", "path", "expected"), [
    ("[1.9 ms]", "figures.program_bf16.first_token.median_s*1000", "holds 1.70"),
    ("[1,049]", "figures.program_bf16.decode_tokens_per_s.missing", "has no number"),
    ("[fast]", "figures.program_bf16.first_token.median_s", "shows no number"),
])
def test_a_planted_wrong_figure_is_named(tmp_path: Path, text: str, path: str, expected: str) -> None:
    record = ROOT / "records/gpu/2026-12-06-h100-edbb4c9/llm/llm_cuda.json"
    document = tmp_path / "planted.md"
    document.write_text(f"A figure: {text}({record}#{path}).\n")
    [figure] = figures_in(document)
    assert any(expected in problem for problem in problems_of(figure)), problems_of(figure)


@pytest.mark.parametrize(("text", "line", "expected"), [
    ("[774 passed, 42 skipped in 13 min 37 s]", "L{line}", None),
    ("[775 passed]", "L{line}", "does not hold 775"),
    ("[774 passed]", "L99999", "has no line 99999"),
])
def test_a_figure_from_a_log_is_checked_against_its_line(tmp_path: Path, text: str, line: str,
                                                          expected: str | None) -> None:
    log = ROOT / "records/ci/ci-run-2026-12-06T0841Z-819768e.log"
    summary = next(n for n, row in enumerate(log.read_text().splitlines(), start=1) if "774 passed, 42 skipped" in row)
    (tmp_path / "planted.md").write_text(f"The suite: {text}({log}#{line.format(line=summary)}).\n")
    [figure] = figures_in(tmp_path / "planted.md")
    problems = problems_of(figure)
    assert (problems == []) if expected is None else any(expected in problem for problem in problems), problems


def test_a_figure_whose_record_is_gone_is_named(tmp_path: Path) -> None:
    (tmp_path / "planted.md").write_text("[0.5x](records/none.json#ratio)\n")
    [figure] = figures_in(tmp_path / "planted.md")
    assert problems_of(figure) == ["planted.md:1: [0.5x]: its record records/none.json does not exist"]


def test_a_record_of_a_tree_without_the_benchmark_is_named(tmp_path: Path) -> None:
    record = json.loads((ROOT / "records/gpu/2026-12-06-h100-3cd941a/gemm/inductor_gemm.json").read_text())
    # inductor_gemm.py did not exist at the tree the GPU tests of that morning ran (ac50ed4).
    record["machine"]["commit"] = "ac50ed4"
    (tmp_path / "old.json").write_text(json.dumps(record))
    figure = Figure(document="README.md", line=1, text="0.776", record=str(tmp_path / "old.json"),
                    record_file=tmp_path / "old.json", path="ratio")
    assert problems_of(figure) == [f"README.md:1: [0.776]: {tmp_path / 'old.json'}'s commit ac50ed4 has no "
                                   f"benchmarks/inductor_gemm.py (or is not in this repository)"]
    record["machine"]["commit"] += "-dirty"
    (tmp_path / "old.json").write_text(json.dumps(record))
    assert "not a clean commit" in problems_of(figure)[0]
