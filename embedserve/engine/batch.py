"""Batch: what one engine step runs, a ``RaggedBatch`` plus the task.

Owns the step's input contract only: no tokenization, no model code. The
checks are ``embedserve.validate``'s, so a batch the engine refuses fails
with the words the gateway and the scheduler use for the same input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from embedserve import ragged, validate
from embedserve.model.info import ModelInfo
from embedserve.ragged import RaggedBatch

Task = Literal["embed", "score", "classify", "sparse", "multivector"]   # model/tasks.py


@dataclass(frozen=True, kw_only=True)
class Batch(RaggedBatch):
    task: Task = "embed"
    # An embedding step that also returns every token's last hidden state (TEI's /embed_all
    # for a plain embedder): the step's rows are then (pooled, states) pairs
    # (engine/token_rows.py). False for every step no call asks it of.
    token_states: bool = False

    @classmethod
    def of(cls, tokens: RaggedBatch, task: Task = "embed", token_states: bool = False) -> Batch:
        return cls(tokens.token_ids, tokens.cu_seqlens, tokens.token_type_ids, task=task,
                   token_states=token_states)

    @classmethod
    def from_lengths(cls, token_ids: np.ndarray, lengths: np.ndarray, task: Task = "embed",
                     token_type_ids: np.ndarray | None = None, token_states: bool = False) -> Batch:
        return cls.of(ragged.from_lengths(token_ids, lengths, token_type_ids), task, token_states)

    @classmethod
    def from_sequences(cls, sequences: Sequence[np.ndarray] | Sequence[Sequence[int]],
                       task: Task = "embed") -> Batch:
        return cls.of(ragged.from_sequences(sequences), task)


def check_batch(batch: Batch, info: ModelInfo) -> None:
    """Raise InvalidInput unless the model can run ``batch``."""
    validate.check_task(batch.task, info.task, info.model_id)
    validate.check_ragged(batch)
    validate.check_fits_model(batch, info)
