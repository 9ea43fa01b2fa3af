"""Decoder LLMs served as rerankers: Qwen3-Reranker's prompt and where its score comes from.

Owns two things, both torch-free:

- which causal-LM directories are rerankers: a ``Qwen3ForCausalLM`` whose folder
  has a tokenizer.json and no sentence-transformers ``modules.json`` (as
  Qwen/Qwen3-Reranker-* ship), or
  whose ``modules.json`` ends in a ``LogitScore`` module, or whose
  ``config_sentence_transformers.json`` says ``"model_type": "CrossEncoder"``
  (a Qwen3-Embedding folder has modules.json with a Pooling module: an embedder);
  and their "yes" / "no" token ids (LogitScore's ``true_token_id`` /
  ``false_token_id``, else the tokenizer's vocabulary);
- the prompt of the Qwen3-Reranker model card, shared by converted
  ``Qwen3ForSequenceClassification`` rerankers: a system turn, the user turn
  ``<Instruct>: ...\\n<Query>: ...\\n<Document>: ...``, and an empty thinking block
  opening the assistant's answer. The model card tokenizes prefix, text and suffix
  apart and joins the ids; so does the gateway (gateway/preprocess.py).

The score is the model card's ``softmax([no, yes])[yes]`` = sigmoid(logit_yes -
logit_no): the engine returns ``logit_yes - logit_no`` (one dot product with the
difference of the two LM-head rows at the last token, never the vocabulary-wide
projection), and the rerank routes' sigmoid makes it the model card's score.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embedserve.errors import ModelLoadError

TEMPLATE_NAME = "qwen3_reranker"
SYSTEM = ('Judge whether the Document meets the requirements based on the Query and the Instruct '
          'provided. Note that the answer can only be "yes" or "no".')
PREFIX = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
# The chat markers in PREFIX and SUFFIX. The gateway's tokenizers never turn text into
# special tokens (a user's text cannot forge a marker), so the fixed prompt ends are
# assembled from these ids and the plain text between them, as transformers splits
# added tokens out of a text before encoding the rest.
MARKERS = ("<|im_start|>", "<|im_end|>", "<think>", "</think>")


def format_pair(query: str, document: str, instruction: str | None = None) -> str:
    """The user turn's text for one (query, document) pair, as the model card formats it."""
    return f"<Instruct>: {instruction or DEFAULT_INSTRUCTION}\n<Query>: {query}\n<Document>: {document}"


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"unreadable JSON in {path}: {exc}") from None


def _logit_score_config(model_dir: Path) -> dict[str, Any] | None:
    modules = model_dir / "modules.json"
    if not modules.exists():
        return None
    for module in _json(modules):
        if str(module.get("type", "")).endswith("LogitScore"):
            path = model_dir / module.get("path", "") / "config.json"
            return _json(path) if path.exists() else {}
    return None


def is_reranker_dir(model_dir: Path) -> bool:
    """Whether a causal-LM directory is a yes/no reranker (see the module docstring)."""
    if _logit_score_config(model_dir) is not None:
        return True
    if not (model_dir / "modules.json").exists():
        # Without a tokenizer it cannot be served as a reranker; parsed alone, it stays
        # what it was before rerankers existed (an embedder).
        return (model_dir / "tokenizer.json").exists()
    st_config = model_dir / "config_sentence_transformers.json"
    return st_config.exists() and _json(st_config).get("model_type") == "CrossEncoder"


def yes_no_ids(model_dir: Path) -> tuple[int, int]:
    """The ids whose logits the score compares: (yes, no)."""
    logit_score = _logit_score_config(model_dir) or {}
    if logit_score.get("true_token_id") is not None and logit_score.get("false_token_id") is not None:
        return int(logit_score["true_token_id"]), int(logit_score["false_token_id"])
    path = model_dir / "tokenizer.json"
    if not path.exists():
        raise ModelLoadError(f"{model_dir}: a yes/no reranker needs tokenizer.json to find the ids "
                             "of \"yes\" and \"no\"")
    tokenizer = _json(path)
    vocab = dict((tokenizer.get("model") or {}).get("vocab") or {})
    vocab.update({t["content"]: t["id"] for t in tokenizer.get("added_tokens") or []})
    missing = [word for word in ("yes", "no") if word not in vocab]
    if missing:
        raise ModelLoadError(f"{model_dir}: the tokenizer has no single token for {missing}; a "
                             "yes/no reranker scores those two tokens' logits")
    return int(vocab["yes"]), int(vocab["no"])


def marker_ids(model_dir: Path) -> tuple[tuple[str, int], ...]:
    """The ids of the chat markers the tokenizer has as added tokens."""
    path = model_dir / "tokenizer.json"
    if not path.exists():
        return ()
    added = {t["content"]: int(t["id"]) for t in _json(path).get("added_tokens") or []}
    return tuple((marker, added[marker]) for marker in MARKERS if marker in added)


def encode_with_markers(text: str, markers: dict[str, int],
                        encode: Callable[[Sequence[str]], list[np.ndarray]]) -> np.ndarray:
    """``text``'s ids: each marker as its id, the text between markers by ``encode``
    (plain texts in, one id array each out)."""
    if not markers:
        return np.asarray(encode([text])[0], dtype=np.int32)
    pieces = [p for p in re.split("(" + "|".join(map(re.escape, markers)) + ")", text) if p]
    plain = [p for p in pieces if p not in markers]
    encoded = iter(encode(plain) if plain else [])
    parts = [np.array([markers[p]], dtype=np.int32) if p in markers else np.asarray(next(encoded), np.int32)
             for p in pieces]
    return np.concatenate(parts)
