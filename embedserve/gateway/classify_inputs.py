"""A classifier's inputs: TEI's ``/predict`` shapes read, and singles and pairs packed together.

Owns reading ``inputs`` as TEI does (a string; a list of one or two strings is one
input, a pair when two; a list of such lists is a batch) and packing a mix of single
texts and (text, text) pairs into one ``RaggedBatch`` in input order: singles with the
model's single-sequence template, pairs with its pair template (BERT's segment ids
included), as transformers' tokenizer does for ``tokenizer(a)`` and ``tokenizer(a, b)``.
Knows nothing about replicas or HTTP shapes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from embedserve import ragged
from embedserve.errors import InvalidInput
from embedserve.gateway.preprocess import Preprocessor
from embedserve.ragged import RaggedBatch

Item = tuple[str, str | None]   # a text, or a (text, text) pair


def predict_items(inputs: str | list) -> tuple[list[Item], bool]:
    """TEI's ``inputs`` -> its items and whether the answer is a batch (a list per item)."""
    if isinstance(inputs, str):
        return [(inputs, None)], False
    if not inputs:
        raise InvalidInput("inputs must not be empty", field="inputs")
    if all(isinstance(item, str) for item in inputs):
        return [_item(inputs, "inputs")], False
    return [_item(item, f"inputs[{i}]") for i, item in enumerate(inputs)], True


def _item(strings: Sequence[str], field: str) -> Item:
    if len(strings) == 1:
        return strings[0], None
    if len(strings) == 2:
        return strings[0], strings[1]
    raise InvalidInput(f"{field} has {len(strings)} strings; an input is one string or a pair "
                       "[a, b] (send a batch as [[a], [a, b], ...])", field=field)


async def pack_items(preprocessor: Preprocessor, items: Sequence[Item], truncate: bool,
                     direction: str, field: str) -> RaggedBatch:
    """Every item tokenized with its template, in input order (pairs sharing a first text
    are tokenized together)."""
    sequences: list[np.ndarray | None] = [None] * len(items)
    types: list[np.ndarray | None] = [None] * len(items)
    singles = [i for i, (_, second) in enumerate(items) if second is None]
    if singles:
        encoded: RaggedBatch = await preprocessor.encode_texts([items[i][0] for i in singles], "", truncate,
                                                  direction, field)
        _place(encoded, singles, sequences, types)
    by_first: dict[str, list[int]] = {}
    for i, (first, second) in enumerate(items):
        if second is not None:
            by_first.setdefault(first, []).append(i)
    for first, indices in by_first.items():
        encoded = await preprocessor.pack_pairs(first, [items[i][1] or "" for i in indices], truncate,
                                                direction, field)
        _place(encoded, indices, sequences, types)
    lengths = np.array([s.shape[0] for s in sequences if s is not None], dtype=np.int64)
    ids = np.concatenate([s for s in sequences if s is not None])
    any_types = any(t is not None for t in types)
    flat_types = (np.concatenate([t if t is not None else np.zeros(s.shape[0], dtype=np.int32)
                                  for s, t in zip(sequences, types) if s is not None])
                  if any_types else None)
    return ragged.from_lengths(ids, lengths, flat_types)


def _place(encoded: RaggedBatch, indices: list[int], sequences: list, types: list) -> None:
    for j, i in enumerate(indices):
        lo, hi = int(encoded.cu_seqlens[j]), int(encoded.cu_seqlens[j + 1])
        sequences[i] = encoded.token_ids[lo:hi]
        if encoded.token_type_ids is not None:
            types[i] = encoded.token_type_ids[lo:hi]
