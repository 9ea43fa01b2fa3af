"""The code blocks of README.md and docs/*.md run as written.

A fenced block runs when the line before it is a mark (docs/testing.md):
``<!-- test: standalone -->`` (nothing else running); ``<!-- test: against-server -->``
(the HTTP gateway ``embedserve serve`` runs, started as ``embedserve gateway`` on port
0 in front of a real replica of the default model and answering to the names the
snippets use; ``localhost:8000`` / ``127.0.0.1:8000`` in the block become its address);
``<!-- test: against-scheduler -->`` (that replica, an ``embedserve scheduler``;
``127.0.0.1:50051`` becomes its address). ``<!-- test: no (REASON) -->`` says why a
block is not run. Every ``python`` block of the README must carry a mark, so a new
snippet cannot go untested by accident; pages under docs/ are written by many hands,
and there only the marked blocks run.

A snippet passes when it exits 0 (the clients it uses raise on an error answer); a
``bash`` snippet must also print JSON without an ``error`` member, since ``curl -s``
exits 0 on an error status. The gateway serves multilingual-e5-small under the name
``BAAI/bge-small-en-v1.5`` because the tests run offline: what is checked is that the
calls are right, not which weights answer them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from embedserve.entrypoint import GATEWAY_LISTENING
from embedserve.launch.processes import popen_listening, stop_popen
from serve_harness import wait_ready

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = (README, *sorted((ROOT / "docs").glob("*.md")))
MARK = re.compile(r"^<!-- test: (standalone|against-server|against-scheduler|no \(.+\)) -->$")
FENCE = re.compile(r"^```(\w*)\s*$")
RUNS = ("standalone", "against-server", "against-scheduler")
# The README's quick start serves a Hub model by its id; the docs' pages use the default
# model's own name. One server answers to both.
SERVED_NAMES = ("BAAI/bge-small-en-v1.5", "multilingual-e5-small")
SNIPPET_TIMEOUT_S = 180


@dataclass(frozen=True)
class Snippet:
    page: Path
    line: int          # 1-based line of the opening fence
    language: str
    mark: str | None   # the mode after "test: ", None when unmarked
    code: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def snippets(page: Path) -> list[Snippet]:
    """Every fenced block of ``page``, with the mark on the line before it (if any)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Snippet] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        mark = MARK.match(lines[index - 1]) if index > 0 else None
        found.append(Snippet(page, index + 1, opening.group(1), mark.group(1) if mark else None,
                             "\n".join(lines[index + 1:end]) + "\n"))
        index = end + 1
    return found


def runnable() -> list[Snippet]:
    return [s for page in PAGES for s in snippets(page) if s.mark in RUNS]


def test_every_python_block_of_the_readme_is_marked() -> None:
    unmarked = [s.name for s in snippets(README) if s.language == "python" and s.mark is None]
    assert unmarked == [], f"python blocks without a <!-- test: ... --> mark: {unmarked}"


def test_every_mark_is_followed_by_a_block() -> None:
    stray = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines[:-1], start=1):
            if MARK.match(line) and not FENCE.match(lines[number]):
                stray.append(f"{page.relative_to(ROOT)}:{number}")
        if lines and MARK.match(lines[-1]):
            stray.append(f"{page.relative_to(ROOT)}:{len(lines)}")
    assert stray == [], f"marks not directly above a fenced block: {stray}"


def test_the_readme_has_snippets_of_every_kind() -> None:
    # Guards the extraction itself: a parser that found nothing would pass every run below.
    marks = {s.mark for s in snippets(README)}
    assert {"against-server", "against-scheduler"} <= marks


@pytest.fixture(scope="module")
def server_address(default_replica) -> str:
    """``embedserve gateway`` (the HTTP app ``embedserve serve`` runs) in front of the shared
    default-model replica: one model process for both kinds of snippet."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "embedserve.cli", "gateway", "--port", "0",
               "--upstream", default_replica.address, "--served-model-name", *SERVED_NAMES]
    process, match = popen_listening(command, GATEWAY_LISTENING, env=env, cwd=str(ROOT))
    try:
        wait_ready(match.group(1))
        yield match.group(1).removeprefix("http://")
    finally:
        assert stop_popen(process, 60.0) == 0


def _run(snippet: Snippet, replacements: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    code = snippet.code
    for old, new in replacements.items():
        code = code.replace(old, new)
    if snippet.language == "python":
        command = [sys.executable, "-c", code]
    elif snippet.language == "bash":
        command = ["bash", "-euo", "pipefail", "-c", code]
    else:
        raise AssertionError(f"{snippet.name}: a mark on a {snippet.language or 'plain'} block")
    env = dict(os.environ, PYTHONPATH=str(ROOT),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=SNIPPET_TIMEOUT_S)


@pytest.mark.parametrize("snippet", runnable(), ids=lambda s: s.name)
def test_snippet_runs_as_written(snippet: Snippet, request: pytest.FixtureRequest,
                                 tmp_path: Path) -> None:
    replacements: dict[str, str] = {}
    if snippet.mark == "against-server":
        address = request.getfixturevalue("server_address")
        replacements = {"localhost:8000": address, "127.0.0.1:8000": address}
    elif snippet.mark == "against-scheduler":
        replica = request.getfixturevalue("default_replica")
        replacements = {"127.0.0.1:50051": replica.address}
    result = _run(snippet, replacements, tmp_path)
    assert result.returncode == 0, f"{snippet.name} failed:\n{result.stdout}\n{result.stderr}"
    if snippet.language == "bash":
        answer = json.loads(result.stdout)
        assert not (isinstance(answer, dict) and "error" in answer), f"{snippet.name}: {answer}"
