"""A multi-vector (late-interaction, ColBERT-style) model folder, as sentence-transformers'
``MultiVectorEncoder`` saves it; torch-free.

Owns detecting such a folder and reading what the engine, the replica and the gateway
need beyond an embedder's metadata:

- the folder is multi-vector when ``config_sentence_transformers.json`` says
  ``"model_type": "MultiVectorEncoder"`` or ``modules.json`` lists a ``MultiVectorMask``;
- the token projection is the folder's ``Dense`` modules (model/dense_config.py reads
  them; here they act on every token, not on a pooled vector), and a ``Normalize``
  module L2-normalizes each token vector;
- the query and document markers are the ``query`` and ``document`` prompts, prepended
  as text (``encode_query`` / ``encode_document``);
- ``MultiVectorMask``'s ``skiplist_words`` become token ids as its
  ``resolve_with_tokenizer`` does (``convert_tokens_to_ids``; a word the vocabulary lacks
  is dropped, not turned into ``[UNK]``), applied to the tasks in ``skiplist_tasks``
  (documents by default);
- ``similarity_fn_name`` ``maxsim`` (the default) or ``meanmaxsim``, and ``truncate_dim``.

Refused at load, with the reason: query expansion (``query_expansion`` in
``sentence_bert_config.json``, and PyLate v3 ``"model_type": "ColBERT"`` folders, which
imply it), per-task lengths (``query_length``, ``document_length``),
``keep_only_token_ids``, token pooling and any module other than Transformer, Dense,
MultiVectorMask and Normalize.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedserve.errors import InvalidInput, ModelLoadError

SIMILARITIES = ("maxsim", "meanmaxsim")
INPUT_TYPES = ("query", "document")
# encode_document's prompt: the first of these the model has.
_DOCUMENT_PROMPTS = ("document", "passage", "corpus")
# The module kinds a served multi-vector folder may list (the class name's last part).
_MODULES = ("Transformer", "Dense", "MultiVectorMask", "Normalize")


@dataclass(frozen=True)
class MultiVectorSpec:
    skiplist_ids: tuple[int, ...] = ()
    skiplist_tasks: tuple[str, ...] = ("document",)
    similarity: str = "maxsim"
    truncate_dim: int | None = None

    def skips(self, task: str) -> bool:
        """Whether ``task`` ("query" or "document") drops the skiplist's tokens."""
        return bool(self.skiplist_ids) and task in self.skiplist_tasks


def marker_prompt(prompts: dict[str, str], input_type: str) -> str:
    """The marker put before each input as MultiVectorEncoder does with no prompt named:
    ``encode_query`` the ``query`` prompt, ``encode_document`` the first of
    ``document`` / ``passage`` / ``corpus``; "" where the model has none."""
    if input_type not in INPUT_TYPES:
        raise InvalidInput(f"input_type must be one of {', '.join(INPUT_TYPES)}, got {input_type!r}",
                           field="input_type")
    names = ("query",) if input_type == "query" else _DOCUMENT_PROMPTS
    return next((prompts[name] for name in names if name in prompts), "")


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from None


def is_multivector_dir(model_dir: Path) -> bool:
    """Whether ``model_dir`` is a MultiVectorEncoder (or PyLate ColBERT) folder."""
    st_config = model_dir / "config_sentence_transformers.json"
    if st_config.exists():
        model_type = (_json(st_config) or {}).get("model_type")
        if model_type in ("MultiVectorEncoder", "ColBERT"):
            return True
    modules = model_dir / "modules.json"
    return modules.exists() and any(str(m.get("type", "")).endswith("MultiVectorMask")
                                    for m in _json(modules) or [])


def read_multivector(model_dir: Path) -> MultiVectorSpec:
    """The folder's skiplist (as ids), similarity and truncate_dim; ModelLoadError for what
    is not served (see the module's docstring)."""
    st_path = model_dir / "config_sentence_transformers.json"
    st_config = _json(st_path) if st_path.exists() else {}
    if st_config.get("model_type") == "ColBERT":
        raise ModelLoadError(f"{model_dir}: a PyLate v3 ColBERT folder (model_type ColBERT) is not "
                             "supported yet: its queries use query expansion; load it with "
                             "sentence-transformers' MultiVectorEncoder and save it again without it")
    bert_config_path = model_dir / "sentence_bert_config.json"
    bert_config = _json(bert_config_path) if bert_config_path.exists() else {}
    if bert_config.get("query_expansion") is not None:
        raise ModelLoadError(f"{bert_config_path}: query_expansion is not supported yet (queries are "
                             "encoded at their own length)")
    for key in ("query_length", "document_length"):
        if bert_config.get(key) is not None:
            raise ModelLoadError(f"{bert_config_path}: {key} is not supported yet (inputs are cut "
                                 "at the model's window only)")
    mask: dict[str, Any] = {}
    modules = _json(model_dir / "modules.json") if (model_dir / "modules.json").exists() else []
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind not in _MODULES:
            raise ModelLoadError(f"{model_dir}/modules.json: module {kind!r} is not supported in a "
                                 f"multi-vector model; supported: {', '.join(_MODULES)}")
        if kind == "MultiVectorMask":
            path = model_dir / str(module.get("path", "")) / "config.json"
            mask = _json(path) if path.exists() else {}
    if mask.get("keep_only_token_ids"):
        raise ModelLoadError(f"{model_dir}: MultiVectorMask keep_only_token_ids is not supported")
    tasks = mask.get("skiplist_tasks")
    if isinstance(tasks, str):
        tasks = [tasks]
    similarity = st_config.get("similarity_fn_name") or "maxsim"
    if similarity not in SIMILARITIES:
        # MultiVectorEncoder ignores a saved similarity it does not support (legacy cosine/dot).
        similarity = "maxsim"
    truncate_dim = st_config.get("truncate_dim")
    return MultiVectorSpec(
        skiplist_ids=skiplist_ids(model_dir, list(mask.get("skiplist_words") or [])),
        skiplist_tasks=tuple(str(t) for t in (tasks if tasks is not None else ["document"])),
        similarity=similarity, truncate_dim=int(truncate_dim) if truncate_dim else None)


def skiplist_ids(model_dir: Path, words: list[str]) -> tuple[int, ...]:
    """``words`` as token ids, as ``MultiVectorMask.resolve_with_tokenizer`` resolves them:
    a word that is not one vocabulary token (nor the unknown token itself) is dropped."""
    if not words:
        return ()
    path = model_dir / "tokenizer.json"
    if not path.exists():
        raise ModelLoadError(f"{model_dir}: a skiplist needs tokenizer.json to find its token ids")
    tokenizer = _json(path)
    model = tokenizer.get("model") or {}
    vocab = model.get("vocab") or {}
    if isinstance(vocab, list):          # Unigram: [[piece, score], ...]
        vocab = {piece: i for i, (piece, _) in enumerate(vocab)}
    ids = dict(vocab)
    ids.update({t["content"]: int(t["id"]) for t in tokenizer.get("added_tokens") or []})
    return tuple(sorted({int(ids[word]) for word in words if word in ids}))
