"""Unigram Viterbi over the word ranges of normalized bytes, on the trie's 32-byte rows
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

Each word is looked up in a per-thread ``word_cache.WordCache`` first: a hit writes
the word's cached path into best_start / best_id (so the back-track below reads it as
if Viterbi had run), a miss runs Viterbi and stores the word's back-tracked tokens in
the table. sentencepiece mode caches when its text is cut into words at each "▁"
(``normalize_sp.split_at_metaspace``): the words then chain, each starting from the
path score at its start instead of 0. A word's comparisons are float32 sums after that
score, so each one can come out differently after another prefix only if the two sides
are within their rounding error (``_rounding_bound``) of each other. A miss keeps the
narrowest comparison's gap, less twice its own rounding bound, as the word's slack; a
hit is used only where that slack exceeds twice the rounding bound after the current
prefix (then every comparison, and so the path, comes out the same), and replays the
path's float32 additions to get the score at the word's end exactly. Words with an
unknown piece on their path, or near the rebase threshold, are not cached in this mode.

A text may also skip the table (``use`` NO_TABLE: it finds too few words there to pay,
``word_cache.table_use``); a probe text counts the words the table holds after it.
"""

from __future__ import annotations

import numpy as np

from embedserve.tokenizer.kernel_cache import cached_njit
from embedserve.tokenizer.kernels.branchless import unpredictable_select
from embedserve.tokenizer.kernels.normalize_sp import utf8_len
from embedserve.tokenizer.kernels.trie import (
    COMPACT_BASE,
    COMPACT_CHECK,
    COMPACT_COLUMNS,
    COMPACT_MASK,
    COMPACT_SCORE32,
    COMPACT_TOKEN,
    NO_TOKEN,
)
from embedserve.tokenizer.kernels.word_cache import (
    MAX_WORD_BYTES,
    NO_TABLE,
    PROBE,
    TOKEN_INTS,
    claim_slot,
    count_use,
    forget,
    lookup,
    prefetch_slot,
    put_slack,
    put_token,
    put_word,
    slack_of,
    token_at,
    token_count,
)
from embedserve.tokenizer.spec import SCRATCH_TOO_SMALL

# The columns of a node as unsigned offsets from the node's own (the flat layout).
_BASE = np.uint64(COMPACT_BASE)
_CHECK = np.uint64(COMPACT_CHECK)
_TOKEN = np.uint64(COMPACT_TOKEN)
_SCORE32 = np.uint64(COMPACT_SCORE32)
_MASK = np.uint64(COMPACT_MASK)
_MASK_WORD_SHIFT = np.uint64(5)  # bit 5 of a byte picks the mask's column, bits 0-4 its bit
_MASK_BIT = np.uint64(31)
_ROW_SHIFT = np.uint64(COMPACT_COLUMNS.bit_length() - 1)  # offset = row << _ROW_SHIFT
assert 1 << _ROW_SHIFT == COMPACT_COLUMNS
# A word's cache slot starts loading this many words before it is looked up.
_PREFETCH_WORDS = 8
_REBASE_BELOW = np.float32(-1e5)
_REBASE_ABOVE = np.float32(1e5)
# A float32 result's spacing relative to its magnitude, at most: twice the rounding error of
# an addition, so the bound also covers its own second-order terms.
_ULP = 2.0 ** -23


# Inlined at the IR level into its callers: a real call costs a reference-count round
# trip on each of its array arguments.
@cached_njit(nogil=True, inline="always")
def viterbi_into(nodes, nodes_f32, score64, token_scores, max_abs_score, text, words, n_words, use_f64, unk_id,
                 unk_score, best_score, best_start, best_id, out_ids, out_spans, cache, use, usage):
    """The best segmentation of each range text[words[w, 0]:words[w, 1]] (w < n_words),
    written in order to out_ids / out_spans (``out_spans[t]``: the token's [start, end)
    in ``text``).

    ``nodes``/``nodes_f32``/``score64``: ``trie.compact_nodes`` as one flat array (and
    its float32 view), and hf mode's float64 scores when they are not all float32, else
    empty.
    ``token_scores``: sentencepiece mode's float32 score per token id, and
    ``max_abs_score`` the largest magnitude of a score (the unknown's included), for its
    word cache. ``use_f64`` (hf mode) is meant to be a compile-time constant (``encode.encode_raw``
    derives it from a type), so that each mode's loop has none of the other's branches.
    ``best_*`` scratch needs an entry past the last word's end and one spare. Returns the
    token count, or SCRATCH_TOO_SMALL if ``out_ids`` or ``best_*`` is too small. ``use``: how this text uses the
    table ``cache`` (``word_cache.table_use``; a probe counts its words in ``usage``).
    """
    # The spare last entry of the best_* scratch, where a losing candidate goes: past
    # every word's end, or the scratch is too small.
    spare = np.uint64(best_score.shape[0] - 1)
    # Words in order, none overlapping the one before (as the normalizers write them):
    # then every entry is set to "no path yet" (-inf) once, here, not per word (a short
    # loop per word: a mispredicted exit each, on hf mode's hundreds of words).
    in_order = True
    for w in range(n_words):
        if words[w, 1] >= best_score.shape[0] - 1:
            return SCRATCH_TOO_SMALL
        if w > 0 and words[w, 0] < words[w - 1, 1]:
            in_order = False
    if in_order and n_words > 0:
        for i in range(words[0, 0], words[n_words - 1, 1] + 1):
            best_score[i] = -np.inf
    unk32 = np.float32(unk_score)
    # Unsigned indices: Numba then skips the negative-index wraparound on every access
    # (about a third of the time of this loop).
    one = np.uint64(1)
    caching = use != NO_TABLE
    probe = use == PROBE
    chained = not use_f64  # sentencepiece mode: a word's paths go on from the score at its start
    records_f32 = cache.records.view(np.float32)
    wide_scores = score64.shape[0] > 0
    # The hashes of the words whose slots are loading: word w's at w % _PREFETCH_WORDS.
    hashes = np.zeros(_PREFETCH_WORDS, np.uint64)
    if caching:
        for w in range(min(_PREFETCH_WORDS, n_words)):
            hashes[w] = prefetch_slot(cache, text, words[w, 0], words[w, 1])
    for w in range(n_words):
        h = hashes[w % _PREFETCH_WORDS]
        if caching and w + _PREFETCH_WORDS < n_words:
            ahead = w + _PREFETCH_WORDS
            hashes[ahead % _PREFETCH_WORDS] = prefetch_slot(cache, text, words[ahead, 0], words[ahead, 1])
        start = words[w, 0]
        end = words[w, 1]
        if start >= end:
            continue
        if not chained or w == 0:
            # hf mode: a word's paths start at 0. Where words touch, best_score[start]
            # held the previous word's total; that word's back-track reads only
            # best_start/best_id.
            best_score[start] = 0.0
        cacheable = caching and end - start <= MAX_WORD_BYTES
        if cacheable:
            slot = lookup(cache, text, start, end, h)
            if slot >= 0 and (not chained or
                              _reusable(records_f32, slot, best_score[start], end - start, max_abs_score)):
                if probe:
                    count_use(usage, end - start, end - start)
                # The cached path, where the back-track reads it.
                prev = start
                score = np.float32(best_score[start])
                for t in range(token_count(cache, slot)):
                    tid, rel_end = token_at(cache, slot, t)
                    e = start + rel_end
                    best_start[e] = np.int32(prev)
                    best_id[e] = tid
                    prev = e
                    if chained:
                        score = score + token_scores[tid]  # the float32 additions Viterbi made
                if chained:
                    best_score[end] = np.float64(score)
                continue
            if slot >= 0:
                # sentencepiece mode, a record this prefix cannot use: Viterbi's result
                # replaces it (or, not cacheable after this prefix, it goes).
                forget(cache, slot)
        track = chained and cacheable  # keep the narrowest comparison's gap, for the slack
        narrowest = np.inf
        u_end = np.uint64(end)
        if not in_order:
            for i in range(np.uint64(start) + one, u_end + one):
                best_score[i] = -np.inf  # every real candidate beats it: "no path yet"
        pos = np.uint64(start)
        reached = pos  # at least as far as any candidate has set so far (the rebase's range)
        while pos < u_end:
            here = best_score[pos]
            here32 = np.float32(here)
            if not use_f64 and (here32 < _REBASE_BELOW or here32 > _REBASE_ABOVE):
                # sentencepiece 0.2.3 keeps float32 path scores near zero: once the score
                # at the current start leaves +-1e5 it subtracts it (in float32) from every
                # set entry from here to the furthest one; the current entry becomes 0.
                # (Entries in that range no candidate set are -inf and stay so.)
                for i in range(pos, reached + one):
                    best_score[i] = np.float64(np.float32(best_score[i]) - here32)
                here32 = np.float32(0.0)
            mblen = np.uint64(min(utf8_len(text[pos]), end - np.int64(pos)))
            has_single = False
            node = np.uint64(0)
            k = pos
            while k < u_end:
                c = np.uint64(text[k])
                # No child with this byte's low six bits: the walk ends on this row's mask
                # (trie.py), without loading the row of a child that is not there.
                mask = np.uint64(np.uint32(nodes[node + _MASK + ((c >> _MASK_WORD_SHIFT) & one)]))
                if (mask >> (c & _MASK_BIT)) & one == 0:
                    break
                child = np.uint64(np.int64(nodes[node + _BASE])) + (c << _ROW_SHIFT)
                # Unsigned: a free row's check (-1) never equals a node's offset.
                if np.uint64(np.int64(nodes[child + _CHECK])) != node:
                    break
                node = child
                k += one
                # Every node is a candidate: one with no token scores -inf and never wins.
                # Which one wins is as good as random on unseen text, so the update is
                # branch-free (branchless.py): a losing candidate is written to the
                # scratch's spare last entry instead of k.
                tid = nodes[node + _TOKEN]
                if not use_f64:
                    cand = np.float64(here32 + nodes_f32[node + _SCORE32])  # a float32 add
                elif wide_scores:
                    cand = here + score64[node >> _ROW_SHIFT]
                else:  # the float64 score is this float32 exactly
                    cand = here + np.float64(nodes_f32[node + _SCORE32])
                if track:
                    # A node with no token gives inf or NaN here, never below narrowest.
                    gap = abs(cand - best_score[k])
                    narrowest = unpredictable_select(gap < narrowest, gap, narrowest)
                at = unpredictable_select(cand > best_score[k], k, spare)
                best_score[at] = cand
                best_start[at] = np.int32(pos)
                best_id[at] = tid
                has_single = has_single | ((k - pos == mblen) & (tid != NO_TOKEN))
            reached = max(reached, k)
            if not has_single:
                k = pos + mblen
                reached = max(reached, k)
                if use_f64:
                    cand = here + unk_score
                else:
                    cand = np.float64(here32 + unk32)
                if track:
                    narrowest = min(narrowest, abs(cand - best_score[k]))
                if cand > best_score[k]:
                    best_score[k] = cand
                    best_start[k] = np.int32(pos)
                    best_id[k] = unk_id
            pos += mblen
        if not cacheable:
            continue
        if not chained:
            if _store(cache, text, start, end, h, best_start, best_id, unk_id) >= 0 and probe:
                count_use(usage, end - start, 0)
            continue
        prefix = best_score[start]
        slack = narrowest - 2.0 * _rounding_bound(prefix, end - start, max_abs_score)
        if slack > 0.0 and _clear_of_rebase(prefix, end - start, max_abs_score) \
                and not _has_unknown(best_start, best_id, start, end, unk_id):
            slot = _store(cache, text, start, end, h, best_start, best_id, unk_id)
            if slot >= 0:
                if probe:
                    count_use(usage, end - start, 0)
                put_slack(records_f32, slot, np.float32(slack * (1.0 - 2.0 ** -20)))  # rounded down
    # Back-track each word, fusing runs of unknowns inside it, filling out_ids from its
    # end, then move the tokens to its start: one pass over the path (counting the
    # tokens first cost hf mode a second pass, and a mispredicted loop exit per word).
    room = min(out_ids.shape[0], out_spans.shape[0])
    t = room
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
                if t == 0:
                    return SCRATCH_TOO_SMALL
                t -= 1
                out_ids[t] = tid
                out_spans[t, 0] = s
                out_spans[t, 1] = j
            prev_unk = is_unk
            j = s
    count = room - t
    for q in range(count):
        out_ids[q] = out_ids[t + q]
        out_spans[q, 0] = out_spans[t + q, 0]
        out_spans[q, 1] = out_spans[t + q, 1]
    return count


@cached_njit(nogil=True, inline="always")
def _rounding_bound(prefix, n_bytes, max_abs_score):
    """How far a float32 path score inside a word of ``n_bytes`` after the path score
    ``prefix`` can be from the exact sum, with room to spare: at most ``n_bytes``
    additions (each piece is at least one byte), each off by at most half an ulp of a
    value no larger in magnitude than |prefix| + n_bytes * max_abs_score (counted here
    as a whole ulp)."""
    return n_bytes * (abs(prefix) + n_bytes * max_abs_score) * _ULP


@cached_njit(nogil=True, inline="always")
def _clear_of_rebase(prefix, n_bytes, max_abs_score):
    """No path score inside the word can leave [-1e5, 1e5] (so no rebase happens in it)."""
    return abs(prefix) + n_bytes * max_abs_score + 1.0 < 1e5


@cached_njit(nogil=True, inline="always")
def _reusable(records_f32, slot, prefix, n_bytes, max_abs_score):
    """Whether the cached path of the word in ``slot`` is the path after ``prefix``: its
    slack is above twice the rounding bound there, so no comparison can come out
    differently, and no rebase can happen inside the word."""
    return slack_of(records_f32, slot) > 2.0 * _rounding_bound(prefix, n_bytes, max_abs_score) \
        and _clear_of_rebase(prefix, n_bytes, max_abs_score)


@cached_njit(nogil=True, inline="always")
def _has_unknown(best_start, best_id, start, end, unk_id):
    """Whether the best path of text[start:end] has an unknown piece (sentencepiece mode
    does not cache such a word: a fused unknown stands for several additions)."""
    j = end
    while j > start:
        if best_id[j] == unk_id:
            return True
        j = best_start[j]
    return False


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
    """Put word text[start:end]'s back-tracked tokens (unknown runs fused) in a slot of
    its set; returns the slot, or -1 for a path of more tokens than a record holds
    (nothing written)."""
    count = _fused_token_count(best_start, best_id, start, end, unk_id)
    if count > TOKEN_INTS:
        return -1
    slot = claim_slot(cache, h)
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
    put_word(cache, slot, text, start, end, h, count)
    return slot
