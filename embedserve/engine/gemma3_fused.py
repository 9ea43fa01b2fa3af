"""Gemma3's linears on oneDNN-packed weights: onednn.py's CPU transform for this family.

Owns replacing the four linears of every modules/gemma3.py ``Layer`` (qkv, attn_out,
gate_up, down) by onednn.py's ``PackedWeight`` (reordered once at load, or a native
kernel's panels where one covers them). The RMSNorms (``1 + weight``), rotary angles
and the GeGLU product stay torch ops. Knows nothing about batching or attention;
CUDA models are never transformed.
"""

from __future__ import annotations

from embedserve.engine.modules.gemma3 import Gemma3Model
from embedserve.engine.onednn import PackedWeight, supported


def pack_gemma3_linears(model: Gemma3Model, native_linears: bool = True) -> bool:
    """Swap each layer's linears for PackedWeights in place; False (unchanged) if this
    CPU and dtype cannot run them. Call after the model has its final dtype (CPU)."""
    if not supported(next(model.parameters()).dtype):
        return False
    for layer in model.layers:
        for name in ("qkv", "attn_out", "gate_up", "down"):
            setattr(layer, name, PackedWeight(getattr(layer, name), native_linears))
    return True
