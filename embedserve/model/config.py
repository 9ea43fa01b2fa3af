"""What a model directory says about the model: architecture, sizes, pooling, prompts.

Owns reading ``config.json`` and the sentence-transformers metadata
(``modules.json``, ``1_Pooling/config.json``, ``config_sentence_transformers.json``)
into frozen dataclasses. Knows nothing about weights or execution.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from embedserve.errors import ModelLoadError
from embedserve.model import modernbert_config
from embedserve.model.modernbert_config import ModernBertConfig

Family = Literal["bert", "xlm-roberta"]

# architecture name -> (encoder family, task). The closed set this engine runs.
SUPPORTED_ARCHITECTURES: dict[str, tuple[Family, str]] = {
    "BertModel": ("bert", "embed"),
    "XLMRobertaModel": ("xlm-roberta", "embed"),
    "BertForSequenceClassification": ("bert", "score"),
    "XLMRobertaForSequenceClassification": ("xlm-roberta", "score"),
}
_MODEL_TYPE_FAMILY: dict[str, Family] = {"bert": "bert", "xlm-roberta": "xlm-roberta",
                                         "roberta": "xlm-roberta"}


@dataclass(frozen=True)
class EncoderConfig:
    """The sizes of a BERT / XLM-R encoder, read from ``config.json``."""

    architecture: str
    family: Family
    task: str                      # "embed" or "score"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str
    position_offset: int           # first position id: 0 for BERT, padding_idx + 1 for XLM-R
    num_labels: int = 1

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def max_positions(self) -> int:
        """Longest sequence (specials included) the position table allows."""
        return self.max_position_embeddings - self.position_offset


@dataclass(frozen=True)
class SentenceTransformerMeta:
    pooling: str
    normalize: bool
    prompts: dict[str, str]
    default_prompt_name: str | None


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelLoadError(f"missing file: {path}") from None
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"unreadable JSON in {path}: {exc}") from None


def load_encoder_config(model_dir: Path) -> EncoderConfig | ModernBertConfig:
    raw = read_json(model_dir / "config.json")
    architectures = raw.get("architectures") or []
    if not architectures and raw.get("model_type") == "modernbert":
        architectures = ["ModernBertModel"]
    if architectures and architectures[0] in modernbert_config.ARCHITECTURES:
        return modernbert_config.parse_modernbert_config(raw, architectures[0],
                                                         f"{model_dir}/config.json")
    if not architectures:
        # Some hub files omit it; fall back on model_type for plain encoders.
        family = _MODEL_TYPE_FAMILY.get(raw.get("model_type", ""))
        if family is None:
            raise ModelLoadError(f"{model_dir}/config.json names no architecture")
        architectures = ["BertModel" if family == "bert" else "XLMRobertaModel"]
    architecture = architectures[0]
    if architecture not in SUPPORTED_ARCHITECTURES:
        supported = sorted([*SUPPORTED_ARCHITECTURES, *modernbert_config.ARCHITECTURES])
        raise ModelLoadError(f"unsupported architecture {architecture!r}; supported: "
                             f"{', '.join(supported)}")
    family, task = SUPPORTED_ARCHITECTURES[architecture]
    position_type = raw.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise ModelLoadError(f"unsupported position_embedding_type {position_type!r}")
    hidden_act = raw.get("hidden_act", "gelu")
    if hidden_act not in ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu"):
        raise ModelLoadError(f"unsupported hidden_act {hidden_act!r}")
    num_labels = len(raw["id2label"]) if "id2label" in raw else int(raw.get("num_labels", 1))
    if task == "score" and num_labels != 1:
        raise ModelLoadError(f"a reranker needs exactly one label; config has {num_labels}")
    try:
        config = EncoderConfig(
            architecture=architecture, family=family, task=task,
            vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
            num_layers=int(raw["num_hidden_layers"]), num_heads=int(raw["num_attention_heads"]),
            intermediate_size=int(raw["intermediate_size"]),
            max_position_embeddings=int(raw["max_position_embeddings"]),
            type_vocab_size=int(raw.get("type_vocab_size", 2)),
            layer_norm_eps=float(raw.get("layer_norm_eps", 1e-12)),
            hidden_act=hidden_act,
            # RoBERTa-style position ids count from padding_idx + 1 (2 for XLM-R).
            position_offset=int(raw.get("pad_token_id", 1)) + 1 if family == "xlm-roberta" else 0,
            num_labels=num_labels,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{model_dir}/config.json: bad or missing field {exc}") from None
    if config.hidden_size % config.num_heads:
        raise ModelLoadError("hidden_size is not a multiple of num_attention_heads")
    return config


def load_sentence_transformer_meta(model_dir: Path,
                                   config: EncoderConfig | ModernBertConfig) -> SentenceTransformerMeta:
    """Pooling, normalization and prompts; defaults when the metadata is absent.

    Without ``modules.json`` an embedder pools by mean and does not normalize
    (sentence-transformers' own default for a bare transformers directory).
    """
    pooling, normalize = "mean", False
    if config.task == "score":
        pooling = "cls"
    modules_path = model_dir / "modules.json"
    if modules_path.exists():
        for module in read_json(modules_path):
            kind = str(module.get("type", ""))
            if kind.endswith("Pooling"):
                pooling = _read_pooling(model_dir / module.get("path", "1_Pooling") / "config.json")
            elif kind.endswith("Normalize"):
                normalize = True
    prompts: dict[str, str] = {}
    default_prompt_name = None
    st_config = model_dir / "config_sentence_transformers.json"
    if st_config.exists():
        raw = read_json(st_config)
        prompts = {str(k): str(v) for k, v in (raw.get("prompts") or {}).items()}
        default_prompt_name = raw.get("default_prompt_name")
    return SentenceTransformerMeta(pooling, normalize, prompts, default_prompt_name)


def _read_pooling(path: Path) -> str:
    raw = read_json(path)
    if raw.get("pooling_mode_cls_token"):
        return "cls"
    if raw.get("pooling_mode_mean_tokens"):
        return "mean"
    modes = [k for k, v in raw.items() if k.startswith("pooling_mode") and v]
    raise ModelLoadError(f"unsupported pooling {modes} in {path}; supported: mean, cls")
