"""One forward pass over a packed batch: encoder, then pooling or scoring.

Shared by the CPU worker and the CUDA runner (eager and graph capture), so
both compute exactly the same function. Works on tensors already on the
device; knows nothing about threads, streams or graphs.
"""

from __future__ import annotations

import torch

from embedserve.engine.modules.attention import Attend
from embedserve.engine.modules.bert import EncoderModel
from embedserve.engine.modules.decoder import DecoderModel
from embedserve.engine.modules.pooling import last_token_pool, mean_pool

Model = EncoderModel | DecoderModel


def pooled_forward(model: Model, token_ids: torch.Tensor, position_ids: torch.Tensor,
                   token_type_ids: torch.Tensor, seq_ids: torch.Tensor, lengths: torch.Tensor,
                   starts: torch.Tensor, attend: Attend, pooling: str) -> torch.Tensor:
    """token_ids etc. [T]; lengths, starts [R] -> float32 [R, hidden] or logits [R].

    ``R`` rows may exceed the real sequence count (a CUDA-graph bucket): padding
    rows have length 0 and pool to zeros, and callers slice them off.
    """
    hidden = model(token_ids, position_ids, token_type_ids, attend)      # [T, hidden]
    rows = lengths.shape[0]
    if model.head is not None:
        return model.score(hidden[starts]).float()                       # [R]
    if pooling == "cls":
        pooled = hidden[starts].float()                                  # [R, hidden]
    elif pooling == "lasttoken":
        pooled = last_token_pool(hidden, starts, lengths)                # [R, hidden]
    else:
        pooled = mean_pool(hidden, seq_ids, lengths, rows)               # [R, hidden]
    # sentence-transformers' Dense modules (engine/dense.py), where the model has them
    projection = getattr(model, "projection", None)
    return pooled if projection is None else projection(pooled)          # [R, dim]
