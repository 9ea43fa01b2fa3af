"""What a model directory says about the model: architecture, sizes, pooling, prompts.

Owns reading ``config.json`` and the sentence-transformers metadata
(``modules.json``, ``1_Pooling/config.json``, ``config_sentence_transformers.json``)
into frozen dataclasses. Knows nothing about weights or execution.

Families are a registry: ``ARCHITECTURES`` maps each architecture name to the
parser that turns its ``config.json`` into that family's config dataclass
(this module's ``EncoderConfig`` for BERT / XLM-R, decoder_config.py's
``DecoderConfig`` for Qwen3 / Qwen2 / Llama / Mistral). A new family lives in
its own module and joins with one line in ``ARCHITECTURES`` (and
``MODEL_TYPES`` when hub files may omit ``architectures``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from embedserve.errors import ModelLoadError
from embedserve.model import (
    colbert_folders,
    deberta_v2_config,
    gemma3_config,
    llm_reranker,
    modernbert_config,
    multivector,
    nomic_bert_config,
    tasks,
)
from embedserve.model.decoder_config import DECODER_ARCHITECTURES, DECODER_MODEL_TYPES
from embedserve.model.dense_config import DenseSpec, read_dense_modules

Family = Literal["bert", "xlm-roberta", "distilbert", "mpnet"]

# architecture name -> (encoder family, task).
ENCODER_ARCHITECTURES_TASKS: dict[str, tuple[Family, str]] = {
    "BertModel": ("bert", "embed"),
    "XLMRobertaModel": ("xlm-roberta", "embed"),
    "BertForSequenceClassification": ("bert", "score"),
    "XLMRobertaForSequenceClassification": ("xlm-roberta", "score"),
    # A masked LM is served as a SPLADE sparse encoder (model/tasks.py).
    "BertForMaskedLM": ("bert", "sparse"),
    # Stanford-NLP's ColBERT (colbert-ai) on a BERT backbone (model/colbert_folders.py).
    colbert_folders.STANFORD_ARCHITECTURE: ("bert", "multivector"),
}


class ModelConfig(Protocol):
    """What every family's config says, whatever else it holds."""

    # Properties: read-only, as the families' frozen dataclasses provide them.
    @property
    def architecture(self) -> str: ...
    @property
    def family(self) -> str: ...
    @property
    def task(self) -> str: ...                  # "embed" or "score"
    @property
    def vocab_size(self) -> int: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def type_vocab_size(self) -> int: ...       # segment ids accepted (1: segment 0 only)
    @property
    def position_offset(self) -> int: ...       # first position id
    @property
    def max_positions(self) -> int: ...


@dataclass(frozen=True)
class EncoderConfig:
    """The sizes of a BERT / XLM-R encoder, read from ``config.json``."""

    architecture: str
    family: Family
    task: str                      # model/tasks.py: "embed", "score", "classify" or "sparse"
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
    # A classifier's (task "classify") label names, by class index, and how its logits
    # become probabilities (model/tasks.py: "softmax" or "sigmoid").
    labels: tuple[str, ...] = ()
    activation: str = ""

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
    dense: tuple[DenseSpec, ...] = ()      # Dense modules after pooling, in order

    def output_dimension(self, hidden_size: int) -> int:
        """The embedding width: the last Dense module's, else the model's hidden size."""
        return self.dense[-1].out_features if self.dense else hidden_size


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelLoadError(f"missing file: {path}") from None
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"unreadable JSON in {path}: {exc}") from None


def parse_encoder_config(raw: dict[str, Any], architecture: str) -> EncoderConfig:
    """``config.json`` of a BERT / XLM-R encoder or reranker -> EncoderConfig."""
    family, task = ENCODER_ARCHITECTURES_TASKS[architecture]
    if architecture == colbert_folders.STANFORD_ARCHITECTURE and raw.get("model_type") != "bert":
        # colbert-ai names every backbone's checkpoint HF_ColBERT; only BERT's is served.
        raise ModelLoadError(f"a Stanford-NLP ColBERT (HF_ColBERT) checkpoint on a {raw.get('model_type')!r} "
                             "backbone is not supported; only model_type bert")
    position_type = raw.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise ModelLoadError(f"unsupported position_embedding_type {position_type!r}")
    hidden_act = raw.get("hidden_act", "gelu")
    if hidden_act not in ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu"):
        raise ModelLoadError(f"unsupported hidden_act {hidden_act!r}")
    num_labels = len(raw["id2label"]) if "id2label" in raw else int(raw.get("num_labels", 1))
    labels: tuple[str, ...] = ()
    activation = ""
    if task == "score" and num_labels != 1:
        # More than one label: a classifier, not a reranker (one label: a cross-encoder).
        task = "classify"
        labels = tasks.label_names(raw, num_labels)
        activation = tasks.classifier_activation(raw.get("problem_type"))
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
            num_labels=num_labels, labels=labels, activation=activation,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"config.json: bad or missing field {exc}") from None
    if config.hidden_size % config.num_heads:
        raise ModelLoadError("hidden_size is not a multiple of num_attention_heads")
    return config


ConfigParser = Callable[[dict[str, Any], str], ModelConfig]

# These families build on EncoderConfig / parse_encoder_config above, so they are
# imported after them.
from embedserve.model import bert_variants_config  # noqa: E402

# The closed set of architectures this engine runs: name -> its family's parser.
ARCHITECTURES: dict[str, ConfigParser] = {
    **{name: parse_encoder_config for name in ENCODER_ARCHITECTURES_TASKS},
    **DECODER_ARCHITECTURES,
    **{name: modernbert_config.parse_registered for name in modernbert_config.ARCHITECTURES},
    **bert_variants_config.ARCHITECTURES,
    **{name: deberta_v2_config.parse_deberta_v2_config for name in deberta_v2_config.ARCHITECTURES},
    **{name: nomic_bert_config.parse_nomic_bert_config for name in nomic_bert_config.ARCHITECTURES},
    **{name: gemma3_config.parse_gemma3_config for name in gemma3_config.ARCHITECTURES},
}
# Masked LMs whose task the folder decides: SPLADE in a SparseEncoder folder, else an
# embedder (BertForMaskedLM is always SPLADE: ENCODER_ARCHITECTURES_TASKS).
SPARSE_IN_SPARSE_ENCODER_DIRS = ("DistilBertForMaskedLM",)
# model_type -> architecture, for hub files that omit ``architectures``.
MODEL_TYPES: dict[str, str] = {
    "bert": "BertModel", "xlm-roberta": "XLMRobertaModel", "roberta": "XLMRobertaModel",
    **DECODER_MODEL_TYPES,
    "modernbert": "ModernBertModel",
    **bert_variants_config.MODEL_TYPES,
    "deberta-v2": "DebertaV2Model",
    "nomic_bert": "NomicBertModel",
    "gemma3_text": "Gemma3TextModel",
}


def load_model_config(model_dir: Path) -> ModelConfig:
    """Read ``model_dir/config.json`` with the parser of its architecture."""
    raw = read_json(model_dir / "config.json")
    architectures = raw.get("architectures") or []
    if not architectures:
        architecture = MODEL_TYPES.get(raw.get("model_type", ""))
        if architecture is None:
            raise ModelLoadError(f"{model_dir}/config.json names no architecture")
        architectures = [architecture]
    architecture = architectures[0]
    if architecture not in ARCHITECTURES:
        raise ModelLoadError(f"unsupported architecture {architecture!r}; supported: "
                             f"{', '.join(sorted(ARCHITECTURES))}")
    try:
        config = ARCHITECTURES[architecture](raw, architecture)
        if architecture in SPARSE_IN_SPARSE_ENCODER_DIRS and tasks.is_sparse_encoder_dir(model_dir, read_json):
            # A masked LM that is also served as an embedder (its head dropped, as
            # SentenceTransformer loads it) is a SPLADE model in a SparseEncoder folder.
            config = dataclasses.replace(config, task="sparse")  # type: ignore[type-var]  # a dataclass config
        if architecture == "Qwen3ForCausalLM" and llm_reranker.is_reranker_dir(model_dir):
            # Qwen3-Reranker: a causal LM scored by its yes/no logits (model/llm_reranker.py).
            config = dataclasses.replace(config, task="score",  # type: ignore[type-var]  # a DecoderConfig
                                         score_tokens=llm_reranker.yes_no_ids(model_dir))
        elif config.task == "embed" and (multivector.is_multivector_dir(model_dir)
                                         or colbert_folders.kind(model_dir) == "pylate"):
            # A MultiVectorEncoder (or PyLate) folder: the same encoder, every token's vector kept.
            config = dataclasses.replace(config, task="multivector")  # type: ignore[type-var]  # a dataclass config
        return config
    except ModelLoadError as exc:
        raise ModelLoadError(f"{model_dir}: {exc}") from None


# The old name: every family's config now, not only encoders'.
load_encoder_config = load_model_config


def load_sentence_transformer_meta(model_dir: Path, config: ModelConfig) -> SentenceTransformerMeta:
    """Pooling, normalization and prompts; defaults when the metadata is absent.

    Without ``modules.json`` an embedder pools by mean and does not normalize
    (sentence-transformers' own default for a bare transformers directory).
    """
    pooling, normalize = "mean", False
    if config.task in ("score", "classify"):
        # A decoder reranker reads its last token (the only one that sees the whole pair).
        pooling = "lasttoken" if getattr(config, "pair_template", "") else "cls"
    if config.task == "sparse":
        pooling = tasks.SPLADE_DEFAULT   # what SparseEncoder builds for a bare fill-mask model
    modules_path = model_dir / "modules.json"
    dense: tuple[DenseSpec, ...] = ()
    if modules_path.exists():
        modules = read_json(modules_path)
        dense = read_dense_modules(model_dir, modules, read_json)
        if dense and dense[0].in_features != config.hidden_size:
            raise ModelLoadError(f"{dense[0].path}: takes {dense[0].in_features} features but the "
                                 f"model gives {config.hidden_size}")
        for module in modules:
            kind = str(module.get("type", ""))
            if kind.endswith("SpladePooling"):
                path = model_dir / module.get("path", "1_SpladePooling") / "config.json"
                pooling = tasks.splade_pooling(read_json(path), path)
            elif kind.endswith("Pooling"):
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
    colbert = colbert_folders.kind(model_dir) if config.task == "multivector" else None
    if colbert is not None:
        # PyLate normalizes each token vector and inserts its markers as token ids
        # (model/colbert_folders.py); a Stanford-NLP checkpoint holds its projection inline.
        normalize = True
        prompts = colbert_folders.legacy_prompts(prompts, default_prompt_name)
        if colbert == "stanford":
            dense = (colbert_folders.stanford_dense(model_dir, config.hidden_size),)
    return SentenceTransformerMeta(pooling, normalize, prompts, default_prompt_name, dense)


# 1_Pooling/config.json flag -> our pooling name
POOLING_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
                 "pooling_mode_lasttoken": "lasttoken"}


def _read_pooling(path: Path) -> str:
    """The one pooling mode the file turns on (cls, mean or lasttoken)."""
    raw = read_json(path)
    named = raw.get("pooling_mode")
    if isinstance(named, str):
        # sentence-transformers >= 6 writes the mode as one string, not one flag per mode.
        if named in POOLING_MODES.values():
            return named
        raise ModelLoadError(f"unsupported pooling {named!r} in {path}; supported: one of "
                             f"{', '.join(POOLING_MODES.values())}")
    modes = [k for k, v in raw.items() if k.startswith("pooling_mode") and v]
    if len(modes) == 1 and modes[0] in POOLING_MODES:
        return POOLING_MODES[modes[0]]
    raise ModelLoadError(f"unsupported pooling {modes} in {path}; supported: one of "
                         f"{', '.join(POOLING_MODES.values())}")
