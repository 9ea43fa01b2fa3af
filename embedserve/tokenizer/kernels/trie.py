"""The vocabulary as a double-array trie of 64-byte nodes, built once and cached on disk.

A node is one cache line (``NODE_DTYPE``): a 256-bit bitmap of the bytes that have a
child, ``base`` (child for byte c sits at ``base + c``), ``check`` (the parent's index,
kept for validation), the output token id ending here (``NO_TOKEN`` if none), and the
token's score in float32 (sentencepiece mode) and float64 (hf mode). Viterbi tests one
bit of the node it is on and jumps, so a step touches one cache line.

Placement uses a free list of unused cells: a node's children go at the first free
cell that fits all of its labels, so nodes with a single child (most of them) place in
O(1) and the 250k-piece XLM-R vocabulary builds in a few seconds (a first-fit scan over
all cells took minutes). Only matchable pieces are inserted (see ``MATCHABLE_KINDS``).

The built array is cached as ``<cache_dir>/trie-<sha256>.npy``, the hash covering the
pieces, scores, kinds and compat mode, so a later load is an ``np.load``.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np

from embedserve.tokenizer.huge_pages import on_huge_pages
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
    dtype, offset = layout.fields[field][:2]
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

TRIE_FORMAT = b"embedserve-trie-v1"
MATCHABLE_KINDS = (PieceKind.NORMAL, PieceKind.USER_DEFINED)


def node_views(trie: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The trie as 2-D uint64/int32/float32/float64 views, one row per node (no copy).

    Numba indexes these faster than record fields; the kernels read them at the
    ``SLOT_*`` columns.
    """
    raw = np.ascontiguousarray(trie).view(np.uint8).reshape(-1, NODE_BYTES)
    return raw.view(np.uint64), raw.view(np.int32), raw.view(np.float32), raw.view(np.float64)


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
    used = np.zeros(cap, np.bool_)
    # Doubly linked free list over cells 1..cap-1; sentinel 0 (the root, always used).
    next_free = np.empty(cap, np.int64)
    prev_free = np.empty(cap, np.int64)
    for i in range(cap):
        next_free[i] = i + 1
        prev_free[i] = i - 1
    next_free[cap - 1] = 0
    prev_free[0] = cap - 1
    used[0] = True
    # BFS queue of (node, lo, hi, depth): keys[lo:hi] share the node's prefix of length depth.
    q_node = np.empty(key_bytes.shape[0] + 1, np.int64)
    q_lo = np.empty_like(q_node)
    q_hi = np.empty_like(q_node)
    q_depth = np.empty_like(q_node)
    q_node[0], q_lo[0], q_hi[0], q_depth[0] = 0, 0, n_keys, 0
    q_head, q_tail = 0, 1
    labels = np.empty(256, np.int64)
    lab_lo = np.empty(256, np.int64)
    lab_hi = np.empty(256, np.int64)
    while q_head < q_tail:
        node, lo, hi, depth = q_node[q_head], q_lo[q_head], q_hi[q_head], q_depth[q_head]
        q_head += 1
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
        # First free cell f such that base = f - labels[0] places every child on a free cell.
        f = next_free[0]
        while True:
            if f == 0:  # list exhausted: grow
                old = cap
                cap = cap * 2
                base = _grow1(base, cap, 0)
                check = _grow1(check, cap, -1)
                token = _grow1(token, cap, NO_TOKEN)
                bitmap = _grow2(bitmap, cap)
                used = _grow_bool(used, cap)
                next_free = _grow1(next_free, cap, 0)
                prev_free = _grow1(prev_free, cap, 0)
                last = prev_free[0]
                for i in range(old, cap):
                    prev_free[i] = i - 1 if i > old else last
                    next_free[i] = i + 1
                next_free[last] = old
                next_free[cap - 1] = 0
                prev_free[0] = cap - 1
                f = old
                continue
            b = f - labels[0]
            ok = b >= 0
            if ok:
                for t in range(1, n_labels):
                    cell = b + labels[t]
                    if cell < cap and used[cell]:
                        ok = False
                        break
                    if cell >= cap:
                        ok = False
                        break
            if ok:
                break
            f = next_free[f]
        base[node] = b
        for t in range(n_labels):
            c = labels[t]
            cell = b + c
            used[cell] = True
            nf, pf = next_free[cell], prev_free[cell]
            next_free[pf] = nf
            prev_free[nf] = pf
            check[cell] = node
            bitmap[node, c >> 6] |= np.uint64(1) << np.uint64(c & 63)
            q_node[q_tail], q_lo[q_tail], q_hi[q_tail], q_depth[q_tail] = cell, lab_lo[t], lab_hi[t], depth + 1
            q_tail += 1
    size = 1
    for i in range(cap - 1, -1, -1):
        if used[i]:
            size = i + 1
            break
    return base[:size].copy(), check[:size].copy(), token[:size].copy(), bitmap[:size].copy()


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


@cached_njit()
def _grow_bool(a, cap):
    out = np.zeros(cap, np.bool_)
    for i in range(a.shape[0]):
        out[i] = a[i]
    return out
