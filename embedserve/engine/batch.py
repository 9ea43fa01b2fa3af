"""The packed, padding-free batch the engine consumes.

Owns the shape contract only: no tokenization, no model code. A batch of B
sequences is one flat ``token_ids [T]`` array plus ``cu_seqlens [B+1]``
(cumulative lengths, starting at 0), as in FlashAttention's varlen API and
TEI's ``cu_seq_lengths``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from embedserve.errors import InvalidInput
from embedserve.model.config import ModelInfo

Task = Literal["embed", "score"]


@dataclass(frozen=True)
class Batch:
    token_ids: np.ndarray            # int32 [T]
    cu_seqlens: np.ndarray           # int32 [B+1], cu_seqlens[0] == 0, cu_seqlens[-1] == T
    task: Task = "embed"
    token_type_ids: np.ndarray | None = None  # int32 [T]; None means all zeros

    @property
    def num_sequences(self) -> int:
        return int(self.cu_seqlens.shape[0] - 1)

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.cu_seqlens)

    @classmethod
    def from_lengths(cls, token_ids: np.ndarray, lengths: np.ndarray, task: Task = "embed",
                     token_type_ids: np.ndarray | None = None) -> "Batch":
        cu = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=cu[1:])
        return cls(np.ascontiguousarray(token_ids, dtype=np.int32), cu, task,
                   None if token_type_ids is None
                   else np.ascontiguousarray(token_type_ids, dtype=np.int32))

    @classmethod
    def from_sequences(cls, sequences: "list[np.ndarray] | list[list[int]]", task: Task = "embed") -> "Batch":
        arrays = [np.asarray(s, dtype=np.int32) for s in sequences]
        lengths = np.array([a.shape[0] for a in arrays], dtype=np.int32)
        ids = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int32)
        return cls.from_lengths(ids, lengths, task)

    def validate(self, vocab_size: int, max_positions: int) -> None:
        """Raise InvalidInput unless the batch is well formed for a model."""
        if self.token_ids.dtype != np.int32 or self.cu_seqlens.dtype != np.int32:
            raise InvalidInput("token_ids and cu_seqlens must be int32")
        if self.num_sequences < 1:
            raise InvalidInput("a batch needs at least one sequence")
        if self.cu_seqlens[0] != 0 or self.cu_seqlens[-1] != self.num_tokens:
            raise InvalidInput("cu_seqlens must start at 0 and end at the token count")
        lengths = self.lengths
        if (lengths < 1).any():
            raise InvalidInput("every sequence needs at least one token")
        if int(lengths.max()) > max_positions:
            raise InvalidInput(f"a sequence of {int(lengths.max())} tokens exceeds the model's "
                               f"{max_positions} positions")
        if self.num_tokens and (int(self.token_ids.min()) < 0 or int(self.token_ids.max()) >= vocab_size):
            raise InvalidInput(f"token ids must lie in [0, {vocab_size})")
        if self.token_type_ids is not None and self.token_type_ids.shape != self.token_ids.shape:
            raise InvalidInput("token_type_ids must have one entry per token")


def check_batch(batch: Batch, info: ModelInfo) -> None:
    """Raise InvalidInput unless the model can run ``batch``."""
    if batch.task != info.task:
        raise InvalidInput(f"model {info.model_id} does task {info.task!r}, not {batch.task!r}")
    batch.validate(info.vocab_size, info.max_positions)
    types = batch.token_type_ids
    if types is not None and types.size and not (
            0 <= int(types.min()) and int(types.max()) < info.type_vocab_size):
        raise InvalidInput(f"token type ids must lie in [0, {info.type_vocab_size})")
