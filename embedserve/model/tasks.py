"""What a served model's task is, what it outputs, and which routes may ask it.

Owns the closed set of tasks (torch-free; every tier reads it):

- ``embed``: one pooled vector per input (``/v1/embeddings``, ``/embed``);
- ``score``: one logit per (query, document) pair, a cross-encoder reranker
  (``/rerank``, ``/v1/rerank``);
- ``classify``: one logit per label per input (``*ForSequenceClassification``
  with more than one label): ``/predict`` (TEI), ``/classify`` (vLLM);
- ``sparse``: one vocabulary-sized SPLADE vector per input (``*ForMaskedLM``
  with SpladePooling), shipped as its nonzeros: ``/embed_sparse`` (TEI) and
  ``/v1/embeddings`` with ``"sparse": true``;
- ``multivector``: one vector per token (late interaction, ColBERT-style; a
  sentence-transformers ``MultiVectorEncoder`` folder, model/multivector.py, or a
  PyLate / Stanford-NLP ColBERT folder, model/colbert_folders.py):
  ``/embed_all`` (TEI), and MaxSim scores on ``/rerank`` and ``/v1/rerank``.

Also the classifier's label names and activation (``config.json``'s
``id2label`` and ``problem_type``, as transformers reads them) and the SPLADE
pooling of a sentence-transformers ``SparseEncoder`` folder
(``1_SpladePooling/config.json``), named as one pooling string the engine
computes (``splade_max``, ``splade_sum``, ``_log1p`` appended for the
``log1p_relu`` activation).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from embedserve.errors import ModelLoadError

TASKS = ("embed", "score", "classify", "sparse", "multivector")

# How a task's model is named in messages.
TASK_NAMES = {"embed": "an embedding model", "score": "a reranker (cross-encoder)",
              "classify": "a sequence classifier", "sparse": "a sparse (SPLADE) embedding model",
              "multivector": "a multi-vector (ColBERT) model",
              # /embed_all's: token vectors, from a multi-vector model or an embedder's token states
              "tokens": "an embedding or multi-vector (ColBERT) model"}
# The verb a refusal uses for a route's task.
TASK_VERBS = {"embed": "embed", "score": "rerank", "classify": "classify", "sparse": "embed sparse",
              "multivector": "return token vectors", "tokens": "return token vectors"}
# What each task's model returns, for /info ("output kinds").
TASK_OUTPUTS = {"embed": ["dense_vector"], "score": ["score"], "classify": ["label_probabilities"],
                "sparse": ["sparse_vector"], "multivector": ["token_vectors", "maxsim_score"]}
# The routes' tasks a model of each task also answers: a multi-vector model reranks by
# MaxSim (routes that do "score" take it too); /embed_all ("tokens") returns a multi-vector
# model's token vectors and an embedder's last hidden states, as TEI does.
ALSO_ANSWERS = {"multivector": ("score", "tokens"), "embed": ("tokens",)}


def answers(model_task: str, route_task: str) -> bool:
    """Whether a model of ``model_task`` answers a route doing ``route_task``."""
    return model_task == route_task or route_task in ALSO_ANSWERS.get(model_task, ())

# problem_type -> what turns logits into probabilities. transformers' default for more
# than one label (no problem_type) is single_label_classification: softmax.
ACTIVATIONS = {None: "softmax", "single_label_classification": "softmax",
               "multi_label_classification": "sigmoid"}

SPLADE_DEFAULT = "splade_max"
SPLADE_STRATEGIES = ("max", "sum")
SPLADE_ACTIVATIONS = {"relu": "", "log1p_relu": "_log1p"}


def label_names(raw: dict[str, Any], num_labels: int) -> tuple[str, ...]:
    """``id2label`` as a tuple by class index (transformers' LABEL_i where absent)."""
    id2label = raw.get("id2label") or {}
    try:
        by_index = {int(k): str(v) for k, v in id2label.items()}
    except (TypeError, ValueError, AttributeError):
        raise ModelLoadError(f"config.json: id2label must map class indices to names, got "
                             f"{id2label!r}") from None
    return tuple(by_index.get(i, f"LABEL_{i}") for i in range(num_labels))


def classifier_activation(problem_type: str | None) -> str:
    if problem_type not in ACTIVATIONS:
        raise ModelLoadError(f"unsupported problem_type {problem_type!r} for a classifier; "
                             f"supported: single_label_classification, multi_label_classification")
    return ACTIVATIONS[problem_type]


def splade_pooling(raw: dict[str, Any], path: Path) -> str:
    """``1_SpladePooling/config.json`` -> the engine's pooling name."""
    strategy = raw.get("pooling_strategy", "max")
    activation = raw.get("activation_function", "relu")
    if strategy not in SPLADE_STRATEGIES or activation not in SPLADE_ACTIVATIONS:
        raise ModelLoadError(f"unsupported SPLADE pooling {strategy!r} / {activation!r} in {path}; "
                             f"supported: pooling_strategy max or sum, activation_function "
                             f"relu or log1p_relu")
    return f"splade_{strategy}{SPLADE_ACTIVATIONS[activation]}"


def is_sparse_encoder_dir(model_dir: Path, read_json: Callable[[Path], Any]) -> bool:
    """Whether a folder is a sentence-transformers ``SparseEncoder``: its modules.json has a
    SpladePooling module, or config_sentence_transformers.json says ``model_type``
    SparseEncoder. (``read_json``: model/config.py's reader, with its load errors.)"""
    modules = model_dir / "modules.json"
    if modules.exists() and any(str(m.get("type", "")).endswith("SpladePooling") for m in read_json(modules)):
        return True
    st_config = model_dir / "config_sentence_transformers.json"
    return st_config.exists() and read_json(st_config).get("model_type") == "SparseEncoder"


def is_splade(pooling: str) -> bool:
    return pooling.startswith("splade_")
