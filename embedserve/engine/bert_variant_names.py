"""MPNet and DistilBERT checkpoint names -> the BERT spelling weights.py maps.

Owns only the renaming: ``mpnet.encoder.layer.3.attention.attn.q.weight``
becomes ``encoder.layer.3.attention.self.query.weight`` and DistilBERT's
``transformer.layer.3.attention.q_lin.weight`` the same, then
``weights.map_hf_names(family="bert")`` fuses Q/K/V and names them as
modules/bert.py's. Neither family has segment embeddings: they get a one-row
zero table, so the shared embedding code adds nothing for them. MPNet's
relative-position bias table becomes ``relative_bias.weight``
(modules/mpnet.py). MPNet's ``lm_head`` is dropped; DistilBERT's masked-LM head
(``vocab_transform``, ``vocab_layer_norm``, ``vocab_projector``) takes BERT's
``cls.predictions`` names, which a DistilBERT SPLADE model's MaskedLMHead loads
(modules/bert.py: the same dense, activation, LayerNorm, decoder); an embedder
leaves them unused.
"""

from __future__ import annotations

import re

import torch

from embedserve.engine.weights import map_hf_names

_MPNET_LAYER = {
    "attention.attn.q": "attention.self.query",
    "attention.attn.k": "attention.self.key",
    "attention.attn.v": "attention.self.value",
    "attention.attn.o": "attention.output.dense",
    "attention.LayerNorm": "attention.output.LayerNorm",
}
_DISTILBERT_LAYER = {
    "attention.q_lin": "attention.self.query",
    "attention.k_lin": "attention.self.key",
    "attention.v_lin": "attention.self.value",
    "attention.out_lin": "attention.output.dense",
    "sa_layer_norm": "attention.output.LayerNorm",
    "ffn.lin1": "intermediate.dense",
    "ffn.lin2": "output.dense",
    "output_layer_norm": "output.LayerNorm",
}
# DistilBertForMaskedLM's head -> BertForMaskedLM's names (weights.map_hf_names maps those).
_DISTILBERT_MLM = {
    "vocab_transform.weight": "cls.predictions.transform.dense.weight",
    "vocab_transform.bias": "cls.predictions.transform.dense.bias",
    "vocab_layer_norm.weight": "cls.predictions.transform.LayerNorm.weight",
    "vocab_layer_norm.bias": "cls.predictions.transform.LayerNorm.bias",
    "vocab_projector.weight": "cls.predictions.decoder.weight",   # absent when tied to the embeddings
    "vocab_projector.bias": "cls.predictions.bias",
}
_LAYER = re.compile(r"^(?:encoder|transformer)\.layer\.(\d+)\.(.+)\.(weight|bias)$")


def _with_zero_segments(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    word = tensors["embeddings.word_embeddings.weight"]
    return {**tensors, "embeddings.token_type_embeddings.weight": word.new_zeros(1, word.shape[1])}


def _renamed(tensors: dict[str, torch.Tensor], prefix: str,
             layer_names: dict[str, str]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for raw_name, tensor in tensors.items():
        name = raw_name.removeprefix(prefix)
        layer = _LAYER.match(name)
        if layer and layer.group(2) in layer_names:
            name = f"encoder.layer.{layer.group(1)}.{layer_names[layer.group(2)]}.{layer.group(3)}"
        out[name] = tensor
    return out


def map_mpnet_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    renamed = _renamed(tensors, "mpnet.", _MPNET_LAYER)
    mapped = map_hf_names(_with_zero_segments(renamed), family="bert")
    if "encoder.relative_attention_bias.weight" in renamed:
        mapped["relative_bias.weight"] = renamed["encoder.relative_attention_bias.weight"]
    return mapped


def map_distilbert_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    renamed = _renamed(tensors, "distilbert.", _DISTILBERT_LAYER)
    renamed = {_DISTILBERT_MLM.get(name, name): tensor for name, tensor in renamed.items()}
    return map_hf_names(_with_zero_segments(renamed), family="bert")
