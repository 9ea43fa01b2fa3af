"""SPLADE pooling on packed tokens: one vocabulary-sized vector per sequence.

What sentence-transformers' ``SpladePooling`` computes after an MLM head:
``pool_t log(1 + relu(logits[t]))`` over each sequence's tokens, ``pool`` max or
sum (``log1p`` applied twice for the ``log1p_relu`` activation). Its padded
path multiplies the logits by the attention mask before the activation, so a
padding position contributes 0, which max and sum over values >= 0 ignore:
a packed batch has no padding, and initialising each row with zeros gives the
same answer (rows of length 0, a CUDA-graph bucket's padding rows, stay 0).

The logits are ``[tokens, vocab]``; they are computed ``TOKEN_BLOCK`` tokens at a
time and reduced into the ``[R, vocab]`` answer at once, so a step's memory is
one block's logits, not all T tokens'. Knows nothing about files or devices.
"""

from __future__ import annotations

import torch
from torch import nn

# Tokens whose logits exist at once: 256 x 30,522 x 4 bytes = 31 MB (BERT's vocabulary).
TOKEN_BLOCK = 256


def splade_pool(mlm: nn.Module, hidden: torch.Tensor, seq_ids: torch.Tensor, rows: int,
                pooling: str) -> torch.Tensor:
    """hidden: [T, H]; seq_ids: [T] in [0, rows) -> float32 [rows, vocab], every value >= 0.

    ``pooling``: "splade_max" | "splade_sum", "_log1p" appended for the log1p_relu activation.
    """
    strategy = "sum" if pooling.startswith("splade_sum") else "max"
    twice = pooling.endswith("_log1p")
    vocab: int = mlm.decoder.out_features  # type: ignore[union-attr, assignment]  # an nn.Linear
    out = torch.zeros(rows, vocab, dtype=torch.float32, device=hidden.device)
    for start in range(0, hidden.shape[0], TOKEN_BLOCK):
        block = slice(start, start + TOKEN_BLOCK)
        weights = torch.log1p(torch.relu(mlm(hidden[block]).float()))      # [t, vocab]
        if twice:
            weights = torch.log1p(weights)
        if strategy == "max":
            targets = seq_ids[block, None].expand_as(weights)
            out.scatter_reduce_(0, targets, weights, "amax", include_self=True)
        else:
            out.index_add_(0, seq_ids[block], weights)
    return out
