"""Static-shape inputs for a bucket, and the forward pass CUDA graphs capture.

Owns padding a packed batch up to a ``BucketKey`` so that every step of a
bucket has the same tensor shapes (what a CUDA graph replays), and the
forward over such padded inputs. Device-agnostic: CPU tests check that the
padded forward equals the unpadded one.

All inputs of a bucket travel as one int64 array (one host-to-device copy):

    [ token_ids Tb | position_ids Tb | token_type_ids Tb | seq_ids Tb | lengths R | starts R ]

with ``R = Bb + 1`` rows: Bb sequence rows plus one "dump" row that collects
the padding tokens. Padding tokens get seq id Bb, so in either static
attention layout (block-diagonal or padded rows, see ``bucket_attention``)
they see only each other and never a real sequence, and their pooled row is
sliced off. Padding sequence rows have length 0 and pool to 0. The varlen
layout (``varlen=True``) reads the same ``lengths`` row as its ``cu_seqlens``:
real rows, then the empty padding rows, then the dump row, in token order.
"""

from __future__ import annotations

import numpy as np
import torch

from embedserve.engine.batch import Batch
from embedserve.engine.graphs.shapes import BucketKey
from embedserve.engine.modules.attention import Attend, block_diagonal_from_seq_ids, padded_from_ids
from embedserve.engine.modules.forward import Model, pooled_forward
from embedserve.engine.modules.layout import layout_arrays
from embedserve.engine.modules.varlen_attention import varlen_from_lengths


def input_size(key: BucketKey) -> int:
    return 4 * key.tokens + 2 * (key.sequences + 1)


def bucket_inputs(batch: Batch, key: BucketKey, position_offset: int) -> np.ndarray:
    """The padded int64 input array of ``batch`` for ``key``."""
    tokens = key.tokens
    real_tokens, real_sequences = batch.num_tokens, batch.num_sequences
    assert real_tokens <= tokens and real_sequences <= key.sequences, "batch exceeds its bucket"
    flat = np.zeros(input_size(key), dtype=np.int64)
    ids, positions, types, seq_ids, lengths, starts = split(flat, key)
    seq_real, offsets = layout_arrays(batch.cu_seqlens)
    ids[:real_tokens] = batch.token_ids
    positions[:] = position_offset
    positions[:real_tokens] += offsets
    if batch.token_type_ids is not None:
        types[:real_tokens] = batch.token_type_ids
    seq_ids[:] = key.sequences                        # padding tokens -> the dump row
    seq_ids[:real_tokens] = seq_real
    lengths[:real_sequences] = np.diff(batch.cu_seqlens)
    lengths[key.sequences] = tokens - real_tokens
    starts[:real_sequences] = batch.cu_seqlens[:-1]
    return flat


def split(flat: np.ndarray | torch.Tensor, key: BucketKey) -> tuple:
    """Views (ids, positions, types, seq_ids, lengths, starts) into a flat input array."""
    t, r = key.tokens, key.sequences + 1
    return (flat[0:t], flat[t:2 * t], flat[2 * t:3 * t], flat[3 * t:4 * t],
            flat[4 * t:4 * t + r], flat[4 * t + r:4 * t + 2 * r])


def bucket_attention(model: Model, key: BucketKey, seq_ids: torch.Tensor,
                     positions: torch.Tensor, lengths: torch.Tensor, varlen: bool = False) -> Attend:
    """The attention layout for this bucket.

    varlen: the fused variable-length kernel (varlen_attention.py), whose cost
    is each sequence's own L squared. Otherwise the cheaper static masked layout:
    block-diagonal costs Tb^2 score entries per head, padded rows (Bb + 1) x L^2
    with L = min(Tb, max_positions): few long sequences favour the first, many
    sequences in a big bucket the second (and keep memory bounded).
    """
    kind = model.attention_kind
    # No row is longer than the model's positions: the kernel's grid follows this bound.
    longest = min(key.tokens, model.config.max_positions)
    if varlen:
        return varlen_from_lengths(lengths, longest, kind.causal, kind.window)
    if key.tokens ** 2 <= (key.sequences + 1) * longest ** 2:
        return block_diagonal_from_seq_ids(seq_ids, kind.causal, kind.window)
    offsets = positions - model.config.position_offset
    return padded_from_ids(seq_ids, offsets, lengths, longest, kind.causal, kind.window)


def bucket_forward(model: Model, flat: torch.Tensor, key: BucketKey, pooling: str,
                   varlen: bool = False) -> torch.Tensor:
    """Forward over padded inputs -> [Bb + 1, hidden] or [Bb + 1] (dump row last)."""
    ids, positions, types, seq_ids, lengths, starts = split(flat, key)
    attend = bucket_attention(model, key, seq_ids, positions, lengths, varlen)
    return pooled_forward(model, ids, positions, types, seq_ids, lengths, starts, attend, pooling)
