"""Unigram Viterbi over the word ranges of normalized bytes, on the trie's 16-byte rows
(``trie.compact_nodes``).

The algorithm is the "optimized" encoder both references use (sentencepiece's
``Model::EncodeOptimized``, tokenizers' ``Unigram::encode_optimized``): walk the
string one UTF-8 character at a time; from each start position follow the trie byte
by byte, and for every piece ending at ``end`` keep the best path ending there,
replacing it only on a strictly greater score (so on ties the earlier start, i.e.
the longer piece, wins). A start position with no one-character piece gets an
unknown node of score ``unk_score`` (min normal score - 10). Consecutive unknowns in
the result are fused into one unknown token, as both references do.

Each word range is its own Viterbi (hf mode: one per pre-tokenized word, scores from
0; sentencepiece mode: one range, the whole string). All words run in one call and one
loop: a call per word cost hf mode a quarter of its time at 514 tokens.

Scores are float64 in hf mode. In sentencepiece mode path scores are float32 (kept
exactly in the float64 scratch) and every addition is a float32 addition, as in the
0.2.3 wheel's compiled EncodeOptimized (read from its machine code; older sources add
pieces in double and do not rebase). It also rebases: when the score at
the current start position leaves [-1e5, 1e5] it subtracts that score, in float32,
from every entry set so far at or after it. Without the rebase, float32 rounding at
~1e5 (steps of 0.016) flips near-ties on inputs of ~16k tokens and more.

hf mode looks each word up in a per-thread ``word_cache.WordCache`` first: a hit
writes the word's cached path into best_start / best_id (so the back-track below reads
it as if Viterbi had run), a miss runs Viterbi and stores the word's back-tracked
tokens in the table.
"""

from __future__ import annotations

import numpy as np

from embedserve.tokenizer.kernel_cache import cached_njit
from embedserve.tokenizer.kernels.normalize_sp import utf8_len
from embedserve.tokenizer.kernels.word_cache import (MAX_WORD_BYTES, lookup, prefetch_slot, put_token, put_word,
                                                     token_at, token_count, word_hash)
from embedserve.tokenizer.kernels.trie import COMPACT_BASE, COMPACT_CHECK, COMPACT_SCORE32, COMPACT_TOKEN, NO_TOKEN
from embedserve.tokenizer.spec import SCRATCH_TOO_SMALL

# hf mode starts loading a word's cache slot this many words before it is looked up.
_PREFETCH_WORDS = 8
_REBASE_BELOW = np.float32(-1e5)
_REBASE_ABOVE = np.float32(1e5)


# Inlined at the IR level into its callers: a real call costs a reference-count round
# trip on each of its array arguments.
@cached_njit(nogil=True, inline="always")
def viterbi_into(nodes, nodes_f32, score64, text, words, n_words, use_f64, unk_id, unk_score,
                 best_score, best_start, best_id, out_ids, out_spans, cache):
    """The best segmentation of each range text[words[w, 0]:words[w, 1]] (w < n_words),
    written in order to out_ids / out_spans (``out_spans[t]``: the token's [start, end)
    in ``text``).

    ``nodes``/``nodes_f32``/``score64``: ``trie.compact_nodes`` (the float32 view of the
    same rows, and hf mode's float64 scores when they are not all float32, else empty).
    ``use_f64`` (hf mode) is meant to be a compile-time constant (``encode.encode_raw``
    derives it from a type), so that each mode's loop has none of the other's branches.
    ``best_*`` scratch needs len(text) + 1 entries. Returns the token count, or
    SCRATCH_TOO_SMALL if ``out_ids`` is too small.
    """
    unk32 = np.float32(unk_score)
    # Unsigned indices: Numba then skips the negative-index wraparound on every access
    # (about a third of the time of this loop).
    one = np.uint64(1)
    caching = use_f64 and cache.records.shape[0] > 0
    wide_scores = score64.shape[0] > 0
    if caching:
        for w in range(min(_PREFETCH_WORDS, n_words)):
            prefetch_slot(cache, text, words[w, 0], words[w, 1])
    for w in range(n_words):
        if caching and w + _PREFETCH_WORDS < n_words:
            prefetch_slot(cache, text, words[w + _PREFETCH_WORDS, 0], words[w + _PREFETCH_WORDS, 1])
        start = words[w, 0]
        end = words[w, 1]
        if start >= end:
            continue
        cacheable = caching and end - start <= MAX_WORD_BYTES
        h = np.uint64(0)
        if cacheable:
            h = word_hash(text, start, end)
            slot = lookup(cache, text, start, end, h)
            if slot >= 0:  # the cached path, where the back-track reads it
                prev = start
                for t in range(token_count(cache, slot)):
                    tid, rel_end = token_at(cache, slot, t)
                    e = start + rel_end
                    best_start[e] = np.int32(prev)
                    best_id[e] = tid
                    prev = e
                continue
        u_end = np.uint64(end)
        # A word's paths start at 0. Where words touch, best_score[start] held the
        # previous word's total; that word's back-track reads only best_start/best_id.
        best_score[start] = 0.0
        for i in range(np.uint64(start) + one, u_end + one):
            best_score[i] = -np.inf  # every real candidate beats it: "no path yet"
        pos = np.uint64(start)
        reached = pos  # the furthest end any candidate has set so far
        while pos < u_end:
            here = best_score[pos]
            here32 = np.float32(here)
            if not use_f64 and (here32 < _REBASE_BELOW or here32 > _REBASE_ABOVE):
                # sentencepiece 0.2.3 keeps float32 path scores near zero: once the score
                # at the current start leaves +-1e5 it subtracts it (in float32) from every
                # set entry from here to the furthest one; the current entry becomes 0.
                for i in range(pos, reached + one):
                    best_score[i] = np.float64(np.float32(best_score[i]) - here32)
                here32 = np.float32(0.0)
            mblen = np.uint64(min(utf8_len(text[pos]), end - np.int64(pos)))
            has_single = False
            node = np.uint64(0)
            k = pos
            while k < u_end:
                c = np.uint64(text[k])
                child = np.uint64(nodes[node, COMPACT_BASE]) + c
                # Unsigned: a free row's check (-1) never equals a node's index.
                if np.uint64(np.int64(nodes[child, COMPACT_CHECK])) != node:
                    break
                node = child
                k += one
                tid = nodes[node, COMPACT_TOKEN]
                if tid != NO_TOKEN:
                    if k > reached:
                        reached = k
                    if not use_f64:
                        cand = np.float64(here32 + nodes_f32[node, COMPACT_SCORE32])  # a float32 add
                    elif wide_scores:
                        cand = here + score64[node]
                    else:  # the float64 score is this float32 exactly
                        cand = here + np.float64(nodes_f32[node, COMPACT_SCORE32])
                    if cand > best_score[k]:
                        best_score[k] = cand
                        best_start[k] = np.int32(pos)
                        best_id[k] = tid
                    if k - pos == mblen:
                        has_single = True
            if not has_single:
                k = pos + mblen
                if k > reached:
                    reached = k
                if use_f64:
                    cand = here + unk_score
                else:
                    cand = np.float64(here32 + unk32)
                if cand > best_score[k]:
                    best_score[k] = cand
                    best_start[k] = np.int32(pos)
                    best_id[k] = unk_id
            pos += mblen
        if cacheable:
            _store(cache, text, start, end, h, best_start, best_id, unk_id)
    # Back-track each word, fusing runs of unknowns inside it: count, then fill from the right.
    count = 0
    for w in range(n_words):
        count += _fused_token_count(best_start, best_id, words[w, 0], words[w, 1], unk_id)
    if count > out_ids.shape[0]:
        return SCRATCH_TOO_SMALL
    t = count
    for w in range(n_words - 1, -1, -1):
        start = words[w, 0]
        j = words[w, 1]
        prev_unk = False
        while j > start:
            tid = best_id[j]
            s = best_start[j]
            is_unk = tid == unk_id
            if is_unk and prev_unk:
                out_spans[t, 0] = s  # extend the fused unknown to the left
            else:
                t -= 1
                out_ids[t] = tid
                out_spans[t, 0] = s
                out_spans[t, 1] = j
            prev_unk = is_unk
            j = s
    return count


@cached_njit(nogil=True, inline="always")
def _fused_token_count(best_start, best_id, start, end, unk_id):
    """How many tokens the best path of text[start:end] back-tracks to, each run of
    unknown pieces counted once (they are fused into one token)."""
    count = 0
    j = end
    prev_unk = False
    while j > start:
        is_unk = best_id[j] == unk_id
        if not (is_unk and prev_unk):
            count += 1
        prev_unk = is_unk
        j = best_start[j]
    return count


@cached_njit(nogil=True, inline="always")
def _store(cache, text, start, end, h, best_start, best_id, unk_id):
    """Put word text[start:end]'s back-tracked tokens (unknown runs fused) in its slot,
    overwriting whatever word was there."""
    slot = np.int64(h & np.uint64(cache.records.shape[0] - 1))
    count = _fused_token_count(best_start, best_id, start, end, unk_id)
    t = count
    j = end
    prev_unk = False
    while j > start:
        is_unk = best_id[j] == unk_id
        if not (is_unk and prev_unk):
            t -= 1
            put_token(cache, slot, t, best_id[j], j - start)  # a fused unknown keeps its right end
        prev_unk = is_unk
        j = best_start[j]
    put_word(cache, slot, text, start, end, count)
