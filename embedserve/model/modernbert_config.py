"""ModernBERT's ``config.json``: the sizes, attention pattern and RoPE bases.

Owns turning a ModernBERT config (the hub's spelling, ``global_attn_every_n_layers``
/ ``global_rope_theta`` / ``local_rope_theta``, or transformers 5's
``layer_types`` / ``rope_parameters``) into a frozen ``ModernBertConfig``.
Knows nothing about weights or execution. ``config.py`` calls
``parse_modernbert_config`` for the architectures in ``ARCHITECTURES``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from embedserve.errors import ModelLoadError

# architecture name -> task
ARCHITECTURES: dict[str, str] = {"ModernBertModel": "embed"}

GLOBAL, LOCAL = "full_attention", "sliding_attention"
_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
# Defaults of transformers' ModernBertConfig (4.48 and 5.x agree).
_GLOBAL_ROPE_THETA, _LOCAL_ROPE_THETA, _GLOBAL_EVERY = 160_000.0, 10_000.0, 3


@dataclass(frozen=True)
class ModernBertConfig:
    """What a ModernBERT encoder needs; the fields ModelInfo reads match EncoderConfig's."""

    architecture: str
    task: str                          # "embed"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int             # GeGLU width: Wi projects to twice this
    max_position_embeddings: int
    norm_eps: float
    hidden_act: str
    layer_types: tuple[str, ...]       # per layer: GLOBAL or LOCAL
    local_window: int                  # ``local_attention``: a token sees |i - j| <= window // 2
    global_rope_theta: float
    local_rope_theta: float
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    family: str = "modernbert"
    type_vocab_size: int = 1           # no segment embeddings: only type id 0 is meaningful
    position_offset: int = 0           # RoPE positions count from 0 in every sequence
    num_labels: int = 1

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def max_positions(self) -> int:
        return self.max_position_embeddings


def _layer_types(raw: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    if raw.get("layer_types"):
        types = tuple(str(t) for t in raw["layer_types"])
        unknown = sorted(set(types) - {GLOBAL, LOCAL})
        if unknown or len(types) != num_layers:
            raise ModelLoadError(f"bad layer_types {list(types)} for {num_layers} layers")
        return types
    every = int(raw.get("global_attn_every_n_layers") or _GLOBAL_EVERY)
    # As transformers: layer i is global when i % every == 0 (layer 0 always is).
    return tuple(LOCAL if i % every else GLOBAL for i in range(num_layers))


def _rope_thetas(raw: dict[str, Any]) -> tuple[float, float]:
    params = raw.get("rope_parameters") or {}
    global_theta = (params.get(GLOBAL) or {}).get("rope_theta") or raw.get("global_rope_theta")
    global_theta = float(global_theta or _GLOBAL_ROPE_THETA)
    local_theta = (params.get(LOCAL) or {}).get("rope_theta")
    if local_theta is None:
        # The hub's configs write local_rope_theta; null there means "the global one"
        # (transformers 4.48's rule), absent means the default.
        local_theta = raw.get("local_rope_theta", _LOCAL_ROPE_THETA)
        local_theta = global_theta if local_theta is None else local_theta
    for kind in (GLOBAL, LOCAL):
        rope_type = (params.get(kind) or {}).get("rope_type", "default")
        if rope_type != "default":
            raise ModelLoadError(f"unsupported RoPE type {rope_type!r} for {kind} layers")
    if raw.get("rope_scaling"):
        raise ModelLoadError(f"unsupported rope_scaling {raw['rope_scaling']!r}")
    return global_theta, float(local_theta)


def parse_modernbert_config(raw: dict[str, Any], architecture: str, where: str) -> ModernBertConfig:
    """``raw`` is config.json's content; ``where`` names it in errors."""
    hidden_act = raw.get("hidden_activation", "gelu")
    if hidden_act not in _ACTIVATIONS:
        raise ModelLoadError(f"{where}: unsupported hidden_activation {hidden_act!r}")
    try:
        num_layers = int(raw["num_hidden_layers"])
        global_theta, local_theta = _rope_thetas(raw)
        config = ModernBertConfig(
            architecture=architecture, task=ARCHITECTURES[architecture],
            vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
            num_layers=num_layers, num_heads=int(raw["num_attention_heads"]),
            intermediate_size=int(raw["intermediate_size"]),
            max_position_embeddings=int(raw.get("max_position_embeddings", 8192)),
            norm_eps=float(raw.get("norm_eps", 1e-5)), hidden_act=hidden_act,
            layer_types=_layer_types(raw, num_layers),
            local_window=int(raw.get("local_attention", 128)),
            global_rope_theta=global_theta, local_rope_theta=local_theta,
            norm_bias=bool(raw.get("norm_bias", False)),
            attention_bias=bool(raw.get("attention_bias", False)),
            mlp_bias=bool(raw.get("mlp_bias", False)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{where}: bad or missing field {exc}") from None
    if config.hidden_size % config.num_heads or config.head_dim % 2:
        raise ModelLoadError(f"{where}: hidden_size / num_attention_heads must be an even integer (RoPE)")
    if config.local_window < 0:
        raise ModelLoadError(f"{where}: local_attention must be >= 0")
    return config
