"""DeBERTa-v2 checkpoint names -> modules/deberta_v2.py's DebertaV2Model names.

``deberta.encoder.layer.3.attention.self.query_proj.weight`` takes BERT's spelling
(``...attention.self.query.weight``) and weights.py fuses Q/K/V as for BERT; the
embeddings, the reranker head (``pooler.dense`` / ``classifier``) likewise. What only
DeBERTa has: ``embeddings.embed_proj``, the relative-position table
``encoder.rel_embeddings`` and its norm ``encoder.LayerNorm``. A masked-LM head is dropped.
"""

from __future__ import annotations

import torch

from embedserve.engine.weights import map_hf_names

_RENAMES = {"attention.self.query_proj.": "attention.self.query.",
            "attention.self.key_proj.": "attention.self.key.",
            "attention.self.value_proj.": "attention.self.value."}
_OWN = {"embeddings.embed_proj.weight": "encoder.embeddings.embed_proj.weight",
        "encoder.rel_embeddings.weight": "encoder.rel_embeddings.weight",
        "encoder.LayerNorm.weight": "encoder.rel_norm.weight",
        "encoder.LayerNorm.bias": "encoder.rel_norm.bias"}


def map_deberta_v2_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    renamed: dict[str, torch.Tensor] = {}
    for raw_name, tensor in tensors.items():
        name = raw_name.removeprefix("deberta.")
        for old, new in _RENAMES.items():
            name = name.replace(old, new)
        renamed[name] = tensor
    mapped = map_hf_names(renamed, family="bert")
    mapped.update({ours: renamed[theirs] for theirs, ours in _OWN.items() if theirs in renamed})
    return mapped
