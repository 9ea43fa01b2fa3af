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
from embedserve.errors import InvalidInput
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
    # int32 [B]: how many of each sequence's first tokens every token attends to as keys; the
    # rest are attended to by none, though they get outputs (a ColBERT query's expansion
    # tokens: model/multivector.expand_queries). None: each sequence attends to all of itself.
    key_lengths: np.ndarray | None = None

    @classmethod
    def of(cls, tokens: RaggedBatch, task: Task = "embed", token_states: bool = False,
           key_lengths: np.ndarray | None = None) -> Batch:
        return cls(tokens.token_ids, tokens.cu_seqlens, tokens.token_type_ids, task=task,
                   token_states=token_states, key_lengths=key_lengths)

    @classmethod
    def from_lengths(cls, token_ids: np.ndarray, lengths: np.ndarray, task: Task = "embed",
                     token_type_ids: np.ndarray | None = None, token_states: bool = False,
                     key_lengths: np.ndarray | None = None) -> Batch:
        return cls.of(ragged.from_lengths(token_ids, lengths, token_type_ids), task, token_states, key_lengths)

    @classmethod
    def from_sequences(cls, sequences: Sequence[np.ndarray] | Sequence[Sequence[int]],
                       task: Task = "embed") -> Batch:
        return cls.of(ragged.from_sequences(sequences), task)


def check_batch(batch: Batch, info: ModelInfo) -> None:
    """Raise InvalidInput unless the model can run ``batch``."""
    validate.check_task(batch.task, info.task, info.model_id)
    validate.check_ragged(batch)
    validate.check_fits_model(batch, info)
    if batch.key_lengths is not None and (batch.key_lengths.shape != (batch.num_sequences,)
                                          or (batch.key_lengths < 1).any()
                                          or (batch.key_lengths > batch.lengths).any()):
        raise InvalidInput("key_lengths must give each sequence between 1 and its length of keys",
                           field="key_lengths")
