"""MPNet, DistilBERT and RoBERTa ``config.json`` files, read as BERT-shaped encoders.

Owns the three families whose layers are BERT's post-norm layers and whose
configs therefore become an ``EncoderConfig`` (model/config.py), each under
its own spelling:

- RoBERTa is XLM-R's code under another name (positions from padding_idx + 1);
- DistilBERT writes ``dim`` / ``n_layers`` / ``hidden_dim``, has no segment
  embeddings and fixes LayerNorm's eps at 1e-12;
- MPNet adds a relative-position bias shared by all layers
  (``MPNetConfig.relative_attention_num_buckets``) and, like RoBERTa, counts
  positions from ``padding_idx + 1`` (its padding_idx is always 1 in transformers).

Knows nothing about weights or execution; ``ARCHITECTURES`` joins
model/config.py's registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from embedserve.errors import ModelLoadError
from embedserve.model.config import EncoderConfig, parse_encoder_config

_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
# transformers computes MPNet's bias with 32 buckets over distances up to 128,
# whatever the config says (MPNetEncoder.compute_position_bias' defaults).
MPNET_BUCKETS, MPNET_MAX_DISTANCE = 32, 128


@dataclass(frozen=True)
class MPNetConfig(EncoderConfig):
    """An EncoderConfig plus the size of MPNet's relative-position bias table."""

    relative_attention_num_buckets: int = MPNET_BUCKETS


Config = TypeVar("Config", bound=EncoderConfig)


def _checked(config: Config) -> Config:
    if config.hidden_act not in _ACTIVATIONS:
        raise ModelLoadError(f"unsupported hidden_act {config.hidden_act!r}")
    if config.hidden_size % config.num_heads:
        raise ModelLoadError("hidden_size is not a multiple of num_attention_heads")
    return config


def parse_roberta_config(raw: dict[str, Any], architecture: str) -> EncoderConfig:
    """RobertaModel / RobertaForSequenceClassification: XLM-R's parser, RoBERTa's name."""
    xlmr_name = architecture.replace("Roberta", "XLMRoberta", 1)
    config = parse_encoder_config(raw, xlmr_name)
    return EncoderConfig(**{**config.__dict__, "architecture": architecture})


def parse_distilbert_config(raw: dict[str, Any], architecture: str) -> EncoderConfig:
    try:
        return _checked(EncoderConfig(
            architecture=architecture, family="distilbert", task="embed",
            vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["dim"]),
            num_layers=int(raw["n_layers"]), num_heads=int(raw["n_heads"]),
            intermediate_size=int(raw["hidden_dim"]),
            max_position_embeddings=int(raw.get("max_position_embeddings", 512)),
            type_vocab_size=1,                # no segment embeddings
            layer_norm_eps=1e-12,             # fixed in transformers' DistilBERT
            hidden_act=str(raw.get("activation", "gelu")), position_offset=0))
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"config.json: bad or missing field {exc}") from None


def parse_mpnet_config(raw: dict[str, Any], architecture: str) -> MPNetConfig:
    try:
        return _checked(MPNetConfig(
            architecture=architecture, family="mpnet", task="embed",
            vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
            num_layers=int(raw["num_hidden_layers"]), num_heads=int(raw["num_attention_heads"]),
            intermediate_size=int(raw["intermediate_size"]),
            max_position_embeddings=int(raw["max_position_embeddings"]),
            type_vocab_size=1,                # no segment embeddings
            layer_norm_eps=float(raw.get("layer_norm_eps", 1e-12)),
            hidden_act=str(raw.get("hidden_act", "gelu")),
            position_offset=2,                # padding_idx (1) + 1, as transformers' MPNet
            relative_attention_num_buckets=int(raw.get("relative_attention_num_buckets", 32))))
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"config.json: bad or missing field {exc}") from None


ARCHITECTURES: dict[str, Callable[[dict[str, Any], str], EncoderConfig]] = {
    "RobertaModel": parse_roberta_config,
    "RobertaForSequenceClassification": parse_roberta_config,
    "DistilBertModel": parse_distilbert_config,
    "DistilBertForMaskedLM": parse_distilbert_config,
    "MPNetModel": parse_mpnet_config,
    "MPNetForMaskedLM": parse_mpnet_config,
}
MODEL_TYPES: dict[str, str] = {"distilbert": "DistilBertModel", "mpnet": "MPNetModel"}
