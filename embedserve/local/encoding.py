"""Texts -> token ids for a bulk job: the prompt, tokenization and the long-input policy.

Torch-free, so that the ``--url`` client (which only counts tokens and
decides which documents are too long) shares it with the in-process
embedder. ``refuse`` drops documents over the model's limit with a reason;
``truncate`` cuts them from the right in the tokenizer and flags them.
Chunk-and-pool would split them here (into several sequences per document)
and set ``chunked``; it is not implemented for bulk jobs yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from embedserve.local.documents import too_long
from embedserve.tokenizer import EncodedBatch, Tokenizer


@dataclass
class EncodedTexts:
    rows: np.ndarray                     # int64 [n]: the texts that run
    encoded: EncodedBatch                # their sequences, in ``rows`` order
    problems: list[tuple[int, str]]      # (text index, reason) of the texts that do not


def take(encoded: EncodedBatch, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(token_ids, lengths) of sequences ``rows`` of ``encoded``, packed in that order."""
    cu = np.asarray(encoded.cu_seqlens, dtype=np.int64)
    starts, lengths = cu[rows], cu[rows + 1] - cu[rows]
    first = np.zeros(len(rows), dtype=np.int64)
    np.cumsum(lengths[:-1], out=first[1:])
    gather = np.repeat(starts - first, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)
    return encoded.token_ids[gather], lengths


def subset(encoded: EncodedBatch, rows: np.ndarray) -> EncodedBatch:
    ids, lengths = take(encoded, rows)
    cu = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu[1:])
    return EncodedBatch(ids, cu, truncated=encoded.truncated[rows],
                        original_lengths=encoded.original_lengths[rows])


def encode_texts(tokenizer: Tokenizer, texts: Sequence[str], prompt: str, limit: int,
                 long_inputs: str) -> EncodedTexts:
    """Tokenize ``prompt + text`` on all cores and apply the long-input policy."""
    if not texts:
        empty = EncodedBatch(np.zeros(0, np.int32), np.zeros(1, np.int32),
                             truncated=np.zeros(0, bool), original_lengths=np.zeros(0, np.int32))
        return EncodedTexts(np.zeros(0, np.int64), empty, [])
    prompted = [prompt + t for t in texts] if prompt else list(texts)
    truncate = long_inputs == "truncate"
    encoded = tokenizer.encode_batch(prompted, max_length=limit if truncate else None,
                                     truncation="right" if truncate else None)
    lengths = encoded.lengths
    problems = [(int(i), too_long(int(lengths[i]), limit)) for i in np.flatnonzero(lengths > limit)]
    rows = np.flatnonzero(lengths <= limit).astype(np.int64)
    if len(rows) < len(texts):
        encoded = subset(encoded, rows)
    return EncodedTexts(rows, encoded, problems)
