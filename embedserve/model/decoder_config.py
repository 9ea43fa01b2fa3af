"""The decoder (LLM-derived) embedder family's sizes: Qwen3, Qwen2, Llama, Mistral.

Owns reading a decoder's ``config.json`` into a ``DecoderConfig`` and the
architecture names this family answers to (``DECODER_ARCHITECTURES``, merged
into model/config.py's registry). Knows nothing about weights or execution.

The four share one shape (pre-norm RMSNorm layers, rotary positions,
grouped-query attention, SwiGLU feed-forward) and differ only in flags:
Qwen3 normalizes each head's q and k (``q_norm``/``k_norm``); Qwen2 has biases
on q, k and v; Llama may have ``attention_bias`` / ``mlp_bias``; Mistral may
limit attention to a ``sliding_window``.

Attention is causal unless ``config.json`` says ``"is_causal": false``: the
key transformers (>= 5.2) reads to run any decoder bidirectionally, used by
LLMs fine-tuned as bidirectional encoders. With a sliding window s, causal
attention sees keys at distance < s and bidirectional at distance <= s (as
transformers' masks do).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from embedserve.errors import ModelLoadError

# architecture or model_type -> family
DECODER_FAMILIES = {"Qwen3": "qwen3", "Qwen2": "qwen2", "Llama": "llama", "Mistral": "mistral"}
DECODER_MODEL_TYPES = {family: f"{prefix}Model" for prefix, family in DECODER_FAMILIES.items()}


@dataclass(frozen=True)
class DecoderConfig:
    """The sizes and flags of a decoder embedder, read from ``config.json``."""

    architecture: str
    family: str                    # "qwen3" | "qwen2" | "llama" | "mistral"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int              # < num_heads: grouped-query attention
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    qkv_bias: bool
    out_bias: bool                 # o_proj bias
    mlp_bias: bool
    qk_norm: bool                  # Qwen3: RMSNorm over each head of q and k
    causal: bool = True
    sliding_window: int | None = None
    task: str = "embed"            # "score": an LLM reranker (model/llm_reranker.py)
    type_vocab_size: int = 1       # no segment embeddings: only segment 0
    position_offset: int = 0
    # A yes/no reranker (a causal LM): the (yes, no) ids whose LM-head rows make its score head.
    score_tokens: tuple[int, int] | None = None

    @property
    def max_positions(self) -> int:
        return self.max_position_embeddings

    @property
    def pair_template(self) -> str:
        """How a reranker's (query, document) pairs become text (model/llm_reranker.py)."""
        return "qwen3_reranker" if self.task == "score" else ""

    @property
    def attention_window(self) -> int | None:
        """Largest |i - j| a query may attend over (None: unlimited)."""
        if self.sliding_window is None or self.sliding_window >= self.max_positions:
            return None
        return self.sliding_window - 1 if self.causal else self.sliding_window


def _family(architecture: str) -> str:
    for prefix, family in DECODER_FAMILIES.items():
        if architecture.startswith(prefix):
            return family
    raise ModelLoadError(f"{architecture!r} is not a decoder architecture")


def _rope_theta(raw: dict[str, Any]) -> float:
    # transformers >= 5 writes rope_parameters; hub checkpoints rope_theta / rope_scaling.
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type != "default":
        raise ModelLoadError(f"unsupported rope type {rope_type!r}; supported: default")
    return float(params.get("rope_theta") or raw.get("rope_theta") or 10000.0)


def _sliding_window(raw: dict[str, Any], family: str) -> int | None:
    if family == "mistral":
        window = raw.get("sliding_window")
        return None if window is None else int(window)
    layer_types = raw.get("layer_types") or []
    if raw.get("use_sliding_window") or "sliding_attention" in layer_types:
        # Qwen's per-layer windows (max_window_layers) are off in every released embedder.
        raise ModelLoadError(f"unsupported: {family} with use_sliding_window")
    return None


def parse_decoder_config(raw: dict[str, Any], architecture: str) -> DecoderConfig:
    """``config.json`` of a Qwen3 / Qwen2 / Llama / Mistral model -> DecoderConfig."""
    family = _family(architecture)
    hidden_act = raw.get("hidden_act", "silu")
    if hidden_act != "silu":
        raise ModelLoadError(f"unsupported hidden_act {hidden_act!r} for {family}; supported: silu")
    # Qwen2 always has q/k/v biases (never o_proj); Mistral never any bias.
    attention_bias = family in ("qwen3", "llama") and bool(raw.get("attention_bias", False))
    try:
        num_heads = int(raw["num_attention_heads"])
        hidden_size = int(raw["hidden_size"])
        config = DecoderConfig(
            architecture=architecture, family=family, vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden_size, num_layers=int(raw["num_hidden_layers"]), num_heads=num_heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_dim=int(raw.get("head_dim") or hidden_size // num_heads),
            intermediate_size=int(raw["intermediate_size"]),
            max_position_embeddings=int(raw["max_position_embeddings"]),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)), rope_theta=_rope_theta(raw),
            qkv_bias=family == "qwen2" or attention_bias, out_bias=attention_bias,
            mlp_bias=family == "llama" and bool(raw.get("mlp_bias", False)), qk_norm=family == "qwen3",
            causal=bool(raw.get("is_causal", True)), sliding_window=_sliding_window(raw, family))
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"config.json: bad or missing field {exc}") from None
    if config.num_heads % config.num_kv_heads:
        raise ModelLoadError("num_attention_heads is not a multiple of num_key_value_heads")
    if architecture.endswith("ForSequenceClassification"):
        # A converted LLM reranker (e.g. Qwen3-Reranker as Qwen3ForSequenceClassification):
        # one logit from the last token.
        num_labels = len(raw["id2label"]) if "id2label" in raw else int(raw.get("num_labels", 1))
        if num_labels != 1:
            raise ModelLoadError(f"{architecture}: served as a reranker, which needs exactly one "
                                 f"label; config has {num_labels}")
        config = replace(config, task="score")
    return config


DECODER_ARCHITECTURES = {f"{prefix}{suffix}": parse_decoder_config
                         for prefix in DECODER_FAMILIES for suffix in ("Model", "ForCausalLM")}
# Converted LLM rerankers (model/llm_reranker.py's prompt).
DECODER_ARCHITECTURES["Qwen3ForSequenceClassification"] = parse_decoder_config
