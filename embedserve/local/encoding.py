"""Texts -> token ids for a bulk job: the prompt, tokenization and the long-input policy.

Torch-free, so that the ``--url`` client (which only counts tokens and
decides which documents are too long) shares it with the in-process
embedder. ``refuse`` drops documents over the model's limit with a reason;
``truncate`` cuts them from the right in the tokenizer and flags them;
``chunk`` cuts them into windows of the model's length, the model's
specials around each (``model/windows.py``, the gateway's rule), to be
embedded as sequences of their own and pooled back per document. Windows
are cut within one part, so a resumed job cuts them as an uninterrupted
one does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from embedserve.errors import InvalidInput
from embedserve.local.documents import too_long
from embedserve.model.windows import Windows, cut_windows
from embedserve.ragged import RaggedBatch
from embedserve.tokenizer import EncodedBatch
from embedserve.tokenizer.backend import Truncation


@dataclass
class EncodedTexts:
    rows: np.ndarray                     # int64 [n]: the texts that run
    encoded: EncodedBatch                # their sequences, in ``rows`` order (whole, for ``chunk``)
    problems: list[tuple[int, str]]      # (text index, reason) of the texts that do not
    windows: Windows | None = None       # ``chunk``: the sequences the model runs, >= 1 per text

    @property
    def sequences(self) -> RaggedBatch:
        """What the model runs: the windows under ``chunk``, else one sequence per text."""
        return self.windows.batch if self.windows is not None else self.encoded

    @property
    def tokens(self) -> np.ndarray:
        """int32 [n]: tokens embedded for each text (all its windows, specials and overlap included)."""
        if self.windows is None:
            return self.encoded.lengths.astype(np.int32)
        ends = np.zeros(self.windows.batch.num_sequences + 1, dtype=np.int64)
        np.cumsum(self.windows.batch.lengths, out=ends[1:])
        cu = self.windows.window_cu
        return (ends[cu[1:]] - ends[cu[:-1]]).astype(np.int32)

    @property
    def chunked(self) -> np.ndarray:
        """bool [n]: the texts embedded as more than one window."""
        if self.windows is None:
            return np.zeros(len(self.rows), dtype=bool)
        return np.diff(self.windows.window_cu) > 1


class WindowTokenizer(Protocol):
    """What encoding uses of a tokenizer: any TokenizerBackend, or the gateway's own
    (bulk/gateway_tokenizer.py) when a remote job has no model here."""

    @property
    def single_specials(self) -> tuple[np.ndarray, np.ndarray]: ...

    def encode_batch(self, texts: Sequence[str], max_length: int | None = None,
                     truncation: Truncation = None) -> EncodedBatch: ...


def window_room(tokenizer: WindowTokenizer, limit: int) -> int:
    """Content tokens one window of ``limit`` tokens holds besides the model's specials."""
    prefix, suffix = tokenizer.single_specials
    return limit - len(prefix) - len(suffix)


def check_overlap(tokenizer: WindowTokenizer, limit: int, overlap: int) -> None:
    """InvalidInput unless windows of ``limit`` tokens can share ``overlap`` content tokens."""
    room = window_room(tokenizer, limit)
    if not 0 <= overlap < room:
        raise InvalidInput(f"chunk_overlap {overlap} must lie in [0, {room - 1}]: the model's windows "
                           f"hold {room} tokens besides the special tokens", field="chunk_overlap")


def take(encoded: RaggedBatch, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def encode_texts(tokenizer: WindowTokenizer, texts: Sequence[str], prompt: str, limit: int,
                 long_inputs: str, overlap: int = 0) -> EncodedTexts:
    """Tokenize ``prompt + text`` on all cores and apply the long-input policy.

    ``overlap``: content tokens consecutive windows share (``chunk`` only).
    """
    if not texts:
        empty = EncodedBatch(np.zeros(0, np.int32), np.zeros(1, np.int32),
                             truncated=np.zeros(0, bool), original_lengths=np.zeros(0, np.int32))
        return EncodedTexts(np.zeros(0, np.int64), empty, [])
    prompted = [prompt + t for t in texts] if prompt else list(texts)
    truncate = long_inputs == "truncate"
    encoded = tokenizer.encode_batch(prompted, max_length=limit if truncate else None,
                                     truncation="right" if truncate else None)
    if long_inputs == "chunk":
        prefix, suffix = tokenizer.single_specials
        windows = cut_windows(encoded, len(prefix), len(suffix), limit, overlap)
        return EncodedTexts(np.arange(len(texts), dtype=np.int64), encoded, [], windows)
    lengths = encoded.lengths
    problems = [(int(i), too_long(int(lengths[i]), limit)) for i in np.flatnonzero(lengths > limit)]
    rows = np.flatnonzero(lengths <= limit).astype(np.int64)
    if len(rows) < len(texts):
        encoded = subset(encoded, rows)
    return EncodedTexts(rows, encoded, problems)
