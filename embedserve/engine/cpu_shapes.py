"""Token-count shapes for CPU steps: a few buckets instead of one shape per token count.

Owns rounding a packed batch's token count up to a bucket by appending
padding sequences. Why: oneDNN builds (JIT-compiles) a matmul primitive for
every distinct row count it sees and keeps up to 1,024 of them per process,
and a replica under mixed traffic sees every count from 1 to the token budget
(4 packed linears x 512 counts). Measured with ``python -m bench soak`` and an
engine-only loop (BENCHMARKS.md, "Replica memory under a mixed soak"): the
replica's resident memory roughly doubled within ~1,000 steps with exact
counts and stays near its warm-up size with buckets.

The padding sequences are whole sequences of their own, so under every
attention implementation they never mix with the real ones (attention stays
inside a sequence); the step's output keeps only the real sequences' rows.
Buckets: powers of two up to 8, multiples of 8 up to 64 and of 16 up to 128
(a query's step time grows with its rows: a 20-token query runs 24 rows, not
32; a 33-token one 40, not 64), then the CUDA graphs' token buckets
(``graphs/shapes.py``: multiples of 64 up to 1024, then of 256; at most 63
extra tokens in a 512-token step): 21 shapes for a 512-token budget. Knows
nothing about models beyond their position limit.
"""

from __future__ import annotations

import numpy as np

from embedserve.engine.batch import Batch
from embedserve.engine.graphs.shapes import TOKEN_STEP_SMALL, token_bucket

# The token id padding sequences carry: 0 is in every vocabulary; its value is never read back.
_PAD_ID = 0
# Below the graphs' buckets: (largest count, step); counts up to 8 round to a power of two.
_SMALL_STEPS = ((TOKEN_STEP_SMALL, 8), (2 * TOKEN_STEP_SMALL, 16))


def cpu_token_bucket(num_tokens: int) -> int:
    """The bucket ``num_tokens`` rounds up to (``num_tokens`` itself when it is one)."""
    if num_tokens <= 0:
        return num_tokens
    if num_tokens <= 8:
        return 1 << (num_tokens - 1).bit_length()
    for largest, step in _SMALL_STEPS:
        if num_tokens <= largest:
            return -(-num_tokens // step) * step
    return token_bucket(num_tokens)


def pad_to_bucket(batch: Batch, max_length: int) -> Batch:
    """``batch`` plus padding sequences (each at most ``max_length`` tokens) up to its bucket.

    The real sequences keep their indices 0..B-1; the padding follows them.
    """
    missing = cpu_token_bucket(batch.num_tokens) - batch.num_tokens
    if missing == 0:
        return batch
    full, rest = divmod(missing, max_length)
    pad_lengths = np.array([max_length] * full + ([rest] if rest else []), dtype=np.int32)
    token_ids = np.concatenate([batch.token_ids, np.full(missing, _PAD_ID, dtype=batch.token_ids.dtype)])
    cu_seqlens = np.concatenate([batch.cu_seqlens,
                                 batch.cu_seqlens[-1] + np.cumsum(pad_lengths, dtype=batch.cu_seqlens.dtype)])
    token_type_ids = (None if batch.token_type_ids is None else
                      np.concatenate([batch.token_type_ids, np.zeros(missing, batch.token_type_ids.dtype)]))
    key_lengths = (None if batch.key_lengths is None else
                   np.concatenate([batch.key_lengths, pad_lengths.astype(batch.key_lengths.dtype)]))
    return Batch(token_ids, cu_seqlens, token_type_ids, task=batch.task, token_states=batch.token_states,
                 key_lengths=key_lengths)
