"""ModelInfo: the one description of a served model, read without its weights.

Owns the facts every tier needs about a model: what it does (task,
architecture), its limits (positions, vocabulary, segment ids), its output
(dimension, pooling, default normalization) and its named prompts. The
gateway reads it from the model directory (no torch); the engine reads the
same and adds where the weights live (``device``, ``dtype``); the scheduler
reports it over gRPC (the proto conversion is ``embedserve.link.wire``'s).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from embedserve.errors import InvalidInput, ModelLoadError
from embedserve.model import colbert_folders, llm_reranker
from embedserve.model.config import load_model_config, load_sentence_transformer_meta
from embedserve.model.multivector import MultiVectorSpec


@dataclass(frozen=True)
class ModelInfo:
    model_id: str
    architecture: str
    task: str                      # model/tasks.py: "embed", "score", "classify" or "sparse"
    dimension: int                 # embedding width; 0 for a scorer or classifier; vocab for sparse
    max_positions: int             # longest sequence, specials included
    vocab_size: int
    pooling: str                   # "mean", "cls" or "lasttoken"
    normalize: bool                # the model's default (a Normalize module in modules.json)
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    type_vocab_size: int = 2       # segment ids accepted in token_type_ids
    # Where the weights live; None while only the directory has been read
    # (the gateway, before a replica reports them).
    device: str | None = None
    dtype: str | None = None
    # Why that dtype: "explicit", or auto's hardware fact and probe result
    # (embedserve/engine/dtype_choice.py); None where not reported.
    dtype_reason: str | None = None
    # The int8/uint8 calibration a replica quantizes with (embedserve/calibration.py);
    # None where there is none (or not yet reported).
    calibration_id: str | None = None
    calibration_sample_size: int = 0
    calibration_texts_id: str | None = None
    # A classifier's label names by class index, and "softmax" or "sigmoid" (model/tasks.py).
    labels: tuple[str, ...] = ()
    activation: str = ""
    # How a reranker's pairs become tokens: "" (the tokenizer's pair template) or
    # "qwen3_reranker" (an LLM reranker's prompt, model/llm_reranker.py).
    pair_template: str = ""
    # That prompt's chat markers the tokenizer has as added tokens: (marker, id) pairs.
    prompt_markers: tuple[tuple[str, int], ...] = ()
    # A multi-vector model's skiplist, similarity and truncate_dim (model/multivector.py);
    # None for every other task.
    multivector: MultiVectorSpec | None = None

    def prompt(self, name: str | None, field_name: str) -> str:
        """The prefix for prompt ``name`` (None: the model's default, if any)."""
        if name is None:
            name = self.default_prompt_name
            if name is None:
                return ""
        if name not in self.prompts:
            known = ", ".join(sorted(self.prompts)) or "none"
            raise InvalidInput(f"{field_name}: unknown prompt {name!r}; this model has: {known}",
                               field=field_name)
        return self.prompts[name]


def read_model_info(model_dir: Path, model_id: str | None = None) -> ModelInfo:
    """Read ``model_dir`` (config and sentence-transformers metadata, no weights).

    Raises ``ModelLoadError`` when the directory is unusable. ``model_id``
    defaults to the directory's name.
    """
    config = load_model_config(model_dir)
    meta = load_sentence_transformer_meta(model_dir, config)
    spec = colbert_folders.read_spec(model_dir) if config.task == "multivector" else None
    if spec is not None and spec.expansion is not None and spec.expansion.length > config.max_positions:
        raise ModelLoadError(f"{model_dir}: query_expansion length {spec.expansion.length} exceeds the "
                             f"model's {config.max_positions} positions")
    dimension = _dimension(config, meta)
    if spec is not None and spec.truncate_dim:
        dimension = min(dimension, spec.truncate_dim)
    return ModelInfo(
        model_id=model_id or model_dir.name, architecture=config.architecture, task=config.task,
        dimension=dimension,
        max_positions=config.max_positions, vocab_size=config.vocab_size,
        pooling=meta.pooling, normalize=meta.normalize, prompts=dict(meta.prompts),
        default_prompt_name=meta.default_prompt_name, type_vocab_size=config.type_vocab_size,
        labels=tuple(getattr(config, "labels", ())), activation=getattr(config, "activation", ""),
        pair_template=getattr(config, "pair_template", ""),
        prompt_markers=llm_reranker.marker_ids(model_dir) if getattr(config, "pair_template", "") else (),
        multivector=spec)


def _dimension(config, meta) -> int:
    """A dense vector's width (after the model's Dense modules); a sparse one's is the
    vocabulary; 0 where there is no vector."""
    if config.task == "embed":
        return meta.output_dimension(config.hidden_size)
    if config.task == "multivector":   # each token vector's width (before truncate_dim)
        return meta.output_dimension(config.hidden_size)
    return config.vocab_size if config.task == "sparse" else 0
