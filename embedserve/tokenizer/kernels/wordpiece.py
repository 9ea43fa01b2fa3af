"""WordPiece encode kernels: BERT normalize + pre-tokenize, then greedy longest match.

The model step is tokenizers' ``WordPiece::tokenize`` per pre-tokenized word: a word
of more than ``max_input_chars_per_word`` characters is one unknown token; otherwise,
from the word's start, take the longest vocabulary entry that is a prefix of the rest
(spelled with the continuation prefix ``##`` after the first piece), and repeat; if
at some point no entry matches, the whole word becomes one unknown token. The
longest match is one walk down the vocabulary trie (trie.py, the same 64-byte nodes
as Unigram's): from the root for a word's first piece, from the node of ``##`` for
the others, remembering the last node that ends a piece.

A token's span is [start of its first character, end of its last] in characters of
the input, from normalize_bert's alignments (tokenizers' offsets). Output is raw ids
(no specials); templates.py adds those. Scratch is caller-owned for one text
(``encode_with_template``) or allocated once per run of texts (``encode_run``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from embedserve.tokenizer.kernel_cache import cached_njit
from embedserve.tokenizer.kernels.normalize_bert import BertTables, normalize_bert_into
from embedserve.tokenizer.kernels.trie import NO_TOKEN, SLOT_BASE, SLOT_CHILDREN, SLOT_TOKEN

_CHILDREN = np.uint64(SLOT_CHILDREN)
NO_NODE = -1  # the continuation prefix is not in the vocabulary: only whole-word pieces


class WordPieceModel(NamedTuple):
    tables: BertTables
    nodes_u64: np.ndarray  # trie.node_views(trie)[0]
    nodes_i32: np.ndarray  # trie.node_views(trie)[1]
    continuation_node: int  # the trie node reached by "##", or NO_NODE
    unk_id: int
    max_chars: int  # max_input_chars_per_word
    expansion: int  # the most code points one input character can become


class WordPieceScratch(NamedTuple):
    cps: np.ndarray  # int32 [N]: normalized code points
    align: np.ndarray  # int64 [N, 2]: their source character ranges
    words: np.ndarray  # int64 [N, 2]
    run_cps: np.ndarray  # int64 [N]: combining marks held for NFD reordering
    run_change: np.ndarray  # int64 [N]
    run_ccc: np.ndarray  # int64 [N]
    run_align: np.ndarray  # int64 [N, 2]
    ids: np.ndarray  # int32 [N]
    spans: np.ndarray  # int32 [N, 2]


@cached_njit(nogil=True)
def new_scratch(n_chars: int, expansion: int) -> WordPieceScratch:
    """Room for a text of up to ``n_chars`` characters (bytes are an upper bound)."""
    n = n_chars * expansion + 16
    return WordPieceScratch(np.empty(n, np.int32), np.empty((n, 2), np.int64), np.empty((n, 2), np.int64),
                            np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64),
                            np.empty((n, 2), np.int64), np.empty(n, np.int32), np.empty((n, 2), np.int32))


@cached_njit(nogil=True, inline="always")
def _child(nodes_u64, nodes_i32, node, b):
    """The child of ``node`` for byte ``b``, or NO_NODE."""
    c = np.uint64(b)
    if (nodes_u64[node, _CHILDREN + (c >> np.uint64(6))] >> (c & np.uint64(63))) & np.uint64(1) == 0:
        return NO_NODE
    return np.int64(nodes_i32[node, SLOT_BASE]) + np.int64(b)


@cached_njit(nogil=True, inline="always")
def _step(nodes_u64, nodes_i32, node, cp):
    """The trie node after the UTF-8 bytes of ``cp`` from ``node``, or NO_NODE."""
    if cp < 0x80:
        return _child(nodes_u64, nodes_i32, node, cp)
    if cp < 0x800:
        node = _child(nodes_u64, nodes_i32, node, 0xC0 | (cp >> 6))
    else:
        if cp < 0x10000:
            node = _child(nodes_u64, nodes_i32, node, 0xE0 | (cp >> 12))
        else:
            node = _child(nodes_u64, nodes_i32, node, 0xF0 | (cp >> 18))
            if node != NO_NODE:
                node = _child(nodes_u64, nodes_i32, node, 0x80 | ((cp >> 12) & 0x3F))
        if node != NO_NODE:
            node = _child(nodes_u64, nodes_i32, node, 0x80 | ((cp >> 6) & 0x3F))
    if node == NO_NODE:
        return NO_NODE
    return _child(nodes_u64, nodes_i32, node, 0x80 | (cp & 0x3F))


@cached_njit(nogil=True, inline="always")
def wordpiece_into(model, cps, align, words, n_words, out_ids, out_spans):
    """Greedy longest-match-first over each word; returns the token count."""
    t = 0
    for w in range(n_words):
        ws, we = words[w, 0], words[w, 1]
        first = t
        bad = we - ws > model.max_chars
        i = ws
        while not bad and i < we:
            node = 0 if i == ws else model.continuation_node
            best_end, best_id = -1, -1
            j = i
            while j < we and node != NO_NODE:
                node = _step(model.nodes_u64, model.nodes_i32, node, cps[j])
                if node == NO_NODE:
                    break
                j += 1
                tid = model.nodes_i32[node, SLOT_TOKEN]
                if tid != NO_TOKEN:
                    best_end, best_id = j, tid
            if best_end < 0:
                bad = True
                break
            out_ids[t] = best_id
            out_spans[t, 0] = align[i, 0]
            out_spans[t, 1] = align[best_end - 1, 1]
            t += 1
            i = best_end
        if bad:  # the whole word is one unknown token
            t = first
            out_ids[t] = model.unk_id
            out_spans[t, 0] = align[ws, 0]
            out_spans[t, 1] = align[we - 1, 1]
            t += 1
    return t


@cached_njit(nogil=True)
def encode_raw(model, src, scratch):
    """Tokens of one text into scratch.ids / scratch.spans; returns the count."""
    n_cps, n_words = normalize_bert_into(src, model.tables, scratch.cps, scratch.align, scratch.words,
                                         scratch.run_cps, scratch.run_change, scratch.run_ccc, scratch.run_align)
    return wordpiece_into(model, scratch.cps, scratch.align, scratch.words, n_words, scratch.ids, scratch.spans)


@cached_njit(nogil=True)
def encode_with_template(model, src, scratch, prefix, suffix):
    """One text, specials around it, as a fresh int32 array (scratch sized for src)."""
    n = encode_raw(model, src, scratch)
    out = np.empty(prefix.shape[0] + n + suffix.shape[0], np.int32)
    out[:prefix.shape[0]] = prefix
    out[prefix.shape[0]:prefix.shape[0] + n] = scratch.ids[:n]
    out[prefix.shape[0] + n:] = suffix
    return out


@cached_njit(nogil=True)
def encode_run(model, data, text_starts, lo, hi, want_offsets):
    """Encode texts lo..hi-1 (text i is data[text_starts[i]:text_starts[i+1]]).

    Returns (ids, spans, tok_start, tok_count): text i's tokens are
    ids[tok_start[i-lo] : + tok_count[i-lo]]. The output grows as needed.
    """
    cap = text_starts[hi] - text_starts[lo] + 8 * (hi - lo) + 16
    ids = np.empty(cap, np.int32)
    spans = np.empty((cap if want_offsets else 0, 2), np.int32)
    tok_start = np.zeros(hi - lo, np.int64)
    tok_count = np.zeros(hi - lo, np.int64)
    longest = 0
    for i in range(lo, hi):
        longest = max(longest, text_starts[i + 1] - text_starts[i])
    scratch = new_scratch(longest, model.expansion)
    w = 0
    for i in range(lo, hi):
        n = encode_raw(model, data[text_starts[i]:text_starts[i + 1]], scratch)
        if w + n > cap:
            cap = max(2 * cap, w + n)
            grown = np.empty(cap, np.int32)
            grown[:w] = ids[:w]
            ids = grown
            if want_offsets:
                grown_spans = np.empty((cap, 2), np.int32)
                grown_spans[:w] = spans[:w]
                spans = grown_spans
        ids[w:w + n] = scratch.ids[:n]
        if want_offsets:
            spans[w:w + n] = scratch.spans[:n]
        tok_start[i - lo] = w
        tok_count[i - lo] = n
        w += n
    return ids, spans, tok_start, tok_count
