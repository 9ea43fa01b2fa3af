"""The bulk benchmark's corpora: real multilingual text, mixed lengths, or short documents.

``mixed``: the lines of the Universal Declaration of Human Rights in 388
languages (``text/udhr2``; ~56 tokens each with e5's prompt) taken
round-robin over the files so every language appears, with one XQuAD
paragraph (``eval/xquad``, 12 languages; ~150-300 tokens) in every
``LONG_EVERY`` documents: what re-indexing a multilingual knowledge base
looks like (many short records, some long ones).

``short``: the first word of each UDHR line (its first ``SHORT_CHARS``
characters where a script does not separate words): the documents of the
memory run, where 200,000 documents must stay affordable. A short document
still yields a full vector, an id and a row of every output column, so
per-document state (what would grow with the corpus) is what this corpus
stresses most; activations are bounded by the token budget whatever the
lengths.

Beyond what the sources hold, documents repeat (the same order again).
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.reference_data import read_xquad

LONG_EVERY = 5       # one XQuAD paragraph per this many documents
SHORT_CHARS = 8


def udhr_dir(data_dir: Path) -> Path:
    return data_dir / "text" / "udhr2"


def xquad_files(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "eval" / "xquad").glob("xquad.*.json"))


def udhr_lines(data_dir: Path, count: int) -> list[str]:
    """``count`` lines, round-robin over the UDHR files (line 1 of every language, then line 2, ...)."""
    files = sorted(udhr_dir(data_dir).glob("*.txt"))
    per_file = [[line.strip() for line in f.read_text(errors="replace").splitlines() if line.strip()]
                for f in files]
    out: list[str] = []
    deepest = max(map(len, per_file), default=0)
    for depth in range(deepest):
        if len(out) >= count:
            break
        out += [lines[depth] for lines in per_file if depth < len(lines)]
    return _repeat(out, count)


def xquad_paragraphs(data_dir: Path, count: int) -> list[str]:
    """``count`` XQuAD paragraphs, round-robin over the languages."""
    by_language = [read_xquad(path)[0] for path in xquad_files(data_dir)]
    out = [paragraphs[i] for i in range(max(map(len, by_language), default=0))
           for paragraphs in by_language if i < len(paragraphs)]
    return _repeat(out, count)


def mixed(data_dir: Path, count: int) -> list[str]:
    """``count`` documents: UDHR lines with an XQuAD paragraph in every ``LONG_EVERY``."""
    long_count = count // LONG_EVERY
    lines = iter(udhr_lines(data_dir, count - long_count))
    paragraphs = iter(xquad_paragraphs(data_dir, long_count))
    return [next(paragraphs) if i % LONG_EVERY == LONG_EVERY - 1 else next(lines) for i in range(count)]


def short(data_dir: Path, count: int) -> list[str]:
    """``count`` one-word documents cut from the UDHR lines."""
    out = []
    for line in udhr_lines(data_dir, count):
        words = line.split()
        out.append(words[0][:SHORT_CHARS * 3] if len(words) > 1 else line[:SHORT_CHARS])
    return out


def write_jsonl(path: Path, texts: list[str]) -> Path:
    with open(path, "w") as f:
        for text in texts:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    return path


def _repeat(items: list[str], count: int) -> list[str]:
    if not items:
        return []
    out = list(items[:count])
    while len(out) < count:
        out += items[:count - len(out)]
    return out
