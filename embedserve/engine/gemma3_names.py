"""Gemma3 checkpoint names -> modules/gemma3.py's Gemma3Model names.

``layers.3.self_attn.q_proj.weight`` (a bare ``Gemma3TextModel``, as EmbeddingGemma
ships) or with a ``model.`` / ``model.language_model.`` prefix: Q, K and V fuse into
``qkv``, gate and up into ``gate_up``; each of the four per-layer norms keeps its own
name. An LM head is dropped.
"""

from __future__ import annotations

import re

import torch

from embedserve.errors import ModelLoadError

_LAYER = re.compile(r"^layers\.(\d+)\.(.+)\.(weight|bias)$")
_LAYER_NAMES = {"self_attn.o_proj": "attn_out", "self_attn.q_norm": "q_norm", "self_attn.k_norm": "k_norm",
                "mlp.down_proj": "down", "input_layernorm": "attn_norm",
                "post_attention_layernorm": "post_attn_norm", "pre_feedforward_layernorm": "mlp_norm",
                "post_feedforward_layernorm": "post_mlp_norm"}
_FUSED = {"qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "gate_up": ("mlp.gate_proj", "mlp.up_proj")}
_PART_OF = {part: fused for fused, parts in _FUSED.items() for part in parts}
_TOP = {"embed_tokens.weight": "embed.weight", "norm.weight": "norm.weight"}


def map_gemma3_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    mapped: dict[str, torch.Tensor] = {}
    parts: dict[tuple[int, str, str], dict[str, torch.Tensor]] = {}
    for raw_name, tensor in tensors.items():
        name = raw_name.removeprefix("model.").removeprefix("language_model.")
        layer = _LAYER.match(name)
        if layer:
            index, module, param = int(layer.group(1)), layer.group(2), layer.group(3)
            if module in _LAYER_NAMES:
                mapped[f"layers.{index}.{_LAYER_NAMES[module]}.{param}"] = tensor
            elif module in _PART_OF:
                parts.setdefault((index, _PART_OF[module], param), {})[module] = tensor
        elif name in _TOP:
            mapped[_TOP[name]] = tensor
    for (index, fused, param), found in parts.items():
        missing = [p for p in _FUSED[fused] if p not in found]
        if missing:
            raise ModelLoadError(f"layer {index} lacks {missing} for {fused} {param}")
        mapped[f"layers.{index}.{fused}.{param}"] = torch.cat([found[p] for p in _FUSED[fused]], dim=0)
    return mapped
