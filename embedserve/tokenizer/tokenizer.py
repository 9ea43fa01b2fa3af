"""The Tokenizer: load a vocabulary, encode texts and pairs into packed int32 ids.

Loads a SentencePiece ``.model`` (``model_proto``) or a Hugging Face
``tokenizer.json`` (``hf_json``) into a TokenizerSpec, builds (or loads from the
cache) the trie, and runs the Numba kernels of ``kernels/encode.py`` and ``templates.py``.
Two exactness modes, chosen by ``compat``: ``"hf"`` equals ``tokenizers`` loading the
same tokenizer.json, ``"sentencepiece"`` equals ``sentencepiece`` loading the .model.

A spec with ``wordpiece`` parameters (a WordPiece tokenizer.json, or a BERT vocab.txt
directory) is encoded by ``wordpiece.WordPieceEncoder`` instead of the Unigram kernels;
everything after the raw ids (templates, segment ids, truncation, threads) is shared.
``Tokenizer.backend`` names which encoder runs.

Text that looks like a special token (``<s>``) is ordinary text: specials only come
from the template. Lone surrogates are replaced by U+FFFD before encoding.
"""

from __future__ import annotations

import functools
import os
import re
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np

from embedserve.errors import InvalidInput, ModelLoadError
from embedserve.home_paths import expand_home
from embedserve.tokenizer.backend import Truncation
from embedserve.tokenizer.encoded import EncodedBatch
from embedserve.tokenizer.formats.charsmap import parse_charsmap
from embedserve.tokenizer.formats.model_proto import load_sentencepiece_model
from embedserve.tokenizer.kernels.encode import (
    Model,
    Scratch,
    compiled_for,
    encode_run,
    encode_with_template,
    new_scratch,
)
from embedserve.tokenizer.kernels.normalize_sp import sp_params
from embedserve.tokenizer.kernels.trie import (
    COMPACT_SCORE32,
    COMPACT_TOKEN,
    MATCHABLE_KINDS,
    NO_TOKEN,
    load_or_build_compact_nodes,
)
from embedserve.tokenizer.kernels.word_cache import (
    MIN_HIT_PERCENT,
    WordCache,
    clear_table_usage,
    clear_word_cache,
    new_table_usage,
    new_word_cache,
)
from embedserve.tokenizer.spec import Compat, PieceKind, TemplateItem, TokenizerSpec
from embedserve.tokenizer.templates import NO_LIMIT, pack_pairs, pack_single, truncation_limit
from embedserve.tokenizer.wordpiece import WordPieceEncoder

DEFAULT_CACHE_DIR = Path("~/.cache/embedserve/tokenizer")
_SURROGATE = re.compile("[\ud800-\udfff]")
_BYTE_PIECE = re.compile("<0x([0-9A-F]{2})>")
_EMPTY = np.zeros(0, np.int32)
_NO_SPECIALS = (_EMPTY, _EMPTY)
# Below this many input bytes per thread a batch is encoded on the calling thread:
# handing work to other threads costs more than it saves.
PARALLEL_MIN_BYTES = 1 << 15
# A thread keeps its scratch (~75 bytes per input byte) for inputs up to this size:
# 128 KiB covers a 16k-token text of 3-byte characters at ~10 MB per thread.
KEEP_SCRATCH_BYTES = 1 << 17
# Slots of each thread's word cache (kernels/word_cache.py): 64 bytes a slot, 8 MiB per
# thread that encodes (zeroed pages, committed as slots fill). The table pays only when
# it holds many of the words that come again: on the 379-language bench (~41k distinct
# words a pass) 16,384 slots of 128 bytes measured no faster than none, 65,536 0.79x
# (BENCHMARKS.md).
WORD_CACHE_SLOTS = 1 << 17
_NO_WORD_CACHE = new_word_cache(0)  # never written: a table of no slots caches nothing
_NO_USAGE = new_table_usage()  # never written: only a table with slots counts its hits


def to_utf8(text: str) -> bytes:
    """UTF-8 bytes of ``text``, lone surrogates (as JSON can deliver) replaced by U+FFFD."""
    if not isinstance(text, str):
        raise InvalidInput(f"expected a string, got {type(text).__name__}")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text).encode("utf-8")


class Tokenizer:
    """An exact Unigram encoder over a loaded TokenizerSpec (a ``backend.TokenizerBackend``)."""

    def __init__(self, spec: TokenizerSpec, cache_dir: Path | None = DEFAULT_CACHE_DIR,
                 threads: int | None = None, word_cache_slots: int = WORD_CACHE_SLOTS,
                 word_cache_min_hit_percent: int = MIN_HIT_PERCENT) -> None:
        """``threads``: how many threads encode_batch uses (default: all cores).

        ``word_cache_slots``: slots of each thread's cache of per-word results (a power of
        two; 0 turns it off). sentencepiece mode caches only where every piece has "▁"
        at most as its first character and "▁" alone is a piece (``_words_chain``).
        ``word_cache_min_hit_percent``: below this share of the bytes of its words found
        in the cache, text skips it (all but a probe in 16; kernels/word_cache.py; 0:
        never skipped).
        """
        if any(spec.single_type_ids):  # encode_batch gives single texts no segment ids
            raise ModelLoadError(f"{spec.source}: field post_processor.single: segment ids other than 0 are "
                                 "not supported; supported: type_id 0 throughout the single-text template")
        self.spec = spec
        new_word_cache(word_cache_slots)  # checks the size before anything is built
        new_table_usage(word_cache_min_hit_percent)  # and the share
        self._word_cache_min_hit_percent = word_cache_min_hit_percent
        # The table packs a token id in 23 bits (kernels/word_cache.py).
        caches = word_cache_slots > 0 and spec.vocab_size < 1 << 23 and (spec.compat == "hf" or _words_chain(spec))
        self._word_cache_slots = word_cache_slots if caches else 0
        self._wordpiece: WordPieceEncoder | None = None
        if spec.wordpiece is not None:  # WordPiece -> the native WordPiece encoder
            self._wordpiece = WordPieceEncoder(spec, expand_home(cache_dir))
        else:
            self._init_unigram(spec, cache_dir)
        self._threads = max(1, threads or os.cpu_count() or 1)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._single = _split_template(spec.single_template, ("A",), spec.source)
        self._pair = _split_template(spec.pair_template, ("A", "B"), spec.source)
        self._pair_types = _split_types(spec.pair_template, spec.pair_type_ids)
        self._local = threading.local()

    def _init_unigram(self, spec: TokenizerSpec, cache_dir: Path | None) -> None:
        units, strings = parse_charsmap(spec.precompiled_charsmap, spec.source)
        if spec.compat == "sentencepiece":
            (params, strings), self._hf = sp_params(spec, units, strings), None
        else:
            from embedserve.tokenizer.kernels.normalize_hf import hf_params
            params = self._hf = hf_params(spec, units)
        nodes, score64 = load_or_build_compact_nodes(spec, expand_home(cache_dir))  # None: built in memory
        unk_score = _unk_score(spec)
        token_scores, max_abs_score = np.zeros(0, np.float32), 0.0
        if spec.compat == "sentencepiece" and self._word_cache_slots:
            token_scores, max_abs_score = _token_scores(nodes, spec.vocab_size, unk_score)
        flat = nodes.reshape(-1)  # the kernels walk flat offsets (trie.py)
        self._model = Model(units, strings, params, flat, flat.view(np.float32), score64, token_scores,
                            max_abs_score, int(spec.unk_id), unk_score, _byte_ids(spec))
        # hf mode's "first" prepend scheme reads where a word came from (kernels/origins.py).
        self._ids_read_origins = spec.hf is not None and spec.hf.prepend_scheme == "first"

    @functools.cached_property
    def _encode_one(self):
        """encode()'s kernel, bound to the argument types every call passes, on the first
        call: a server only runs encode_batch, and binding compiles (first use after an
        install: 38 s in hf mode on 2 cores) or loads the kernel from the disk cache.

        Where the ids read the normalizers' source ranges (hf mode's "first" prepend
        scheme), encode_batch's kernel, which keeps them, encodes the one text: a single
        text kernel keeping them would be one more compile (~30 s) for a rare file."""
        if self._ids_read_origins:
            return self._encode_one_by_run
        return compiled_for(encode_with_template, self._model, np.frombuffer(b"", np.uint8),
                            self._encode_scratch(0, 2), _EMPTY, _EMPTY, self._hf, _NO_WORD_CACHE, _NO_USAGE)

    def _encode_one_by_run(self, model: Model, src: np.ndarray, scratch: Scratch, prefix: np.ndarray,
                           suffix: np.ndarray, hf, cache, usage) -> tuple[np.ndarray, bool]:
        """``_encode_one`` through encode_batch's kernel. Takes the single-text kernel's
        arguments so that encode() calls either alike; the model, scratch, normalizer
        parameters and cache are encode_batch's own (this thread's word cache)."""
        ids, _, _, count = self._encode_range(src, np.array([0, len(src)], np.int64), 0, 1, False)
        return np.concatenate((prefix, ids[:count[0]], suffix)), True

    def _encode_scratch(self, src_len: int, factor: int) -> Scratch:
        """Scratch for encode(), which reports no offsets: without the normalizers' source
        ranges (``None``, kernels/origins.py; where the ids read them, encode() runs
        encode_batch's kernel, which keeps its own)."""
        return new_scratch(src_len, factor)._replace(norm_origin=None)

    # ---- loading -------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path, compat: Compat | None = None,
                  cache_dir: str | Path | None = DEFAULT_CACHE_DIR,
                  fairseq_ids: bool = False, word_cache_slots: int = WORD_CACHE_SLOTS,
                  word_cache_min_hit_percent: int = MIN_HIT_PERCENT) -> Tokenizer:
        """A ``.model`` (default compat "sentencepiece") or ``tokenizer.json`` (default "hf").

        ``fairseq_ids`` (``.model`` only): XLM-R id order instead of SentencePiece's.
        """
        path = Path(path)
        if not path.is_file():
            raise ModelLoadError(f"{path}: no such tokenizer file")
        if path.suffix == ".json":
            from embedserve.tokenizer.formats.hf_json import load_tokenizer_json
            spec = load_tokenizer_json(path)
            if compat == "sentencepiece":
                raise ModelLoadError(f"{path}: compat='sentencepiece' needs a SentencePiece .model "
                                     "file; a tokenizer.json supports compat='hf'")
        else:
            spec = load_sentencepiece_model(path, fairseq_ids=fairseq_ids)
            if compat == "hf":
                from embedserve.tokenizer.formats.hf_json import spec_for_hf_compat
                spec = spec_for_hf_compat(spec)
        return cls(spec, Path(cache_dir) if cache_dir is not None else None, word_cache_slots=word_cache_slots,
                   word_cache_min_hit_percent=word_cache_min_hit_percent)

    @classmethod
    def from_model_dir(cls, model_dir: str | Path, compat: Compat = "hf",
                       cache_dir: str | Path | None = DEFAULT_CACHE_DIR) -> Tokenizer:
        """A model directory: tokenizer.json when present (and compat is "hf"), else
        sentencepiece.bpe.model in XLM-R id order, else BERT's vocab.txt (+ tokenizer_config.json)."""
        model_dir = Path(model_dir)
        json_path = model_dir / "tokenizer.json"
        sp_path = model_dir / "sentencepiece.bpe.model"
        if compat == "hf" and json_path.is_file():
            return cls.from_file(json_path, "hf", cache_dir)
        if sp_path.is_file():
            return cls.from_file(sp_path, compat, cache_dir, fairseq_ids=True)
        if compat == "hf" and (model_dir / "vocab.txt").is_file():  # vocab.txt -> native WordPiece
            from embedserve.tokenizer.formats.bert_vocab import load_bert_vocab_dir
            return cls(load_bert_vocab_dir(model_dir), Path(cache_dir) if cache_dir is not None else None)
        raise ModelLoadError(f"{model_dir}: no tokenizer.json, sentencepiece.bpe.model or vocab.txt")

    # ---- vocabulary ----------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size

    @property
    def compat(self) -> Compat:
        return self.spec.compat

    @property
    def backend(self) -> str:
        """Which encoder runs: "native-wordpiece" or "native-unigram"."""
        return "native-wordpiece" if self._wordpiece is not None else "native-unigram"

    bos_id = property(lambda self: self.spec.bos_id)
    eos_id = property(lambda self: self.spec.eos_id)
    pad_id = property(lambda self: self.spec.pad_id)
    unk_id = property(lambda self: self.spec.unk_id)
    mask_id = property(lambda self: self.spec.mask_id)

    @property
    def single_specials(self) -> tuple[np.ndarray, np.ndarray]:
        """int32 ids the single-sequence template puts before and after a text."""
        return self._single[0], self._single[1]

    def id_to_piece(self, token_id: int) -> str:
        if not 0 <= token_id < self.vocab_size:
            raise InvalidInput(f"token id {token_id} is outside the vocabulary (0..{self.vocab_size - 1})")
        return self.spec.pieces[token_id]

    # ---- encoding ------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> np.ndarray:
        """Ids of one text (int32), with the single template's specials unless disabled."""
        # The common path is kept to a few attribute reads: on a short text the Python
        # around the kernel call costs as much as the kernel.
        src = np.frombuffer(to_utf8(text), np.uint8)
        prefix, suffix = self._single if add_special_tokens else _NO_SPECIALS
        if self._wordpiece is not None:
            return self._wordpiece.encode_one(src, prefix, suffix)
        buffers = getattr(self._local, "buffers", None)
        if buffers is None or len(src) > buffers.capacity:
            buffers = self._thread_buffers(len(src))
        ids, ok = self._encode_one(self._model, src, buffers.scratch, prefix, suffix, self._hf, buffers.word_cache,
                                   buffers.usage)
        return ids if ok else self._encode_growing(src, prefix, suffix, buffers)

    def _encode_growing(self, src: np.ndarray, prefix: np.ndarray, suffix: np.ndarray,
                        buffers: _ThreadBuffers) -> np.ndarray:
        """encode() of a text whose normalization expanded it more than 2x (rare): retry
        with ever larger scratch, kept for next time unless the text is huge."""
        factor = 4
        while True:
            scratch = self._encode_scratch(len(src), factor)
            if len(src) <= KEEP_SCRATCH_BYTES:  # never pin a huge one
                self._local.buffers = buffers._replace(capacity=_capacity(scratch), scratch=scratch)
            ids, ok = self._encode_one(self._model, src, scratch, prefix, suffix, self._hf, buffers.word_cache,
                                       buffers.usage)
            if ok:
                return ids
            factor *= 2

    def encode_batch(self, texts: Sequence[str], max_length: int | None = None,
                     truncation: Truncation = None, add_special_tokens: bool = True,
                     return_offsets: bool = False) -> EncodedBatch:
        """Encode many texts in parallel (all cores, GIL released) into one packed batch."""
        limit, from_left = truncation_limit(max_length, truncation)
        prefix, suffix = self._single if add_special_tokens else _NO_SPECIALS
        if limit != NO_LIMIT and limit < len(prefix) + len(suffix):
            raise InvalidInput(f"max_length {limit} leaves no room for the special tokens", "max_length")
        if len(texts) == 1 and not return_offsets and not isinstance(texts, str):
            # One text (a search query): encode()'s single kernel call, about half the
            # Python and memory a batch's two kernels and their arrays touch.
            one = self.encode(texts[0], add_special_tokens)
            if limit == NO_LIMIT or one.shape[0] <= limit:
                return _one_sequence(one)
        ids, spans, start, count = self._encode_raw(texts, return_offsets)
        out = pack_single(ids, spans, start, count, prefix, suffix, limit, from_left, return_offsets)
        return _batch(out, return_offsets)

    def encode_pair(self, a: str, b: str, max_length: int | None = None,
                    truncation: Truncation = None, add_special_tokens: bool = True) -> np.ndarray:
        """Ids of one pair, ``<s> A </s></s> B </s>`` for XLM-R, cut longest-first."""
        return self.encode_pairs(a, [b], max_length, truncation, add_special_tokens).sequence(0).copy()

    def encode_pairs(self, query: str, docs: Sequence[str], max_length: int | None = None,
                     truncation: Truncation = None, add_special_tokens: bool = True,
                     return_offsets: bool = False) -> EncodedBatch:
        """One query against many docs (rerank): pair i is (query, docs[i])."""
        limit, from_left = truncation_limit(max_length, truncation)
        prefix, middle, suffix = self._pair if add_special_tokens else (_EMPTY, _EMPTY, _EMPTY)
        if limit != NO_LIMIT and limit < len(prefix) + len(middle) + len(suffix):
            raise InvalidInput(f"max_length {limit} leaves no room for the special tokens", "max_length")
        ids, spans, start, count = self._encode_raw([query, *docs], return_offsets)
        n = len(docs)
        types = self._pair_types if add_special_tokens else _NO_PAIR_TYPES
        out = pack_pairs(ids, spans, np.full(n, start[0]), np.full(n, count[0]), start[1:], count[1:],
                         prefix, middle, suffix, limit, from_left, return_offsets, *types)
        return _batch(out[:5], return_offsets, out[5] if any(t.any() for t in types) else None)

    def tokenize(self, text: str) -> list[str]:
        """The pieces of ``text`` (no specials), for display."""
        return [self.spec.pieces[i] for i in self.encode(text, add_special_tokens=False)]

    # ---- internals -----------------------------------------------------------------
    def _thread_buffers(self, src_len: int) -> _ThreadBuffers:
        """This thread's buffers with scratch for ``src_len`` source bytes. Inputs over
        KEEP_SCRATCH_BYTES get a temporary scratch (scratch is ~75 bytes per input byte: a
        10 MB text must not pin 750 MB)."""
        buffers = getattr(self._local, "buffers", None)
        if buffers is None:  # a table is not safe to share between threads: one each
            scratch = self._encode_scratch(256, 2)
            buffers = self._local.buffers = _ThreadBuffers(_capacity(scratch), scratch,
                                                           new_word_cache(self._word_cache_slots),
                                                           new_table_usage(self._word_cache_min_hit_percent))
        if src_len <= buffers.capacity:
            return buffers
        scratch = self._encode_scratch(src_len, 2)
        if src_len > KEEP_SCRATCH_BYTES:
            return buffers._replace(capacity=src_len, scratch=scratch)
        buffers = self._local.buffers = buffers._replace(capacity=_capacity(scratch), scratch=scratch)
        return buffers

    def _word_cache(self):
        """This thread's word cache (a table is not safe to share between threads)."""
        return self._thread_buffers(0).word_cache

    def clear_word_cache(self) -> None:
        """Forget the calling thread's cached words (to measure or test a cold start)."""
        buffers = getattr(self._local, "buffers", None)
        if buffers is not None:
            clear_word_cache(buffers.word_cache)
            clear_table_usage(buffers.usage)

    def _encode_raw(self, texts: Sequence[str], want_offsets: bool):
        if isinstance(texts, str):
            raise InvalidInput("expected a list of strings, got one string")
        encoded = [to_utf8(t) for t in texts]
        lengths = np.fromiter((len(e) for e in encoded), np.int64, len(encoded))
        text_starts = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum(lengths, out=text_starts[1:])
        data = np.frombuffer(b"".join(encoded), np.uint8) if encoded else np.zeros(0, np.uint8)
        n_runs = min(self._threads, len(encoded), 1 + len(data) // PARALLEL_MIN_BYTES)
        if n_runs <= 1:
            return self._encode_range(data, text_starts, 0, len(encoded), want_offsets)
        bounds = _chunk_bounds(text_starts, n_runs)
        jobs = [self._executor().submit(self._encode_range, data, text_starts, lo, hi, want_offsets)
                for lo, hi in zip(bounds[:-1], bounds[1:])]
        return _concat([job.result() for job in jobs])

    def _encode_range(self, data, text_starts, lo: int, hi: int, want_offsets: bool):
        """Texts lo..hi-1 as one (ids, spans, tok_start, tok_count); retries overflow."""
        if self._wordpiece is not None:
            return self._wordpiece.encode_range(data, text_starts, lo, hi, want_offsets)
        parts = []
        factor = 1
        buffers = self._thread_buffers(0)
        while True:
            ids, spans, start, count, first_left = encode_run(self._model, data, text_starts, lo, hi,
                                                              factor, want_offsets, self._hf,
                                                              buffers.word_cache, buffers.usage)
            done = first_left - lo
            parts.append((ids, spans, start[:done], count[:done]))
            if first_left == hi:
                return _concat(parts) if len(parts) > 1 else parts[0]
            lo, factor = first_left, factor * 4

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="tokenizer")
            return self._pool


class _ThreadBuffers(NamedTuple):
    """What one thread's encode() calls reuse: scratch and the word cache."""

    capacity: int  # the longest source (bytes) the scratch holds
    scratch: Scratch
    word_cache: WordCache
    usage: np.ndarray  # the word cache's hit counts (kernels/word_cache.py new_table_usage)


def _capacity(scratch: Scratch) -> int:
    """The longest source new_scratch(..., 2) needs no more room than ``scratch`` for."""
    return min(scratch.char_index.shape[0] - 1, (scratch.norm_bytes.shape[0] - 16) // 2)


def _concat(parts):
    """Join runs of (ids, spans, tok_start, tok_count), shifting starts into the joined ids."""
    if len(parts) == 1:
        return parts[0]
    shift = np.cumsum([0] + [len(p[0]) for p in parts[:-1]])
    ids = np.concatenate([p[0] for p in parts])
    spans = np.concatenate([p[1] for p in parts])
    start = np.concatenate([p[2] + k for p, k in zip(parts, shift)])
    count = np.concatenate([p[3] for p in parts])
    return ids, spans, start, count


def _unk_score(spec: TokenizerSpec) -> float:
    explicit = getattr(spec, "unk_score", None)
    if explicit is not None:
        return float(explicit)
    normal = spec.kinds == PieceKind.NORMAL
    if spec.compat == "sentencepiece":
        # sentencepiece: min over NORMAL pieces, in float32, minus kUnkPenalty (10).
        low = np.float32(spec.scores[normal].min()) if normal.any() else np.float32(0)
        return float(low - np.float32(10.0))
    return float(np.min(spec.scores) - 10.0)


def _words_chain(spec: TokenizerSpec) -> bool:
    """Whether sentencepiece mode's Viterbi falls into words at each "▁" (so that it can
    cache them, kernels/viterbi.py): no matchable piece has "▁" past its first character,
    so no piece spans a word's start, and "▁" alone is one, so no unknown piece does."""
    pieces = [p for p, kind in zip(spec.pieces, spec.kinds.tolist()) if kind in MATCHABLE_KINDS]
    return "\u2581" in pieces and not any("\u2581" in p[1:] for p in pieces)


def _token_scores(nodes: np.ndarray, vocab_size: int, unk_score: float) -> tuple[np.ndarray, float]:
    """The float32 score Viterbi adds for each token id (from the trie, so user-defined
    pieces have sentencepiece's score for them), and the largest magnitude of any score
    it adds, the unknown's included."""
    rows = nodes[:, COMPACT_TOKEN] != NO_TOKEN
    scores = nodes.view(np.float32)[rows, COMPACT_SCORE32]
    token_scores = np.zeros(vocab_size, np.float32)
    token_scores[nodes[rows, COMPACT_TOKEN]] = scores
    largest = max(float(np.abs(scores).max(initial=0.0)), abs(float(np.float32(unk_score))))
    return token_scores, largest


def _byte_ids(spec: TokenizerSpec) -> np.ndarray:
    """int32 [256]: the id of piece ``<0xXX>`` for each byte (the unknown id where the model
    lacks one, as sentencepiece's PieceToId answers); [0] without byte fallback."""
    if not spec.byte_fallback:
        return np.zeros(1, np.int32)
    ids = np.full(256, spec.unk_id, np.int32)
    for i in np.flatnonzero(spec.kinds == PieceKind.BYTE).tolist():
        byte = _BYTE_PIECE.fullmatch(spec.pieces[i])
        if byte:
            ids[int(byte.group(1), 16)] = i
    return ids


def _split_template(template: tuple[TemplateItem, ...], slots: tuple[str, ...], source: str):
    """Split a template at its sequence slots into int32 arrays of special ids."""
    parts: list[list[int]] = [[]]
    seen: list[str] = []
    for item in template:
        if isinstance(item, str):
            seen.append(item)
            parts.append([])
        else:
            parts[-1].append(int(item))
    if tuple(seen) != slots:
        raise ModelLoadError(f"{source}: template {template!r}: expected sequence slots {slots}")
    return tuple(np.asarray(p, np.int32) for p in parts)


def _split_types(template: tuple[TemplateItem, ...], type_ids: tuple[int, ...]):
    """Segment ids of a pair template as (prefix, a, middle, b, suffix): int32 arrays, one
    entry per special, one for each text's tokens. () means all zeros."""
    type_ids = type_ids or (0,) * len(template)
    parts: list[list[int]] = [[]]
    for item, type_id in zip(template, type_ids):
        if isinstance(item, str):
            parts += [[type_id], []]
        else:
            parts[-1].append(type_id)
    return tuple(np.asarray(p, np.int32) for p in parts)


# Without specials, no segment ids (pack_pairs reads prefix/middle/suffix types per special).
_NO_PAIR_TYPES = (_EMPTY, np.zeros(1, np.int32), _EMPTY, np.zeros(1, np.int32), _EMPTY)


def _chunk_bounds(text_starts: np.ndarray, n_chunks: int) -> np.ndarray:
    """Split texts into up to n_chunks contiguous runs of about equal bytes."""
    n = text_starts.shape[0] - 1
    n_chunks = max(1, min(n, n_chunks))
    targets = np.linspace(0, text_starts[-1], n_chunks + 1)[1:-1]
    inner = np.searchsorted(text_starts[1:-1], targets) + 1 if n > 1 else np.zeros(0, np.int64)
    bounds = np.unique(np.concatenate(([0], inner, [n]))).astype(np.int64)
    return bounds if n > 0 else np.zeros(1, np.int64)


def _one_sequence(ids: np.ndarray) -> EncodedBatch:
    """A batch of one untruncated sequence."""
    length = ids.shape[0]
    return EncodedBatch(ids, np.array([0, length], np.int32), truncated=np.zeros(1, np.bool_),
                        original_lengths=np.array([length], np.int32))


def _batch(out, return_offsets: bool, token_type_ids: np.ndarray | None = None) -> EncodedBatch:
    ids, cu, truncated, original, offsets = out
    return EncodedBatch(ids, cu, token_type_ids, truncated=truncated, original_lengths=original,
                        offsets=offsets if return_offsets else None)
