"""Gemma3's text ``config.json`` (EmbeddingGemma): sizes, layer pattern, windows and RoPE bases.

Owns turning a ``Gemma3TextModel`` config (the hub's spelling, ``rope_theta`` /
``rope_local_base_freq`` / ``sliding_window_pattern``, or transformers 5's
``rope_parameters`` per layer type) into a frozen ``Gemma3Config``. Knows nothing
about weights or execution.

The attention window follows transformers: with ``use_bidirectional_attention``
(EmbeddingGemma) a sliding layer's token sees keys at ``|i - j| <= sliding_window // 2``
(transformers halves the file's window for the bidirectional case); causal, keys
``0 <= i - j < sliding_window``. Logit soft-capping and RoPE scaling are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from embedserve.errors import ModelLoadError

ARCHITECTURES: dict[str, str] = {"Gemma3TextModel": "embed"}
FULL, SLIDING = "full_attention", "sliding_attention"
# transformers' Gemma3TextConfig defaults
_GLOBAL_THETA, _LOCAL_THETA, _PATTERN = 1_000_000.0, 10_000.0, 6


@dataclass(frozen=True)
class Gemma3Config:
    """What a Gemma3 text encoder needs; the fields ModelInfo reads match EncoderConfig's."""

    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    query_pre_attn_scalar: float
    layer_types: tuple[str, ...]       # per layer: FULL or SLIDING
    sliding_window: int                # as the file writes it
    bidirectional: bool
    global_rope_theta: float
    local_rope_theta: float
    attention_bias: bool = False
    hidden_act: str = "gelu_pytorch_tanh"
    task: str = "embed"
    family: str = "gemma3"
    type_vocab_size: int = 1
    position_offset: int = 0

    @property
    def max_positions(self) -> int:
        return self.max_position_embeddings

    @property
    def window(self) -> int:
        """Largest |i - j| a sliding layer's query attends over (see the module docstring)."""
        return self.sliding_window // 2 if self.bidirectional else self.sliding_window - 1


def _rope_thetas(raw: dict[str, Any]) -> tuple[float, float]:
    params = raw.get("rope_parameters") or {}
    if raw.get("rope_scaling"):
        raise ModelLoadError(f"config.json: unsupported rope_scaling {raw['rope_scaling']!r}")
    for kind in (FULL, SLIDING):
        rope_type = (params.get(kind) or {}).get("rope_type", "default")
        if rope_type != "default":
            raise ModelLoadError(f"config.json: unsupported rope_type {rope_type!r} for {kind} layers")
    global_theta = (params.get(FULL) or {}).get("rope_theta") or raw.get("rope_theta") or _GLOBAL_THETA
    local_theta = ((params.get(SLIDING) or {}).get("rope_theta") or raw.get("rope_local_base_freq")
                   or _LOCAL_THETA)
    return float(global_theta), float(local_theta)


def _layer_types(raw: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    if raw.get("layer_types"):
        types = tuple(str(t) for t in raw["layer_types"])
        if set(types) - {FULL, SLIDING} or len(types) != num_layers:
            raise ModelLoadError(f"config.json: bad layer_types {list(types)} for {num_layers} layers")
        return types
    pattern = int(raw.get("sliding_window_pattern") or _PATTERN)
    return tuple(SLIDING if (i + 1) % pattern else FULL for i in range(num_layers))


def parse_gemma3_config(raw: dict[str, Any], architecture: str) -> Gemma3Config:
    for cap in ("attn_logit_softcapping", "final_logit_softcapping"):
        if raw.get(cap) is not None and cap == "attn_logit_softcapping":
            raise ModelLoadError(f"config.json: unsupported {cap} {raw[cap]!r}")
    hidden_act = raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"
    if hidden_act not in ("gelu_pytorch_tanh", "gelu_new"):
        raise ModelLoadError(f"config.json: unsupported hidden_activation {hidden_act!r}")
    try:
        num_layers = int(raw["num_hidden_layers"])
        num_heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        head_dim = int(raw.get("head_dim") or hidden // num_heads)
        global_theta, local_theta = _rope_thetas(raw)
        config = Gemma3Config(
            architecture=architecture, vocab_size=int(raw["vocab_size"]), hidden_size=hidden,
            num_layers=num_layers, num_heads=num_heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or num_heads), head_dim=head_dim,
            intermediate_size=int(raw["intermediate_size"]),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            query_pre_attn_scalar=float(raw.get("query_pre_attn_scalar") or head_dim),
            layer_types=_layer_types(raw, num_layers),
            sliding_window=int(raw.get("sliding_window") or 4096),
            bidirectional=bool(raw.get("use_bidirectional_attention", False)),
            global_rope_theta=global_theta, local_rope_theta=local_theta,
            attention_bias=bool(raw.get("attention_bias", False)), hidden_act=str(hidden_act))
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"config.json: bad or missing field {exc}") from None
    if config.num_heads % config.num_kv_heads or config.head_dim % 2:
        raise ModelLoadError("config.json: num_attention_heads must be a multiple of num_key_value_heads "
                             "and head_dim even")
    return config
