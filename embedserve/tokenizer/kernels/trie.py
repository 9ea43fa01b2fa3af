"""The vocabulary as a double-array trie of 64-byte nodes, built once and cached on disk.

A node is one cache line (``NODE_DTYPE``): a 256-bit bitmap of the bytes that have a
child, ``base`` (child for byte c sits at ``base + c``), ``check`` (the parent's index,
kept for validation), the output token id ending here (``NO_TOKEN`` if none), and the
token's score in float32 (sentencepiece mode) and float64 (hf mode). WordPiece's walk
tests one bit of the node it is on and jumps, so a step touches one cache line. The
Unigram Viterbi walks the same double array as 32-byte rows (``compact_nodes``).

Placement is depth-first: a node's children go at the first free cells after the node
that fit all of its labels (found through a union-find "next free cell" table, so the
250k-piece XLM-R vocabulary builds in about 1.5 s). A node with one child (most of them
below the first bytes) then usually has it in the next cell, so a walk down a chain
reads ascending cache lines, which the CPU prefetches; with breadth-first first-fit
placement a chain's nodes were scattered over the 50 MB array. On multilingual text (a
different stretch of the trie for every text) that is worth about 2 % of an encode in
both modes (BENCHMARKS.md, tokenizer section). Only matchable pieces are inserted (see
``MATCHABLE_KINDS``).

The built array is cached as ``<cache_dir>/trie-<sha256>.npy``, the hash covering the
pieces, scores, kinds and compat mode, so a later load is an ``np.load``.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np

from embedserve.tokenizer.huge_pages import huge_page_zeros, on_huge_pages
from embedserve.tokenizer.kernel_cache import cached_njit
from embedserve.tokenizer.spec import PieceKind, TokenizerSpec

NODE_DTYPE = np.dtype([
    ("children", np.uint64, (4,)),  # bit c set: byte c has a child at base + c
    ("base", np.int32),
    ("check", np.int32),            # parent index; -1 for the root and free cells
    ("token_id", np.int32),         # output id of the piece ending here, or NO_TOKEN
    ("score32", np.float32),
    ("score64", np.float64),
    ("_pad", np.uint64),
])
NODE_BYTES = 64  # one cache line
NO_TOKEN = -1


def _slot(layout: np.dtype, field: str, view: type) -> int:
    """The column of ``field`` when ``layout`` records are viewed as rows of ``view``.

    Raises when the field is not of the view's type or not at a multiple of its size:
    a kernel reading that column would read garbage.
    """
    dtype, offset = layout.fields[field][:2]  # type: ignore[index]  # a structured dtype: fields is set
    if dtype.base != np.dtype(view) or offset % dtype.base.itemsize:
        raise TypeError(f"node field {field!r} ({dtype} at byte {offset}) is not a {np.dtype(view)} column")
    return offset // dtype.base.itemsize


if NODE_DTYPE.itemsize != NODE_BYTES:
    raise TypeError(f"NODE_DTYPE is {NODE_DTYPE.itemsize} bytes, not one {NODE_BYTES}-byte line")
# Where the kernels read a node's fields in node_views(): the uint64 view's columns
# SLOT_CHILDREN..+3 hold the bitmap; the others are single columns of their view.
SLOT_CHILDREN = _slot(NODE_DTYPE, "children", np.uint64)  # 0
SLOT_BASE = _slot(NODE_DTYPE, "base", np.int32)  # 8
SLOT_TOKEN = _slot(NODE_DTYPE, "token_id", np.int32)  # 10
SLOT_SCORE32 = _slot(NODE_DTYPE, "score32", np.float32)  # 11
SLOT_SCORE64 = _slot(NODE_DTYPE, "score64", np.float64)  # 6

TRIE_FORMAT = b"embedserve-trie-v2"  # v2: depth-first placement
MATCHABLE_KINDS = (PieceKind.NORMAL, PieceKind.USER_DEFINED)


def node_views(trie: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The trie as 2-D uint64/int32/float32/float64 views, one row per node (no copy).

    Numba indexes these faster than record fields; the kernels read them at the
    ``SLOT_*`` columns.
    """
    raw = np.ascontiguousarray(trie).view(np.uint8).reshape(-1, NODE_BYTES)
    return raw.view(np.uint64), raw.view(np.int32), raw.view(np.float32), raw.view(np.float64)


# The Unigram kernels' layout (``compact_nodes``): the same double array as int32 rows
# of eight columns, 32 bytes a node, two to a cache line, walked as one flat int32 array
# (``nodes.reshape(-1)``). A row's base and check hold flat offsets (row * 8), not row
# numbers: the child for byte c of the node at offset o is at ``base + 8 * c`` and is
# that node's child iff its check is o, so a step of the walk is a load, an add and a
# compare, with no multiply on the chain of dependent loads (a 2-D index multiplies
# by the row stride at run time: measured 7-9 % of a Viterbi on unseen text). A row
# with no token scores -inf: a candidate through it never beats one already set, so the
# lattice update needs no test of the token first.
#
# A row also holds a 64-bit mask of its children's bytes (bit c & 63 set for each child
# c, in two int32 columns): the step that ends a start's walk (one per start, ~1,450 a
# 512-token text) is decided on the row the walk is on, instead of loading the row of a
# child that is not there: those rows were 40 % of the cache lines a text's walk touched
# (443 of 1,091 on a Latin-script UDHR text), each a likely miss on unseen text. With
# the mask, rows of 32 bytes: measured 4-6 % of a Viterbi on the stream over 16-byte
# rows without it. With the depth-first placement a chain of single-child nodes shares
# lines. WordPiece keeps the 64-byte nodes (node_views).
COMPACT_BASE = 0  # flat offset of the child for byte 0 (children: + COMPACT_COLUMNS * byte)
COMPACT_CHECK = 1  # flat offset of the parent; -1 for the root and free rows
COMPACT_TOKEN = 2
COMPACT_SCORE32 = 3  # float32 bits (-inf: no token): read through the float32 view of the same rows
COMPACT_MASK = 4  # children's bytes c & 63: bit c of column 4 (c < 32), bit c - 32 of column 5
COMPACT_COLUMNS = 8  # columns 6-7 unused (rows of 32 bytes)


def compact_nodes(trie: np.ndarray, use_f64: bool) -> tuple[np.ndarray, np.ndarray]:
    """The trie as ``COMPACT_COLUMNS`` int32 columns per node (huge pages when big) and
    the float64 scores per node that hf mode reads when a score is not a float32.

    Rows past the last node (check -1, mask 0) make ``base + COMPACT_COLUMNS * c`` a
    valid offset for every node and byte, so the walk needs no bounds test. The second array is empty unless
    ``use_f64`` and some piece's float64 score differs from its float32 one (a
    tokenizer.json converted from a SentencePiece model has float32 scores throughout);
    hf mode then reads it (at offset // COMPACT_COLUMNS, -inf where no token ends) on each match
    instead of widening the node's float32 score.
    """
    base = trie["base"]
    rows = max(base.shape[0], int(base.max(initial=0)) + 256)
    if rows * COMPACT_COLUMNS > np.iinfo(np.int32).max:
        raise ValueError(f"a trie of {rows} rows does not fit int32 offsets")
    n = base.shape[0]
    has_token = trie["token_id"] != NO_TOKEN
    nodes = huge_page_zeros((rows, COMPACT_COLUMNS), np.int32)
    nodes[:, COMPACT_CHECK] = -1
    nodes[:n, COMPACT_BASE] = base * COMPACT_COLUMNS
    nodes[:n, COMPACT_CHECK] = np.where(trie["check"] >= 0, trie["check"] * COMPACT_COLUMNS, -1)
    nodes[:, COMPACT_TOKEN] = NO_TOKEN
    nodes[:n, COMPACT_TOKEN] = trie["token_id"]
    scores32 = nodes.view(np.float32)
    scores32[:, COMPACT_SCORE32] = -np.inf
    scores32[:n, COMPACT_SCORE32] = np.where(has_token, trie["score32"], -np.inf)
    children = trie["children"]
    mask = (children[:, 0] | children[:, 1] | children[:, 2] | children[:, 3]).astype(np.uint64)
    nodes[:n, COMPACT_MASK] = (mask & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.int32)
    nodes[:n, COMPACT_MASK + 1] = (mask >> np.uint64(32)).astype(np.uint32).view(np.int32)
    score64 = np.zeros(0, np.float64)
    if use_f64 and (trie["score64"][has_token] != trie["score32"][has_token].astype(np.float64)).any():
        score64 = huge_page_zeros(rows, np.float64)
        score64[:] = -np.inf
        score64[:n] = np.where(has_token, trie["score64"], -np.inf)
    return nodes, score64


def load_or_build_compact_nodes(spec: TokenizerSpec, cache_dir: Path | None) -> tuple[np.ndarray, np.ndarray]:
    """``compact_nodes`` of the trie for ``spec`` (cached on disk as ``load_or_build_trie``'s)."""
    return compact_nodes(_cached_or_built_trie(spec, cache_dir), spec.compat == "hf")


def spec_hash(spec: TokenizerSpec) -> str:
    """Hash of everything the trie depends on."""
    h = hashlib.sha256(TRIE_FORMAT)
    h.update(spec.compat.encode())
    h.update("\0".join(spec.pieces).encode("utf-8", "surrogatepass"))
    h.update(np.ascontiguousarray(spec.scores, np.float64).tobytes())
    h.update(np.ascontiguousarray(spec.kinds, np.uint8).tobytes())
    return h.hexdigest()


def load_or_build_trie(spec: TokenizerSpec, cache_dir: Path | None) -> np.ndarray:
    """The trie for ``spec`` on huge pages (``huge_pages.py``), from ``cache_dir`` when
    present there, else built (and saved)."""
    return on_huge_pages(_cached_or_built_trie(spec, cache_dir))


def _cached_or_built_trie(spec: TokenizerSpec, cache_dir: Path | None) -> np.ndarray:
    if cache_dir is None:
        return build_trie(spec)
    path = Path(cache_dir) / f"trie-{spec_hash(spec)}.npy"
    try:
        # Mapped: on_huge_pages copies its bytes once, from the page cache into huge pages.
        trie = np.load(path, mmap_mode="r", allow_pickle=False)
        if trie.dtype == NODE_DTYPE and trie.ndim == 1:
            return trie
    except (OSError, ValueError):
        pass
    trie = build_trie(spec)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            np.save(f, trie, allow_pickle=False)
        os.replace(tmp, path)  # atomic: a concurrent loader sees all or nothing
    except OSError:
        pass  # an unwritable cache only costs the next start-up a rebuild
    return trie


def build_trie(spec: TokenizerSpec) -> np.ndarray:
    """Build the double array over the matchable pieces of ``spec``."""
    matchable = np.isin(spec.kinds, np.array(MATCHABLE_KINDS, np.uint8))
    ids = np.flatnonzero(matchable)
    keyed = sorted((spec.pieces[i].encode("utf-8"), int(i)) for i in ids if spec.pieces[i])
    # Duplicate pieces: the first id wins, as in a dict built in id order.
    unique: list[tuple[bytes, int]] = []
    for key, tid in keyed:
        if unique and unique[-1][0] == key:
            continue
        unique.append((key, tid))
    key_bytes = np.frombuffer(b"".join(k for k, _ in unique), np.uint8)
    offsets = np.zeros(len(unique) + 1, np.int64)
    offsets[1:] = np.cumsum([len(k) for k, _ in unique])
    token_ids = np.array([t for _, t in unique], np.int32)
    scores64 = np.asarray(spec.scores, np.float64)[token_ids]
    scores32 = scores64.astype(np.float32)
    if spec.compat == "sentencepiece":
        # sentencepiece: a user-defined piece scores (its length in bytes * max score - 0.1),
        # max score being the highest NORMAL score but at least FLT_MIN (its initial value).
        normal = spec.kinds == PieceKind.NORMAL
        max_score = np.finfo(np.float32).tiny
        if normal.any():
            max_score = max(max_score, np.float32(spec.scores[normal].max()))
        lengths = np.diff(offsets).astype(np.float32)
        user = spec.kinds[token_ids] == PieceKind.USER_DEFINED
        scores32[user] = lengths[user] * max_score - np.float32(0.1)
    base, check, token, bitmap = _build(key_bytes, offsets, token_ids)
    trie = np.zeros(base.shape[0], NODE_DTYPE)
    trie["children"] = bitmap
    trie["base"] = base
    trie["check"] = check
    trie["token_id"] = token
    has = token >= 0
    score_of = np.zeros(len(spec.pieces), np.float64)
    score_of[token_ids] = scores64
    score32_of = np.zeros(len(spec.pieces), np.float32)
    score32_of[token_ids] = scores32
    trie["score64"][has] = score_of[token[has]]
    trie["score32"][has] = score32_of[token[has]]
    return trie


@cached_njit()
def _build(key_bytes, offsets, token_ids):
    n_keys = offsets.shape[0] - 1
    cap = max(key_bytes.shape[0] * 2 + 512, 1024)
    base = np.zeros(cap, np.int32)
    check = np.full(cap, -1, np.int32)
    token = np.full(cap, NO_TOKEN, np.int32)
    bitmap = np.zeros((cap, 4), np.uint64)
    free_from = _free_cells(cap)
    _take(free_from, 0)  # the root
    # Depth-first (a stack of (node, lo, hi, depth): keys[lo:hi] share the node's prefix
    # of length depth), each node's children placed at the first free cells after it:
    # a chain of single-child nodes, the usual shape below the first few bytes, lies in
    # consecutive cells, so a walk down it reads ascending cache lines (which the CPU
    # prefetches) instead of lines scattered over the array.
    st_node = np.empty(key_bytes.shape[0] + 1, np.int64)
    st_lo = np.empty_like(st_node)
    st_hi = np.empty_like(st_node)
    st_depth = np.empty_like(st_node)
    st_node[0], st_lo[0], st_hi[0], st_depth[0] = 0, 0, n_keys, 0
    top = 1
    labels = np.empty(256, np.int64)
    lab_lo = np.empty(256, np.int64)
    lab_hi = np.empty(256, np.int64)
    while top > 0:
        top -= 1
        node, lo, hi, depth = st_node[top], st_lo[top], st_hi[top], st_depth[top]
        if lo < hi and offsets[lo + 1] - offsets[lo] == depth:  # a key ends here
            token[node] = token_ids[lo]
            lo += 1
        n_labels = 0
        k = lo
        while k < hi:
            c = np.int64(key_bytes[offsets[k] + depth])
            j = k + 1
            while j < hi and np.int64(key_bytes[offsets[j] + depth]) == c:
                j += 1
            labels[n_labels], lab_lo[n_labels], lab_hi[n_labels] = c, k, j
            n_labels += 1
            k = j
        if n_labels == 0:
            continue
        # The first free cell f after the node such that base = f - labels[0] puts every
        # child on a free cell.
        f = _first_free(free_from, max(node + 1, labels[0]))
        while True:
            b = f - labels[0]
            if b + labels[n_labels - 1] >= cap:  # past the end: grow
                cap = cap * 2
                base = _grow1(base, cap, 0)
                check = _grow1(check, cap, -1)
                token = _grow1(token, cap, NO_TOKEN)
                bitmap = _grow2(bitmap, cap)
                free_from = _grow_free(free_from, cap)
                continue
            ok = True
            for t in range(1, n_labels):
                if not _is_free(free_from, b + labels[t]):
                    ok = False
                    break
            if ok:
                break
            f = _first_free(free_from, f + 1)
        base[node] = b
        for t in range(n_labels):
            c = labels[t]
            cell = b + c
            _take(free_from, cell)
            check[cell] = node
            bitmap[node, c >> 6] |= np.uint64(1) << np.uint64(c & 63)
        for t in range(n_labels - 1, -1, -1):  # the lowest label on top: visited first
            st_node[top], st_lo[top], st_hi[top], st_depth[top] = b + labels[t], lab_lo[t], lab_hi[t], depth + 1
            top += 1
    size = 1
    for i in range(cap - 1, -1, -1):
        if not _is_free(free_from, i):
            size = i + 1
            break
    return base[:size].copy(), check[:size].copy(), token[:size].copy(), bitmap[:size].copy()


# Free cells as a union-find "next free" forest: free_from[i] == i for a free cell, else a
# cell closer to the first free cell after i. free_from[cap] is a free sentinel.

@cached_njit()
def _free_cells(cap):
    return np.arange(cap + 1)


@cached_njit()
def _is_free(free_from, cell):
    return free_from[cell] == cell


@cached_njit()
def _take(free_from, cell):
    free_from[cell] = cell + 1


@cached_njit()
def _first_free(free_from, i):
    """The first free cell at or after i (the sentinel when none), compressing the path."""
    root = i
    while free_from[root] != root:
        root = free_from[root]
    while i != root:
        after = free_from[i]
        free_from[i] = root
        i = after
    return root


@cached_njit()
def _grow_free(free_from, cap):
    out = np.arange(cap + 1)
    for i in range(free_from.shape[0]):
        out[i] = free_from[i]
    return out


# The _grow functions copy in loops, not with ``out[:n] = a``: a slice assignment makes
# Numba compile its shape-mismatch error path too (string formatting), seconds of each
# cold compile for a copy that runs a few times per build.

@cached_njit()
def _grow1(a, cap, fill):
    out = np.full(cap, fill, a.dtype)
    for i in range(a.shape[0]):
        out[i] = a[i]
    return out


@cached_njit()
def _grow2(a, cap):
    out = np.zeros((cap, a.shape[1]), a.dtype)
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            out[i, j] = a[i, j]
    return out


