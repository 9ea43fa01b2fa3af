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

- the Transformer's ``query_length`` / ``document_length`` (per-task input caps) and its
  ``query_expansion`` (classic ColBERT): a query shorter than the expansion ``length`` is
  padded to it with the expansion token (``token``, else the tokenizer's mask token, else
  its EOS), and ``"fixed"`` also caps queries at ``length``. With ``attend`` false (the
  default) the padding positions are not attended to as keys, but each still gets an
  output vector (``expand_queries``: the engine attends over each query's real tokens only).

PyLate and Stanford-NLP (colbert-ai) ColBERT folders are read by model/colbert_folders.py
into the same spec; their markers are token ids inserted after the first token
(``query_marker_id`` / ``document_marker_id``, ``prepare_inputs``), not text.

Refused at load, with the reason: ``keep_only_token_ids``, token pooling and any module
other than Transformer, Dense, MultiVectorMask and Normalize.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embedserve import ragged
from embedserve.errors import InvalidInput, ModelLoadError
from embedserve.ragged import RaggedBatch

SIMILARITIES = ("maxsim", "meanmaxsim")
INPUT_TYPES = ("query", "document")
# encode_document's prompt: the first of these the model has.
_DOCUMENT_PROMPTS = ("document", "passage", "corpus")
# The module kinds a served multi-vector folder may list (the class name's last part).
_MODULES = ("Transformer", "Dense", "MultiVectorMask", "Normalize")


_EXPANSION_STRATEGIES = ("fixed", "min")


@dataclass(frozen=True)
class QueryExpansion:
    """The Transformer's ``query_expansion``, with its token resolved to an id."""

    strategy: str          # "fixed" (pad to and cap at length) or "min" (pad to length)
    length: int
    attend: bool           # whether the encoder attends to the expansion positions as keys
    token_id: int


@dataclass(frozen=True)
class MultiVectorSpec:
    skiplist_ids: tuple[int, ...] = ()
    skiplist_tasks: tuple[str, ...] = ("document",)
    similarity: str = "maxsim"
    truncate_dim: int | None = None
    expansion: QueryExpansion | None = None
    query_length: int | None = None
    document_length: int | None = None
    # PyLate / Stanford-NLP folders: the marker token inserted right after the first token
    # ([CLS]) of a query / document (model/colbert_folders.py); None: none inserted.
    query_marker_id: int | None = None
    document_marker_id: int | None = None

    def marker_id(self, task: str) -> int | None:
        """The token id inserted after ``task``'s first token, if any."""
        return self.query_marker_id if task == "query" else self.document_marker_id

    def skips(self, task: str) -> bool:
        """Whether ``task`` ("query" or "document") drops the skiplist's tokens."""
        return bool(self.skiplist_ids) and task in self.skiplist_tasks

    def input_limit(self, task: str, window: int) -> int:
        """The most tokens (specials included) an input of ``task`` may have, as the
        Transformer's preprocess caps it: a fixed expansion's length for queries, else
        ``query_length`` (raised to a "min" expansion's length) / ``document_length``, and
        never more than the model's window; one less where a marker token is inserted
        (PyLate caps the tokenizer at the length minus one for it)."""
        marker = 1 if self.marker_id(task) is not None else 0
        if task == "query":
            if self.expansion is not None and self.expansion.strategy == "fixed":
                return min(self.expansion.length, window) - marker
            cap = self.query_length
            if cap is not None and self.expansion is not None:
                cap = max(cap, self.expansion.length)
        else:
            cap = self.document_length
        return (window if cap is None else min(cap, window)) - marker


def insert_markers(tokens: RaggedBatch, marker_id: int) -> RaggedBatch:
    """``marker_id`` inserted after each sequence's first token, segment 0, as PyLate's
    ``insert_prefix_token`` (and colbert-ai's marker in place of its ". " placeholder) do."""
    lengths = tokens.lengths.astype(np.int64)
    if not (lengths >= 1).all():
        raise InvalidInput("a multi-vector input needs at least one token to put its marker after",
                           field="tokens")
    marked = lengths + 1
    cu = ragged.cu_seqlens_from_lengths(marked)
    within = np.arange(tokens.num_tokens, dtype=np.int64) - np.repeat(tokens.cu_seqlens[:-1].astype(np.int64), lengths)
    at = np.repeat(cu[:-1], lengths) + within + (within > 0)     # where each token goes: past the marker
    ids = np.full(int(cu[-1]), marker_id, dtype=tokens.token_ids.dtype)
    ids[at] = tokens.token_ids
    types = None
    if tokens.token_type_ids is not None:
        types = np.zeros(ids.shape[0], dtype=tokens.token_type_ids.dtype)
        types[at] = tokens.token_type_ids
    return ragged.from_lengths(ids, marked, types)


def prepare_inputs(tokens: RaggedBatch, spec: MultiVectorSpec,
                   task: str) -> tuple[RaggedBatch, np.ndarray | None]:
    """A query's or document's tokens -> the model's input and the key lengths
    (``expand_queries``): the marker token inserted where the folder has one, then queries
    expanded where it expands them."""
    marker = spec.marker_id(task)
    if marker is not None:
        tokens = insert_markers(tokens, marker)
    if task == "query" and spec.expansion is not None:
        return expand_queries(tokens, spec.expansion)
    return tokens, None


def expand_queries(tokens: RaggedBatch, expansion: QueryExpansion) -> tuple[RaggedBatch, np.ndarray | None]:
    """Each query padded with the expansion token up to ``expansion.length`` (longer ones
    unchanged), as the Transformer's preprocess does; and the tokens each may attend to as
    keys (its own length), or None where the expansion is attended (``attend``)."""
    lengths = tokens.lengths.astype(np.int64)
    expanded = np.maximum(lengths, expansion.length)
    cu = ragged.cu_seqlens_from_lengths(expanded)
    ids = np.full(int(cu[-1]), expansion.token_id, dtype=tokens.token_ids.dtype)
    offsets = np.repeat(cu[:-1] - tokens.cu_seqlens[:-1].astype(np.int64), lengths)
    at = np.arange(tokens.num_tokens, dtype=np.int64) + offsets      # where each real token goes
    ids[at] = tokens.token_ids
    types = None
    if tokens.token_type_ids is not None:
        types = np.zeros(ids.shape[0], dtype=tokens.token_type_ids.dtype)
        types[at] = tokens.token_type_ids
    out = ragged.from_lengths(ids, expanded, types)
    return out, None if expansion.attend else lengths.astype(np.int32)


def marker_prompt(prompts: dict[str, str], input_type: str) -> str:
    """The marker put before each input as MultiVectorEncoder does with no prompt named:
    ``encode_query`` the ``query`` prompt, ``encode_document`` the first of
    ``document`` / ``passage`` / ``corpus``; "" where the model has none."""
    if input_type not in INPUT_TYPES:
        raise InvalidInput(f"input_type must be one of {', '.join(INPUT_TYPES)}, got {input_type!r}",
                           field="input_type")
    names = ("query",) if input_type == "query" else _DOCUMENT_PROMPTS
    return next((prompts[name] for name in names if name in prompts), "")


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from None


def is_multivector_dir(model_dir: Path) -> bool:
    """Whether ``model_dir`` is a MultiVectorEncoder folder (PyLate's and Stanford-NLP's:
    model/colbert_folders.py)."""
    st_config = model_dir / "config_sentence_transformers.json"
    if st_config.exists() and (read_json(st_config) or {}).get("model_type") == "MultiVectorEncoder":
        return True
    modules = model_dir / "modules.json"
    return modules.exists() and any(str(m.get("type", "")).endswith("MultiVectorMask")
                                    for m in read_json(modules) or [])


def checked_modules(model_dir: Path, allowed: tuple[str, ...], what: str) -> list[tuple[str, dict[str, Any]]]:
    """(kind, entry) of each module ``modules.json`` lists (the kind: its class name's last
    part); ModelLoadError naming the first one not in ``allowed`` (``what``: the model kind,
    for the message). No modules.json: none."""
    path = model_dir / "modules.json"
    modules = read_json(path) if path.exists() else []
    checked = []
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        if kind not in allowed:
            raise ModelLoadError(f"{path}: module {kind!r} is not supported in {what}; "
                                 f"supported: {', '.join(allowed)}")
        checked.append((kind, module))
    return checked


def read_multivector(model_dir: Path) -> MultiVectorSpec:
    """The folder's skiplist (as ids), similarity and truncate_dim; ModelLoadError for what
    is not served (see the module's docstring)."""
    st_path = model_dir / "config_sentence_transformers.json"
    st_config = read_json(st_path) if st_path.exists() else {}
    bert_config_path = model_dir / "sentence_bert_config.json"
    bert_config = read_json(bert_config_path) if bert_config_path.exists() else {}
    lengths = {key: positive(bert_config.get(key), f"{bert_config_path}: {key}")
               for key in ("query_length", "document_length")}
    expansion = _expansion(model_dir, bert_config.get("query_expansion"), lengths["query_length"],
                           f"{bert_config_path}: query_expansion")
    mask: dict[str, Any] = {}
    for kind, module in checked_modules(model_dir, _MODULES, "a multi-vector model"):
        if kind == "MultiVectorMask":
            path = model_dir / str(module.get("path", "")) / "config.json"
            mask = read_json(path) if path.exists() else {}
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
        similarity=similarity, truncate_dim=int(truncate_dim) if truncate_dim else None,
        expansion=expansion, **lengths)


def positive(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ModelLoadError(f"{where} must be a positive integer, got {value!r}")
    return value


def _expansion(model_dir: Path, raw: Any, query_length: int | None, where: str) -> QueryExpansion | None:
    """``query_expansion`` as sentence-transformers validates it, its token as an id."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or raw.get("strategy") not in _EXPANSION_STRATEGIES:
        raise ModelLoadError(f"{where}: strategy must be one of {', '.join(_EXPANSION_STRATEGIES)}, got {raw!r}")
    unknown = set(raw) - {"strategy", "attend", "token", "length"}
    if unknown:
        raise ModelLoadError(f"{where}: unknown keys {sorted(unknown)}")
    length = positive(raw.get("length"), f"{where} length")
    if length is None:
        raise ModelLoadError(f"{where}: length is required (the pad target; classic ColBERT uses 32)")
    attend = raw.get("attend", False)
    if not isinstance(attend, bool):
        raise ModelLoadError(f"{where}: attend must be true or false, got {attend!r}")
    if query_length is not None and query_length < length:
        raise ModelLoadError(f"{where}: query_length {query_length} is smaller than the expansion length {length}")
    token = raw.get("token")
    token_id = expansion_token_id(model_dir, token)
    if token_id is None:
        raise ModelLoadError(f"{where}: token {token!r} is not one token of the model's vocabulary"
                             if token is not None else f"{where}: the tokenizer has no mask or EOS token "
                             "to expand queries with; set query_expansion's token")
    return QueryExpansion(strategy=str(raw["strategy"]), length=length, attend=attend, token_id=token_id)


def expansion_token_id(model_dir: Path, token: str | None,
                       fallbacks: tuple[str, ...] = ("mask_token", "eos_token"),
                       ids: dict[str, int] | None = None) -> int | None:
    """``token``'s id; without one, the id of the first of the tokenizer's ``fallbacks``
    it has (sentence-transformers': the mask token for encoders, else EOS for decoders).
    ``ids``: the folder's ``vocabulary`` where the caller has read it already."""
    ids = vocabulary(model_dir) if ids is None else ids
    if token is not None:
        return ids.get(token)
    config_path = model_dir / "tokenizer_config.json"
    config = read_json(config_path) if config_path.exists() else {}
    for key in fallbacks:
        name = config.get(key)
        if isinstance(name, dict):          # an AddedToken saved as a dict
            name = name.get("content")
        if isinstance(name, str) and name in ids:
            return ids[name]
    return None


def skiplist_ids(model_dir: Path, words: list[str]) -> tuple[int, ...]:
    """``words`` as token ids, as ``MultiVectorMask.resolve_with_tokenizer`` resolves them:
    a word that is not one vocabulary token (nor the unknown token itself) is dropped."""
    if not words:
        return ()
    ids = vocabulary(model_dir)
    return tuple(sorted({int(ids[word]) for word in words if word in ids}))


def vocabulary(model_dir: Path) -> dict[str, int]:
    """tokenizer.json's vocabulary and added tokens: token -> id."""
    path = model_dir / "tokenizer.json"
    if not path.exists():
        raise ModelLoadError(f"{model_dir}: a skiplist or query expansion needs tokenizer.json to find "
                             "its token ids")
    tokenizer = read_json(path)
    model = tokenizer.get("model") or {}
    vocab = model.get("vocab") or {}
    if isinstance(vocab, list):          # Unigram: [[piece, score], ...]
        vocab = {piece: i for i, (piece, _) in enumerate(vocab)}
    ids = {str(k): int(v) for k, v in dict(vocab).items()}
    ids.update({t["content"]: int(t["id"]) for t in tokenizer.get("added_tokens") or []})
    return ids
