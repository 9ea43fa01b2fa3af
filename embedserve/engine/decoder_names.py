"""Hugging Face decoder checkpoint names -> modules/decoder.py's DecoderModel names.

Owns the Qwen3 / Qwen2 / Llama / Mistral spelling: ``model.layers.3.self_attn.q_proj.weight``
(a ``*ForCausalLM`` checkpoint) or ``layers.3.self_attn.q_proj.weight`` (a bare
``*Model``, as sentence-transformers saves Qwen3-Embedding) become
``layers.3.qkv.weight`` with Q, K and V fused, and gate / up projections
fuse into ``gate_up``. The LM head (``lm_head.*``) is dropped: embedders
never use it. Shape checks are weights.py's ``load_state``.
"""

from __future__ import annotations

import re

import torch

from embedserve.errors import ModelLoadError

_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
# HF layer-relative module -> ours (fused parts are handled separately)
_LAYER_NAMES = {
    "self_attn.o_proj": "attn_out",
    "self_attn.q_norm": "q_norm",
    "self_attn.k_norm": "k_norm",
    "mlp.down_proj": "down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "mlp_norm",
}
# fused module -> the HF modules concatenated into it, in order
_FUSED = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
}
_PART_OF = {part: fused for fused, parts in _FUSED.items() for part in parts}
_TOP_NAMES = {"embed_tokens": "embed", "norm": "norm"}


def map_decoder_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF decoder checkpoint names -> DecoderModel state-dict names (unknown keys dropped)."""
    mapped: dict[str, torch.Tensor] = {}
    fused_parts: dict[tuple[int, str, str], dict[str, torch.Tensor]] = {}
    for raw_name, tensor in tensors.items():
        name = raw_name.removeprefix("model.")
        stem, _, param = name.rpartition(".")
        layer = _LAYER.match(stem)
        if layer:
            index, module = int(layer.group(1)), layer.group(2)
            if module in _LAYER_NAMES:
                mapped[f"layers.{index}.{_LAYER_NAMES[module]}.{param}"] = tensor
            elif module in _PART_OF:
                fused_parts.setdefault((index, _PART_OF[module], param), {})[module] = tensor
        elif stem in _TOP_NAMES:
            mapped[f"{_TOP_NAMES[stem]}.{param}"] = tensor
    for (index, fused, param), parts in fused_parts.items():
        missing = [part for part in _FUSED[fused] if part not in parts]
        if missing:
            raise ModelLoadError(f"layer {index} has {param} for only some of {list(_FUSED[fused])}; "
                                 f"missing {missing}")
        mapped[f"layers.{index}.{fused}.{param}"] = torch.cat([parts[p] for p in _FUSED[fused]], dim=0)
    return mapped
