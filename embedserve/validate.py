"""The input checks every tier runs, each with one message wherever it runs.

Owns the rules a ``RaggedBatch`` must meet (its layout, ids inside the
vocabulary, sequences inside the position table, segment ids inside the
type vocabulary) and the range of the Matryoshka ``dimensions`` option. The
gateway runs them on what a client sent, the scheduler on what arrives over
gRPC, the engine on what it is asked to run. The message comes from here, so
a client reads the same words whichever tier caught the input.

Messages therefore name sequences by index, never by a tier's field name;
``field`` (``input``, ``tokens``, ``batch``) goes into the error's ``field``
(HTTP's ``error.param``): ``{field}[i]`` for one sequence,
``{field}.lengths`` / ``{field}.cu_seqlens`` / ``{field}.token_type_ids``
for the layout. Knows no model type: limits come in as numbers or as any
object with the ``ModelLimits`` attributes.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from embedserve.errors import InputTooLong, InvalidInput
from embedserve.ragged import RaggedBatch


class ModelLimits(Protocol):
    """What a batch is checked against (``embedserve.model.ModelInfo`` has these)."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def max_positions(self) -> int: ...      # longest sequence, specials included

    @property
    def type_vocab_size(self) -> int: ...    # segment ids accepted


def check_ragged(batch: RaggedBatch, field: str = "batch") -> None:
    """InvalidInput unless ``batch`` is well formed: int32 arrays, B >= 1, no empty sequence."""
    ids, cu_seqlens = batch.token_ids, batch.cu_seqlens
    if ids.ndim != 1 or cu_seqlens.ndim != 1:
        raise InvalidInput("token_ids and cu_seqlens must be one-dimensional",
                           field=f"{field}.cu_seqlens")
    if ids.dtype != np.int32 or cu_seqlens.dtype != np.int32:
        raise InvalidInput(f"token_ids and cu_seqlens must be int32, not {ids.dtype} and "
                           f"{cu_seqlens.dtype}", field=f"{field}.cu_seqlens")
    check_cu_seqlens(cu_seqlens, batch.num_tokens, field)
    check_token_types(batch.token_type_ids, batch.num_tokens, field)


def check_token_types(types: np.ndarray | None, num_tokens: int, field: str = "batch") -> None:
    """InvalidInput unless segment ids are absent or one per token id."""
    if types is not None and types.shape != (num_tokens,):
        raise InvalidInput(f"token_type_ids holds {types.shape[0] if types.ndim else 0} entries "
                           f"for {num_tokens} token ids", field=f"{field}.token_type_ids")


def check_cu_seqlens(cu_seqlens: np.ndarray, num_tokens: int, field: str = "batch") -> None:
    """InvalidInput unless ``cu_seqlens`` [B+1] starts at 0, grows by >= 1 and ends at T
    (any integer dtype; the steps are taken in int64)."""
    if cu_seqlens.shape[0] < 2:
        raise InvalidInput("no sequences: a batch needs at least one", field=f"{field}.lengths")
    if int(cu_seqlens[0]) != 0:
        raise InvalidInput(f"cu_seqlens must start at 0, not {int(cu_seqlens[0])}",
                           field=f"{field}.cu_seqlens")
    cu_seqlens = cu_seqlens.astype(np.int64, copy=False)
    check_sequence_lengths(cu_seqlens[1:] - cu_seqlens[:-1], num_tokens, field)


def check_sequence_lengths(lengths: np.ndarray, num_tokens: int, field: str = "batch") -> None:
    """InvalidInput unless there are B >= 1 ``lengths``, each >= 1, adding up to ``num_tokens``."""
    if lengths.shape[0] == 0:
        raise InvalidInput("no sequences: a batch needs at least one", field=f"{field}.lengths")
    if int(lengths.min()) < 1:
        index = int(np.argmin(lengths))
        raise InvalidInput(f"sequence {index} has {int(lengths[index])} tokens; every sequence "
                           "needs at least one", field=f"{field}.lengths")
    total = int(lengths.sum(dtype=np.int64))
    if total != num_tokens:
        raise InvalidInput(f"the sequence lengths add up to {total}, but there are "
                           f"{num_tokens} token ids", field=f"{field}.lengths")


def check_fits_model(batch: RaggedBatch, model: ModelLimits, field: str = "batch") -> None:
    """A well-formed batch against a model: ids, lengths and segment ids in range."""
    check_token_ids(batch.token_ids, batch.cu_seqlens, model.vocab_size, field)
    check_lengths(batch.lengths, model.max_positions, field)
    if batch.token_type_ids is not None:
        check_token_type_ids(batch.token_type_ids, batch.cu_seqlens, model.type_vocab_size, field)


def check_token_ids(token_ids: np.ndarray, cu_seqlens: np.ndarray, vocab_size: int,
                    field: str = "batch") -> None:
    """InvalidInput naming the first sequence with an id outside [0, vocab_size)."""
    position = _first_outside(token_ids, vocab_size)
    if position is not None:
        raise outside_vocabulary(_sequence_of(position, cu_seqlens), int(token_ids[position]),
                                 vocab_size, field)


def outside_vocabulary(sequence: int, token_id: int, vocab_size: int,
                       field: str = "batch") -> InvalidInput:
    """The error for ``token_id`` in sequence ``sequence``; for ids too large for any array."""
    return InvalidInput(f"sequence {sequence} has token id {token_id}, outside the vocabulary "
                        f"[0, {vocab_size})", field=f"{field}[{sequence}]")


def check_token_type_ids(token_type_ids: np.ndarray, cu_seqlens: np.ndarray,
                         type_vocab_size: int, field: str = "batch") -> None:
    position = _first_outside(token_type_ids, type_vocab_size)
    if position is not None:
        sequence = _sequence_of(position, cu_seqlens)
        raise InvalidInput(f"token_type_ids must lie in [0, {type_vocab_size}); sequence "
                           f"{sequence} has {int(token_type_ids[position])}",
                           field=f"{field}.token_type_ids")


def check_lengths(lengths: np.ndarray, max_positions: int, field: str = "batch") -> None:
    """InputTooLong naming the first sequence longer than ``max_positions`` (specials included)."""
    if lengths.size == 0 or int(lengths.max()) <= max_positions:
        return   # the common case, in one reduction
    too_long = np.flatnonzero(lengths > max_positions)
    if too_long.size:
        index = int(too_long[0])
        length = int(lengths[index])
        more = f" ({too_long.size} sequences are too long)" if too_long.size > 1 else ""
        raise InputTooLong(f"sequence {index} has {length} tokens; the model takes at most "
                           f"{max_positions}{more}", index=index, length=length,
                           limit=max_positions, field=f"{field}[{index}]")


def check_dimensions(dimensions: int, model_dimension: int, field: str = "dimensions") -> None:
    """InvalidInput unless a Matryoshka cut to ``dimensions`` fits the model's vectors."""
    if not 1 <= dimensions <= model_dimension:
        raise InvalidInput(f"{field} must lie in [1, {model_dimension}], got {dimensions}",
                           field=field)


def check_task(task: str, served_task: str, model_id: str) -> None:
    """InvalidInput when a batch asks a model for a task it does not do."""
    if task != served_task:
        raise InvalidInput(f"model {model_id} does task {served_task!r}, not {task!r}")


def _first_outside(values: np.ndarray, limit: int) -> int | None:
    """Index of the first value outside [0, limit), or None (min/max first: no mask when valid)."""
    if values.size == 0 or (int(values.min()) >= 0 and int(values.max()) < limit):
        return None
    return int(np.flatnonzero((values < 0) | (values >= limit))[0])


def _sequence_of(position: int, cu_seqlens: np.ndarray) -> int:
    return int(np.searchsorted(cu_seqlens, position, side="right")) - 1
