"""The suite's inputs: real texts cut to exact token counts, the same for every system.

Owns choosing the texts (windows of the XQuAD paragraphs in ../shared/data,
12 languages, drawn with a fixed seed) and cutting each to an exact token
count, specials and prefix included, as both the model's ``tokenizer.json``
(what sentence-transformers and infinity run) and embedserve's tokenizer count
it. Knows nothing about systems or timing.

Prefix scheme (the same bytes reach every system): each embedded text already
starts with ``passage: `` and the rerank query with ``query: `` (e5's
convention), and every system is asked for a raw embedding (no ``input_type``,
no prompt name), so no server adds a second prefix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

XQUAD_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "eval" / "xquad"
LANGUAGES = ("ar", "de", "el", "en", "es", "hi", "ro", "ru", "th", "tr", "vi", "zh")
PASSAGE = "passage: "
QUERY = "query: "
# Per language, the first this many characters (~15-40k tokens) are enough windows.
STREAM_CHARS = 100_000
PROBE_TEXT = PASSAGE + "The lighthouse keeper counted forty ships before the storm reached the harbour."
RERANK_QUERY = QUERY + "Which team led the league in interceptions, and who was its leading pass rusher?"


@dataclass(frozen=True)
class TextSet:
    """Every text one suite run sends; keys are exact token counts (specials included)."""

    probe: str
    latency: dict[int, list[str]]               # workload 1: texts per size
    rerank_query: str
    rerank_docs: list[str]                      # workload 2: pairs of exactly rerank_pair_tokens
    rerank_pair_tokens: int
    throughput: dict[str, list[str]]            # workload 3: pools by label ("512", "mixed 16-512")
    concurrency: list[str]                      # workload 4: texts of concurrency_tokens
    concurrency_tokens: int
    token_counts: dict[str, int] = field(default_factory=dict, compare=False)

    def all_passages(self) -> list[str]:
        """Every embedded text once (the reference vectors are computed for these)."""
        seen: dict[str, None] = {self.probe: None}
        for texts in (*self.latency.values(), *self.throughput.values(), self.concurrency):
            seen.update(dict.fromkeys(texts))
        return list(seen)


class TextCutter:
    """Windows of real text that tokenize to exactly ``n`` ids in both tokenizers."""

    def __init__(self, model_dir: Path, seed: int = 0, xquad_dir: Path = XQUAD_DIR) -> None:
        from tokenizers import Tokenizer as HfTokenizer

        from embedserve.tokenizer import load_tokenizer

        self._hf = HfTokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._ours = load_tokenizer(model_dir)
        self._rng = np.random.default_rng(seed)
        self._paragraphs = _xquad_paragraphs(xquad_dir)
        self._streams: dict[int, list[int]] = {}   # tokenized on first use: a quick run needs few
        self.counts: dict[str, int] = {}

    def count(self, text: str) -> int:
        """Token count with specials; -1 when the two tokenizers disagree (text unusable)."""
        hf = len(self._hf.encode(text).ids)
        return hf if hf == len(self._ours.encode(text)) else -1

    def cut(self, n: int, prefix: str = PASSAGE) -> str:
        """``prefix`` + a window of a random language's text, exactly ``n`` tokens in all."""
        body = n - self.count(prefix)      # count(prefix) includes the two specials
        for _ in range(200):
            stream = self._stream(int(self._rng.integers(len(self._paragraphs))))
            if len(stream) <= body + 8:
                continue
            start = int(self._rng.integers(0, len(stream) - body - 8))
            for k in (body, body - 1, body + 1, body - 2, body + 2):
                text = prefix + self._hf.decode(stream[start:start + k]).strip()
                if self.count(text) == n:
                    self.counts[text] = n
                    return text
        raise RuntimeError(f"no window of exactly {n} tokens found")


    def _stream(self, language: int) -> list[int]:
        if language not in self._streams:
            text = self._paragraphs[language][:STREAM_CHARS]
            self._streams[language] = self._hf.encode(text, add_special_tokens=False).ids
        return self._streams[language]


def xquad_paths(xquad_dir: Path) -> list[Path]:
    """The XQuAD files the texts are cut from, one per language."""
    return [xquad_dir / f"xquad.{language}.json" for language in LANGUAGES]


def _xquad_paragraphs(xquad_dir: Path) -> list[str]:
    """One string per language: its 240 paragraphs joined (a long stream to window)."""
    streams = []
    for path in xquad_paths(xquad_dir):
        if not path.exists():
            raise FileNotFoundError(f"reference text not found: {path} (see ../shared/data/README.md)")
        articles = json.loads(path.read_text(encoding="utf-8"))["data"]
        streams.append("\n".join(p["context"] for a in articles for p in a["paragraphs"]))
    return streams


def mixed_lengths(rng: np.random.Generator, count: int, low: int, high: int) -> list[int]:
    """Log-uniform lengths in [low, high]: many short texts and a long tail, as traffic looks."""
    return np.exp(rng.uniform(np.log(low), np.log(high), count)).astype(int).clip(low, high).tolist()


def build_texts(model_dir: Path, latency_sizes: list[int], rerank_docs: int, rerank_pair_tokens: int,
                throughput_sizes: list[int], throughput_pool: int, mixed_range: tuple[int, int] | None,
                concurrency_tokens: int, concurrency_pool: int, seed: int = 0,
                texts_per_size: int = 8, xquad_dir: Path = XQUAD_DIR) -> TextSet:
    """All of a run's texts; sizes above the model's limit must be filtered out by the caller."""
    cutter = TextCutter(model_dir, seed, xquad_dir)
    rng = np.random.default_rng(seed + 1)
    latency = {n: [cutter.cut(n) for _ in range(texts_per_size)] for n in latency_sizes}
    query_tokens = cutter.count(RERANK_QUERY)
    # A pair is <s> query </s></s> doc </s>: its length is count(query) + count(doc).
    docs = [cutter.cut(rerank_pair_tokens - query_tokens) for _ in range(rerank_docs)]
    throughput = {str(n): [cutter.cut(n) for _ in range(throughput_pool)] for n in throughput_sizes}
    if mixed_range is not None:
        low, high = mixed_range
        throughput[f"mixed {low}-{high}"] = [cutter.cut(n) for n in
                                             mixed_lengths(rng, throughput_pool, low, high)]
    concurrency = [cutter.cut(concurrency_tokens) for _ in range(concurrency_pool)]
    probe_count = cutter.count(PROBE_TEXT)
    counts = dict(cutter.counts, **{PROBE_TEXT: probe_count})
    return TextSet(probe=PROBE_TEXT, latency=latency, rerank_query=RERANK_QUERY, rerank_docs=docs,
                   rerank_pair_tokens=rerank_pair_tokens, throughput=throughput,
                   concurrency=concurrency, concurrency_tokens=concurrency_tokens,
                   token_counts=counts)
