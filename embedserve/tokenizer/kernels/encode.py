"""The encode kernels: normalize -> Viterbi over the words, for one text or a run of texts.

``Model`` bundles what a kernel needs from a loaded tokenizer (charsmap tables,
normalizer parameters, the trie, unknown-token handling) so it passes to Numba as one
tuple. Which normalizer runs is decided by the type of the ``hf`` argument: ``None``
selects ``normalize_sp_into``, an array (the HF parameters) selects ``normalize_hf_into``.
``normalize`` makes that choice while a kernel is typed, so each mode types and
compiles only its own normalizer (a jitted function passed as an argument instead
would make Numba's on-disk cache miss on every start).

Output is "raw": token ids without specials, plus, when asked, each token's
[start, end) in characters of the input. With byte fallback (``model.byte_ids`` holds
256 ids) every unknown token becomes one ``<0xXX>`` piece per byte of its normalized
text, as sentencepiece's ``SentencePieceProcessor::Encode`` does after the model; each
byte piece spans the character it is a byte of. Templates and truncation are ``templates.py``'s
job. Scratch is caller-owned (single text) or allocated once per call (a run of
texts); nothing is allocated per token or per match. ``cache`` is the calling thread's
``word_cache.WordCache`` (an empty one disables it; sentencepiece mode also needs the
Model's ``token_scores``), and ``usage`` its hit counts (``word_cache.new_table_usage``:
where the table finds too few words, texts skip it). Parallelism over texts is the
caller's (threads: every kernel here releases the GIL).

A cached kernel here embeds the normalizers and Viterbi it calls; its on-disk cache is
keyed by the source of the whole package (kernel_cache.py), so an edit to any of them
recompiles it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba.core import types
from numba.extending import overload

from embedserve.tokenizer.kernel_cache import cached_njit
from embedserve.tokenizer.kernels.normalize_hf import normalize_hf_into
from embedserve.tokenizer.kernels.normalize_sp import normalize_sp_into, split_at_metaspace
from embedserve.tokenizer.kernels.origins import origin_end, origin_start
from embedserve.tokenizer.kernels.viterbi import viterbi_into
from embedserve.tokenizer.kernels.word_cache import NO_TABLE, table_use
from embedserve.tokenizer.spec import SCRATCH_TOO_SMALL


class Model(NamedTuple):
    units: np.ndarray  # charsmap trie, uint32
    strings: np.ndarray  # charsmap replacement strings, uint8
    params: np.ndarray  # normalizer parameters, int64
    nodes: np.ndarray  # trie.compact_nodes as one flat int32 array [M * 4]
    nodes_f32: np.ndarray  # the same array viewed as float32 (the score column)
    score64: np.ndarray  # float64 [M], hf mode's scores where not all are float32; else empty
    token_scores: np.ndarray  # float32 [V]: sentencepiece mode's score per id when it caches words; else empty
    max_abs_score: float  # the largest |score| of a piece or the unknown (sentencepiece mode's cache)
    unk_id: int
    unk_score: float
    byte_ids: np.ndarray  # int32 [256]: id of <0xXX> per byte with byte fallback, else [0]


class Scratch(NamedTuple):
    norm_bytes: np.ndarray  # uint8 [N]
    norm_origin: np.ndarray  # int32 [N, 2]
    words: np.ndarray  # int32 [W, 2]
    best_score: np.ndarray  # float64 [N + 1]
    best_start: np.ndarray  # int32 [N + 1]
    best_id: np.ndarray  # int32 [N + 1]
    char_index: np.ndarray  # int32 [S + 1]: character index of each source byte
    ids: np.ndarray  # int32 [N]
    spans: np.ndarray  # int32 [N, 2]


@cached_njit(nogil=True)
def new_scratch(src_len: int, factor: int) -> Scratch:
    n = src_len * factor + 16
    return Scratch(np.empty(n, np.uint8), np.empty((n, 2), np.int32), np.empty((n // 2 + 8, 2), np.int32),
                   np.empty(n + 1, np.float64), np.empty(n + 1, np.int32), np.empty(n + 1, np.int32),
                   np.empty(src_len + 1, np.int32), np.empty(n, np.int32), np.empty((n, 2), np.int32))


def normalize(model, src, scratch, hf, want_offsets):
    """Normalize + pre-tokenize ``src`` into scratch: (bytes written, words), or
    SCRATCH_TOO_SMALL bytes; ``want_offsets``: the offsets will be reported (hf mode's
    alignment of deletions, which ids never read, runs only then). Kernels only:
    ``_normalize_for`` gives its code."""
    raise NotImplementedError("normalize is typed inside kernels only")


@overload(normalize)
def _normalize_for(model, src, scratch, hf, want_offsets):
    """The normalizer for the type of ``hf``, chosen while the calling kernel is typed.

    A branch on ``hf is None`` in the kernel would do the same for ``None`` only: Numba
    prunes it before typing when ``hf`` is None, but with the HF parameters (an array)
    it types both branches and compiles SentencePiece's normalizer as well.
    """
    if isinstance(hf, types.NoneType):  # type: ignore[attr-defined]  # numba's stubs lack it
        def sentencepiece(model, src, scratch, hf, want_offsets):
            return normalize_sp_into(src, model.units, model.strings, model.params,
                                     scratch.norm_bytes, scratch.norm_origin, scratch.words)
        return sentencepiece

    def huggingface(model, src, scratch, hf, want_offsets):
        return normalize_hf_into(src, model.units, model.strings, hf,
                                 scratch.norm_bytes, scratch.norm_origin, scratch.words, want_offsets)
    return huggingface


# Inlined into the entry points: a real call costs a reference-count round trip on each
# array of the Model and Scratch tuples, a fixed cost that a short text notices.
@cached_njit(nogil=True, inline="always")
def encode_raw(model, src, scratch, want_offsets, hf, cache, usage):
    """Tokens of one text into scratch.ids (and scratch.spans as character offsets).

    Returns the token count, or SCRATCH_TOO_SMALL.
    """
    n_bytes, n_words = normalize(model, src, scratch, hf, want_offsets)
    if n_bytes == SCRATCH_TOO_SMALL:
        return SCRATCH_TOO_SMALL
    use = table_use(cache, usage, src)  # the table, or none for text it does not pay on
    if hf is None and model.token_scores.shape[0] > 0 and use != NO_TABLE:
        n_words = split_at_metaspace(scratch.norm_bytes, n_bytes, scratch.words)  # the cache's words
        if n_words == SCRATCH_TOO_SMALL:
            return SCRATCH_TOO_SMALL
    # hf mode scores in float64. Decided by the type of ``hf``, so a constant once the
    # kernel is typed: each mode's Viterbi loop compiles without the other's branches
    # (a Model field read at run time measured 1-4 % slower on the multilingual bench).
    use_f64 = hf is not None
    n = viterbi_into(model.nodes, model.nodes_f32, model.score64, model.token_scores, model.max_abs_score,
                     scratch.norm_bytes, scratch.words, n_words, use_f64, model.unk_id, model.unk_score,
                     scratch.best_score, scratch.best_start, scratch.best_id, scratch.ids, scratch.spans, cache,
                     use, usage)
    if n == SCRATCH_TOO_SMALL:
        return SCRATCH_TOO_SMALL
    if model.byte_ids.shape[0] == 256:
        n = _bytes_for_unknowns(scratch, n, model.unk_id, model.byte_ids)
        if n == SCRATCH_TOO_SMALL:
            return SCRATCH_TOO_SMALL
    if want_offsets:
        # sentencepiece's pieces tile the text (a character's byte pieces too: all but the
        # last are empty at its start)
        _spans_to_chars(src, scratch, n, hf is None)
    return n


@cached_njit(nogil=True)
def _bytes_for_unknowns(scratch, n, unk_id, byte_ids):
    """Replace each unknown token in scratch.ids[:n] by the byte pieces of its normalized
    bytes, in place from the right; the new count (or SCRATCH_TOO_SMALL)."""
    total = 0
    unknowns = 0
    for t in range(n):
        if scratch.ids[t] == unk_id:
            unknowns += 1
            total += scratch.spans[t, 1] - scratch.spans[t, 0]
        else:
            total += 1
    if unknowns == 0:
        return n
    if total > scratch.ids.shape[0]:
        return SCRATCH_TOO_SMALL
    w = total
    for t in range(n - 1, -1, -1):
        start, end = scratch.spans[t, 0], scratch.spans[t, 1]
        if scratch.ids[t] != unk_id:
            w -= 1
            scratch.ids[w] = scratch.ids[t]
            scratch.spans[w, 0] = start
            scratch.spans[w, 1] = end
            continue
        for b in range(end - 1, start - 1, -1):
            w -= 1
            scratch.ids[w] = byte_ids[scratch.norm_bytes[b]]
            scratch.spans[w, 0] = b
            scratch.spans[w, 1] = b + 1
    return total


@cached_njit(nogil=True)
def _spans_to_chars(src, scratch, n, tiled):
    """Rewrite spans from normalized bytes to [start, end) characters of the source.

    ``tiled`` (sentencepiece mode): a token ends where the next one starts in the source,
    the last one where normalization stopped consuming it (the origin the normalizer
    left one past its output), as sentencepiece's ``begin``/``end`` give them: characters
    the charsmap deleted, and a run of spaces written as one, belong to the token before.
    Otherwise (tokenizers' offsets) a token ends where its last byte's source ends."""
    count = 0
    for b in range(src.shape[0]):
        scratch.char_index[b] = count
        if (src[b] & 0xC0) != 0x80:
            count += 1
    scratch.char_index[src.shape[0]] = count
    for t in range(n):
        s, e = scratch.spans[t, 0], scratch.spans[t, 1]
        src_start = origin_start(scratch.norm_origin, s)
        if tiled:
            src_end = max(origin_start(scratch.norm_origin, e), src_start)
        else:
            src_end = max(origin_end(scratch.norm_origin, e - 1), src_start)
        scratch.spans[t, 0] = scratch.char_index[src_start]
        scratch.spans[t, 1] = scratch.char_index[src_end]


@cached_njit(nogil=True)
def encode_run(model, data, text_starts, lo, hi, factor, want_offsets, hf, cache, usage):
    """Encode texts lo..hi-1 (text i is data[text_starts[i]:text_starts[i+1]]).

    The output holds (bytes of the run) * factor + 8 per text tokens, plenty for real
    text; returns (ids, spans, tok_start, tok_count, first_left) where text i's tokens
    are ids[tok_start[i-lo] : + tok_count[i-lo]] and ``first_left`` is the first text
    that did not fit (``hi`` when all did; the caller retries the rest with a larger
    factor).
    """
    cap = (text_starts[hi] - text_starts[lo]) * factor + 8 * (hi - lo)
    ids = np.empty(cap, np.int32)
    spans = np.empty((cap if want_offsets else 0, 2), np.int32)
    tok_start = np.zeros(hi - lo, np.int64)
    tok_count = np.zeros(hi - lo, np.int64)
    longest = 0
    for i in range(lo, hi):
        longest = max(longest, text_starts[i + 1] - text_starts[i])
    scratch = new_scratch(longest, 2)
    w = 0
    for i in range(lo, hi):
        src = data[text_starts[i]:text_starts[i + 1]]
        grow = 4
        # One call site: encode_raw is inlined, and each site costs its whole compile again.
        while True:
            n = encode_raw(model, src, scratch, want_offsets, hf, cache, usage)
            if n != SCRATCH_TOO_SMALL:
                break
            scratch = new_scratch(longest, grow)  # rare: normalization expanded the text more than 2x
            grow *= 2
        if w + n > cap:
            return ids, spans, tok_start, tok_count, i
        ids[w:w + n] = scratch.ids[:n]
        if want_offsets:
            spans[w:w + n] = scratch.spans[:n]
        tok_start[i - lo] = w
        tok_count[i - lo] = n
        w += n
    return ids, spans, tok_start, tok_count, hi


@cached_njit(nogil=True)
def encode_with_template(model, src, scratch, prefix, suffix, hf, cache, usage):
    """One text, specials around it, as a fresh int32 array.

    Returns an empty array with ok=False when scratch is too small (grow and retry);
    the scratch is not returned, as boxing it back costs more than a short encode.
    """
    n = encode_raw(model, src, scratch, False, hf, cache, usage)
    if n == SCRATCH_TOO_SMALL:
        return np.empty(0, np.int32), False
    out = np.empty(prefix.shape[0] + n + suffix.shape[0], np.int32)
    out[:prefix.shape[0]] = prefix
    out[prefix.shape[0]:prefix.shape[0] + n] = scratch.ids[:n]
    out[prefix.shape[0] + n:] = suffix
    return out, True


def compiled_for(kernel, *example_args):
    """``kernel``'s compiled code for the types of ``example_args``, called directly.

    Calling a Numba dispatcher types every argument and looks the signature up on each
    call (~3 us here for the Model and Scratch tuples, more than a short encode's
    work); the compiled entry point skips that. Only for calls whose arguments always
    have exactly these types (the entry point does not check them).
    """
    kernel(*example_args)  # compile, or load from the on-disk cache
    signature = tuple(kernel.typeof_pyval(a) for a in example_args)
    return kernel.overloads[signature].entry_point
