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
from embedserve.engine.modules.sparse import splade_pool

Model = EncoderModel | DecoderModel


def pooled_forward(model: Model, token_ids: torch.Tensor, position_ids: torch.Tensor,
                   token_type_ids: torch.Tensor, seq_ids: torch.Tensor, lengths: torch.Tensor,
                   starts: torch.Tensor, attend: Attend, pooling: str) -> torch.Tensor:
    """token_ids etc. [T]; lengths, starts [R] -> float32 [R, hidden], logits [R] (a
    reranker) or [R, labels] (a classifier), SPLADE weights [R, vocab] (a sparse encoder),
    or, for a multi-vector model, every token's vector [T, dim] (not one row per sequence).

    ``R`` rows may exceed the real sequence count (a CUDA-graph bucket): padding
    rows have length 0 and pool to zeros, and callers slice them off.
    """
    hidden = model(token_ids, position_ids, token_type_ids, attend)      # [T, hidden]
    return pool_hidden(model, hidden, seq_ids, lengths, starts, pooling)


def forward_with_token_states(model: Model, token_ids: torch.Tensor, position_ids: torch.Tensor,
                              token_type_ids: torch.Tensor, seq_ids: torch.Tensor, lengths: torch.Tensor,
                              starts: torch.Tensor, attend: Attend,
                              pooling: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``pooled_forward``'s rows and every token's last hidden state, float32 [T, hidden]:
    the encoder's output before pooling, normalization or Dense, which is transformers'
    ``last_hidden_state`` (TEI's ``/embed_all`` for an embedder). One encoder pass."""
    hidden = model(token_ids, position_ids, token_type_ids, attend)      # [T, hidden]
    return pool_hidden(model, hidden, seq_ids, lengths, starts, pooling), hidden.float()


def pool_hidden(model: Model, hidden: torch.Tensor, seq_ids: torch.Tensor, lengths: torch.Tensor,
                starts: torch.Tensor, pooling: str) -> torch.Tensor:
    """The encoder's output [T, hidden] -> the step's rows, as ``pooled_forward`` says."""
    rows = lengths.shape[0]
    projection = getattr(model, "projection", None)
    if getattr(model.config, "task", "") == "multivector":
        # Every token's vector, through the Dense modules as a MultiVectorEncoder applies
        # them (token-level); the replica splits, masks and normalizes them per sequence.
        tokens = hidden.float()
        return tokens if projection is None else projection(tokens)     # [T, dim]
    if model.head is not None:
        # Encoders score their first token; decoder rerankers ("lasttoken") their last.
        rows_at = (starts + lengths - 1).clamp(min=0) if pooling == "lasttoken" else starts
        return model.score(hidden[rows_at]).float()                      # [R] or [R, labels]
    mlm = getattr(model, "mlm", None)
    if mlm is not None:
        return splade_pool(mlm, hidden, seq_ids, rows, pooling)          # [R, vocab]
    if pooling == "cls":
        pooled = hidden[starts].float()                                  # [R, hidden]
    elif pooling == "lasttoken":
        pooled = last_token_pool(hidden, starts, lengths)                # [R, hidden]
    else:
        pooled = mean_pool(hidden, seq_ids, lengths, rows)               # [R, hidden]
    # sentence-transformers' Dense modules (engine/dense.py), where the model has them
    return pooled if projection is None else projection(pooled)          # [R, dim]
