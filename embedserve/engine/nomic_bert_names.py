"""NomicBERT checkpoint names -> modules/nomic_bert.py's NomicBertModel names.

The hub's spelling (``encoder.layers.3.attn.Wqkv.weight``, ``mlp.fc11`` / ``fc12`` /
``fc2``, ``norm1`` / ``norm2``, ``emb_ln``), which transformers' NomicBertModel also
writes on save; fc11 (the value) and fc12 (the gate) are fused into ``mlp_in``.
A masked-LM head (``cls.*``) is dropped; a ``bert.`` prefix is accepted.
"""

from __future__ import annotations

import re

import torch

from embedserve.errors import ModelLoadError

_LAYER = re.compile(r"^encoder\.layers\.(\d+)\.(.+)\.(weight|bias)$")
_LAYER_NAMES = {"attn.Wqkv": "qkv", "attn.out_proj": "attn_out", "norm1": "attn_norm",
                "mlp.fc2": "mlp_out", "norm2": "mlp_norm"}
_TOP = {"embeddings.word_embeddings": "word", "embeddings.token_type_embeddings": "token_type",
        "emb_ln": "embed_norm"}


def map_nomic_bert_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    mapped: dict[str, torch.Tensor] = {}
    gated: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for raw_name, tensor in tensors.items():
        name = raw_name.removeprefix("bert.")
        layer = _LAYER.match(name)
        if layer:
            index, module, param = int(layer.group(1)), layer.group(2), layer.group(3)
            if module in _LAYER_NAMES:
                mapped[f"layers.{index}.{_LAYER_NAMES[module]}.{param}"] = tensor
            elif module in ("mlp.fc11", "mlp.fc12"):
                gated.setdefault((index, param), {})[module] = tensor
            continue
        stem, _, param = name.rpartition(".")
        if stem in _TOP:
            mapped[f"{_TOP[stem]}.{param}"] = tensor
    for (index, param), parts in gated.items():
        if set(parts) != {"mlp.fc11", "mlp.fc12"}:
            raise ModelLoadError(f"layer {index} has mlp {param} for only {sorted(parts)}")
        mapped[f"layers.{index}.mlp_in.{param}"] = torch.cat([parts["mlp.fc11"], parts["mlp.fc12"]], dim=0)
    return mapped
