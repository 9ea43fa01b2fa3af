"""DeBERTa-v2 / v3's ``config.json``: sizes, relative-position buckets, the reranker head.

Owns turning a DebertaV2 config (mxbai-rerank-base-v1, deberta-v3 cross-encoders and
embedders) into a frozen ``DebertaV2Config``. Knows nothing about weights or execution.
Refused at load, each with the field named: a convolution after the first layer
(``conv_kernel_size``, deberta-v2-xlarge), separate position projections
(``share_att_key: false``), a head size other than hidden / heads, and a
classifier with more than one label (rerankers have one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from embedserve.errors import ModelLoadError

# architecture name -> task
ARCHITECTURES: dict[str, str] = {"DebertaV2Model": "embed", "DebertaV2ForSequenceClassification": "score"}
_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")


@dataclass(frozen=True)
class DebertaV2Config:
    """What a DeBERTa-v2 encoder needs; the fields ModelInfo reads match EncoderConfig's."""

    architecture: str
    task: str                          # "embed" or "score"
    vocab_size: int
    hidden_size: int
    embedding_size: int                # word vectors' width; projected to hidden_size when it differs
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    segment_vocab_size: int            # 0: no segment embeddings (deberta-v3)
    layer_norm_eps: float
    hidden_act: str
    position_biased_input: bool        # absolute position embeddings added to the input
    relative_attention: bool
    pos_att_type: tuple[str, ...]      # subset of ("c2p", "p2c")
    position_buckets: int              # > 0: log buckets (v3: 256)
    max_relative_positions: int        # resolved: max_position_embeddings when the file says < 1
    norm_rel_ebd: bool                 # LayerNorm over the relative embeddings
    pooler_hidden_act: str = "gelu"
    num_labels: int = 1
    family: str = "deberta-v2"
    position_offset: int = 0
    type_vocab_size: int = 2           # segment ids accepted (ignored where there is no table)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def attention_span(self) -> int:
        """Half the relative-embedding rows: distances (or buckets) -span .. span - 1."""
        return self.position_buckets if self.position_buckets > 0 else self.max_relative_positions

    @property
    def max_positions(self) -> int:
        return self.max_position_embeddings


def _pos_att_type(raw: dict[str, Any]) -> tuple[str, ...]:
    value = raw.get("pos_att_type") or []
    kinds = [k.strip() for k in value.lower().split("|")] if isinstance(value, str) else list(value)
    unknown = sorted(set(kinds) - {"c2p", "p2c"})
    if unknown:
        raise ModelLoadError(f"config.json: unsupported pos_att_type {unknown}; supported: c2p, p2c")
    return tuple(kinds)


def parse_deberta_v2_config(raw: dict[str, Any], architecture: str) -> DebertaV2Config:
    if int(raw.get("conv_kernel_size", 0) or 0) > 0:
        raise ModelLoadError("config.json: unsupported conv_kernel_size > 0 (DeBERTa's convolution layer)")
    relative = bool(raw.get("relative_attention", False))
    if relative and not raw.get("share_att_key", False):
        raise ModelLoadError("config.json: unsupported share_att_key false (separate position projections)")
    hidden_act = str(raw.get("hidden_act", "gelu"))
    pooler_act = str(raw.get("pooler_hidden_act", "gelu"))
    for name, act in (("hidden_act", hidden_act), ("pooler_hidden_act", pooler_act)):
        if act not in _ACTIVATIONS:
            raise ModelLoadError(f"config.json: unsupported {name} {act!r}")
    num_labels = len(raw["id2label"]) if "id2label" in raw else int(raw.get("num_labels", 1))
    task = ARCHITECTURES[architecture]
    if task == "score" and num_labels != 1:
        raise ModelLoadError(f"a reranker needs exactly one label; config has {num_labels}")
    try:
        hidden = int(raw["hidden_size"])
        max_positions = int(raw.get("max_position_embeddings", 512))
        max_relative = int(raw.get("max_relative_positions", -1))
        config = DebertaV2Config(
            architecture=architecture, task=task, vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden, embedding_size=int(raw.get("embedding_size") or hidden),
            num_layers=int(raw["num_hidden_layers"]), num_heads=int(raw["num_attention_heads"]),
            intermediate_size=int(raw["intermediate_size"]), max_position_embeddings=max_positions,
            segment_vocab_size=int(raw.get("type_vocab_size", 0)),
            layer_norm_eps=float(raw.get("layer_norm_eps", 1e-7)), hidden_act=hidden_act,
            position_biased_input=bool(raw.get("position_biased_input", True)),
            relative_attention=relative, pos_att_type=_pos_att_type(raw) if relative else (),
            position_buckets=int(raw.get("position_buckets", -1)),
            max_relative_positions=max_relative if max_relative >= 1 else max_positions,
            norm_rel_ebd="layer_norm" in str(raw.get("norm_rel_ebd", "none")).lower(),
            pooler_hidden_act=pooler_act, num_labels=num_labels,
            # No segment table (v3): the 0 / 1 ids a tokenizer's pair template writes are
            # accepted and ignored, as transformers ignores them.
            type_vocab_size=int(raw.get("type_vocab_size", 0)) or 2)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"config.json: bad or missing field {exc}") from None
    if config.hidden_size % config.num_heads:
        raise ModelLoadError("config.json: hidden_size is not a multiple of num_attention_heads")
    head_size = raw.get("attention_head_size")
    if head_size is not None and int(head_size) != config.head_dim:
        raise ModelLoadError(f"config.json: unsupported attention_head_size {head_size} "
                             f"(not hidden_size / num_attention_heads)")
    if int(raw.get("pooler_hidden_size", hidden)) != hidden:
        raise ModelLoadError("config.json: unsupported pooler_hidden_size other than hidden_size")
    return config
