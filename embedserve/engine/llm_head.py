"""An LLM reranker's score row, made from its checkpoint's LM head at load.

Owns turning a decoder reranker's checkpoint into DecoderModel's ``head.weight``
([1, hidden]): a converted ``*ForSequenceClassification`` stores it as ``score.weight``;
a Qwen3-Reranker (a causal LM, model/llm_reranker.py) has only its LM head, whose
"yes" and "no" rows give ``logit_yes - logit_no = h . (w_yes - w_no)``: one row, so
a step never computes the vocabulary-wide projection. A checkpoint with tied
embeddings stores no ``lm_head.weight``: the token embeddings are the LM head.
"""

from __future__ import annotations

import torch

from embedserve.errors import ModelLoadError


def add_score_head(config, tensors: dict[str, torch.Tensor],
                   mapped: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``mapped`` plus ``head.weight`` for a decoder reranker (others: unchanged)."""
    if getattr(config, "task", "") != "score":
        return mapped
    score = tensors.get("score.weight")
    if score is not None:
        return {**mapped, "head.weight": score}
    if config.score_tokens is None:
        raise ModelLoadError("a decoder reranker's checkpoint lacks score.weight")
    lm_head = tensors.get("lm_head.weight")
    if lm_head is None:
        lm_head = mapped.get("embed.weight")
    if lm_head is None:
        raise ModelLoadError("a yes/no reranker's checkpoint lacks lm_head.weight and token embeddings")
    yes, no = config.score_tokens
    if max(yes, no) >= lm_head.shape[0]:
        raise ModelLoadError(f"the yes/no token ids {yes}, {no} lie outside the LM head's "
                             f"{lm_head.shape[0]} rows")
    return {**mapped, "head.weight": (lm_head[yes].float() - lm_head[no].float())[None, :]}
