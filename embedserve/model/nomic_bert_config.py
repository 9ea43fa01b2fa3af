"""NomicBERT's ``config.json`` (nomic-embed-text-v1 / v1.5, nomic-bert-2048), in either spelling.

Owns reading the two ways such a file is written into one ``NomicBertConfig``:

- the hub's remote-code spelling (``nomic-ai/nomic-bert-2048``'s
  ``configuration_hf_nomic_bert.py``, GPT-2 style): ``n_embd``, ``n_head``,
  ``n_layer``, ``n_inner``, ``n_positions``, ``layer_norm_epsilon``,
  ``rotary_emb_base``, ``activation_function: "swiglu"`` and bias / norm flags;
- transformers' own ``NomicBertConfig`` (native since transformers 5):
  ``hidden_size`` ... ``rope_parameters.rope_theta``, ``hidden_act: "silu"``.

Only what the released embedders use is accepted; everything else is refused
at load with the field named: pre-norm blocks, partial or interleaved
rotary, rotary scaling, an activation other than SwiGLU. Knows nothing about
weights or execution.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from embedserve.errors import ModelLoadError

ARCHITECTURES: dict[str, str] = {"NomicBertModel": "embed"}
_DEFAULT_THETA = 1000.0                # transformers' NomicBertConfig.default_theta


@dataclass(frozen=True)
class NomicBertConfig:
    """What a NomicBERT encoder needs; the fields ModelInfo reads match EncoderConfig's."""

    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int             # SwiGLU width (fc11 / fc12 outputs)
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    rope_theta: float
    qkv_bias: bool = False
    mlp_fc1_bias: bool = False
    mlp_fc2_bias: bool = False
    task: str = "embed"
    family: str = "nomic-bert"
    position_offset: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def max_positions(self) -> int:
        return self.max_position_embeddings


def _refuse_unsupported(raw: dict[str, Any]) -> None:
    if raw.get("prenorm"):
        raise ModelLoadError("config.json: unsupported prenorm true (pre-norm NomicBERT blocks)")
    activation = raw.get("activation_function", raw.get("hidden_act", "swiglu"))
    if activation not in ("swiglu", "silu"):
        raise ModelLoadError(f"config.json: unsupported activation {activation!r}; supported: swiglu")
    if float(raw.get("rotary_emb_fraction", 1.0)) != 1.0:
        raise ModelLoadError("config.json: unsupported rotary_emb_fraction other than 1.0")
    if raw.get("rotary_emb_interleaved"):
        raise ModelLoadError("config.json: unsupported rotary_emb_interleaved true")
    if raw.get("rotary_scaling_factor") or raw.get("rotary_emb_scale_base"):
        raise ModelLoadError("config.json: unsupported rotary scaling (rotary_scaling_factor)")
    rope_type = (raw.get("rope_parameters") or {}).get("rope_type", "default")
    if rope_type != "default":
        raise ModelLoadError(f"config.json: unsupported rope_type {rope_type!r}; supported: default")


def _first(raw: dict[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if raw.get(name) is not None:
            return raw[name]
    if default is None:
        raise KeyError(names[0])
    return default


def parse_nomic_bert_config(raw: dict[str, Any], architecture: str) -> NomicBertConfig:
    _refuse_unsupported(raw)
    try:
        hidden = int(_first(raw, "n_embd", "hidden_size"))
        theta = _first(raw, "rotary_emb_base", default=(raw.get("rope_parameters") or {}).get(
            "rope_theta", _DEFAULT_THETA))
        config = NomicBertConfig(
            architecture=architecture, vocab_size=int(raw["vocab_size"]), hidden_size=hidden,
            num_layers=int(_first(raw, "n_layer", "num_hidden_layers")),
            num_heads=int(_first(raw, "n_head", "num_attention_heads")),
            intermediate_size=int(_first(raw, "n_inner", "intermediate_size", default=4 * hidden)),
            max_position_embeddings=int(_first(raw, "n_positions", "max_position_embeddings", default=2048)),
            type_vocab_size=int(raw.get("type_vocab_size", 2)),
            layer_norm_eps=float(_first(raw, "layer_norm_epsilon", "layer_norm_eps", default=1e-12)),
            rope_theta=float(theta), qkv_bias=bool(raw.get("qkv_proj_bias", False)),
            mlp_fc1_bias=bool(raw.get("mlp_fc1_bias", False)),
            mlp_fc2_bias=bool(raw.get("mlp_fc2_bias", False)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"config.json: bad or missing field {exc}") from None
    if config.hidden_size % config.num_heads or config.head_dim % 2:
        raise ModelLoadError("config.json: hidden size / heads must be an even integer (rotary)")
    return config
