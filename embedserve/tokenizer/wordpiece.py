"""The WordPiece side of the Tokenizer: BERT-family vocabularies, encoded natively.

``WordPieceEncoder`` is what ``Tokenizer`` delegates to when its spec carries
``wordpiece`` parameters (spec.py): it builds (or loads from the cache) the trie of the
vocabulary and the BERT normalizer tables once, and runs kernels/wordpiece.py for one
text (with caller-owned, per-thread scratch) or a run of texts. Templates, truncation,
threads and batching stay in tokenizer.py and templates.py, shared with Unigram.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import numpy as np

from embedserve.tokenizer.kernels import wordpiece as kernels
from embedserve.tokenizer.kernels.encode import compiled_for
from embedserve.tokenizer.kernels.normalize_bert import bert_tables, max_cps_per_char
from embedserve.tokenizer.kernels.trie import load_or_build_trie, node_views
from embedserve.tokenizer.spec import TokenizerSpec

# A thread keeps its scratch for inputs up to this many bytes (as Unigram's does).
KEEP_SCRATCH_BYTES = 1 << 17
_EMPTY = np.zeros(0, np.int32)


class WordPieceEncoder:
    """Raw WordPiece ids (no specials) for one text or a run of texts."""

    def __init__(self, spec: TokenizerSpec, cache_dir: Path | None) -> None:
        params = spec.wordpiece
        if params is None:
            raise ValueError(f"{spec.source}: not a WordPiece spec")
        trie = load_or_build_trie(spec, cache_dir)
        self._trie = trie  # the node views below are views of it
        nodes_u64, nodes_i32, _, _ = node_views(trie)
        self._expansion = max_cps_per_char(params.normalizer)
        self.model = kernels.WordPieceModel(
            bert_tables(params.normalizer), nodes_u64, nodes_i32,
            _node_of(nodes_u64, nodes_i32, params.continuing_subword_prefix), int(spec.unk_id),
            int(params.max_input_chars_per_word), self._expansion)
        self._local = threading.local()

    @functools.cached_property
    def _encode_one(self):
        """encode_one's kernel, bound on the first call (see Tokenizer._encode_one)."""
        return compiled_for(kernels.encode_with_template, self.model, np.frombuffer(b"", np.uint8),
                            kernels.new_scratch(0, self._expansion), _EMPTY, _EMPTY)

    def encode_one(self, src: np.ndarray, prefix: np.ndarray, suffix: np.ndarray) -> np.ndarray:
        return self._encode_one(self.model, src, self._scratch(len(src)), prefix, suffix)

    def encode_range(self, data: np.ndarray, text_starts: np.ndarray, lo: int, hi: int, want_offsets: bool):
        """Texts lo..hi-1 as (ids, spans, tok_start, tok_count)."""
        return kernels.encode_run(self.model, data, text_starts, lo, hi, want_offsets)

    def _scratch(self, src_len: int) -> kernels.WordPieceScratch:
        if src_len > KEEP_SCRATCH_BYTES:
            return kernels.new_scratch(src_len, self._expansion)
        scratch = getattr(self._local, "scratch", None)
        if scratch is None or scratch.cps.shape[0] < src_len * self._expansion + 16:
            scratch = self._local.scratch = kernels.new_scratch(max(src_len, 256), self._expansion)
        return scratch


def _node_of(nodes_u64: np.ndarray, nodes_i32: np.ndarray, prefix: str) -> int:
    """The trie node spelled by ``prefix`` (the root for ""), or NO_NODE."""
    node = 0
    for cp in map(ord, prefix):
        node = kernels._step(nodes_u64, nodes_i32, node, cp)
        if node == kernels.NO_NODE:
            return kernels.NO_NODE
    return node

