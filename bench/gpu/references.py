"""The peers a GPU run compares against, fed the same token ids as the engine.

sentence-transformers (its Transformer + Pooling modules in float16, sequences sorted
by length and padded per batch as its ``encode`` does) and plain ``transformers`` with
SDPA attention (padded batches, the model's own pooling done here). Both read the same
model directory as the engine, so all systems compute the same function.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

Forward = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]   # (ids [B, L], mask [B, L]) -> [B, ...]


def sentence_transformers_forward(model_dir: Path, device: str, dtype: torch.dtype, task: str) -> Forward:
    """sentence-transformers' modules (or, for a cross-encoder, the sequence-classification
    model CrossEncoder wraps) as a function of padded ids."""
    if task == "score":
        from transformers import AutoModelForSequenceClassification

        classifier = AutoModelForSequenceClassification.from_pretrained(model_dir, torch_dtype=dtype)
        classifier = classifier.to(device).eval()
        return lambda ids, mask: classifier(input_ids=ids, attention_mask=mask).logits[:, 0]
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device=device, local_files_only=True)
    model = model.to(dtype).eval()
    return lambda ids, mask: model({"input_ids": ids, "attention_mask": mask})["sentence_embedding"]


def transformers_sdpa_forward(model_dir: Path, device: str, dtype: torch.dtype, task: str,
                              pooling: str) -> Forward:
    """``transformers`` with attn_implementation="sdpa", or "eager" for the families
    transformers has no SDPA path for (MPNet, DeBERTa-v2: a ValueError at load); pooling
    as the directory says."""
    import transformers

    if task == "score":
        cls = transformers.AutoModelForSequenceClassification
    else:
        cls = transformers.AutoModel
    try:
        model = cls.from_pretrained(model_dir, torch_dtype=dtype, attn_implementation="sdpa")
    except ValueError:
        model = cls.from_pretrained(model_dir, torch_dtype=dtype, attn_implementation="eager")
    model = model.to(device).eval()

    def forward(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = model(input_ids=ids, attention_mask=mask)
        if task == "score":
            return out.logits[:, 0]
        states = out.last_hidden_state
        if pooling == "cls":
            return states[:, 0]
        if pooling == "lasttoken":
            return states[torch.arange(states.shape[0], device=states.device), mask.sum(1) - 1]
        weights = mask.unsqueeze(-1).to(states.dtype)
        return (states * weights).sum(1) / weights.sum(1)

    return forward


def run_padded(forward: Forward, sequences: Sequence[np.ndarray], batch_size: int, device: str,
               pad_id: int = 0) -> None:
    """Every sequence through ``forward``, longest first in batches of ``batch_size``
    padded to their longest (sentence-transformers' ``encode`` order), waiting for the device."""
    order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i]))
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            chunk = [sequences[i] for i in order[start:start + batch_size]]
            width = max(len(s) for s in chunk)
            ids = np.full((len(chunk), width), pad_id, dtype=np.int64)
            mask = np.zeros((len(chunk), width), dtype=np.int64)
            for row, sequence in enumerate(chunk):
                ids[row, :len(sequence)] = sequence
                mask[row, :len(sequence)] = 1
            forward(torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
