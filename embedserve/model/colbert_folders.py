"""ColBERT folders in the layouts PyLate and Stanford-NLP's colbert-ai save; torch-free.

Owns recognising them and reading them into the same ``MultiVectorSpec`` as a
sentence-transformers ``MultiVectorEncoder`` folder (model/multivector.py), with the
values and defaults of the reference, PyLate 1.6.0 (``pylate.models.ColBERT``):

- a **PyLate** folder: ``config_sentence_transformers.json`` with ``"model_type":
  "ColBERT"``, or a ``modules.json`` listing a ``pylate.*`` module (a fresh PyLate save
  writes no model_type). Its modules are a Transformer and Dense projections (PyLate's
  own ``Dense``, ``use_residual`` false). From that config: ``query_prefix`` /
  ``document_prefix`` (default ``"[Q] "`` / ``"[D] "``; "" for none), each one token of
  the tokenizer, inserted by id right after the first token; ``query_length`` (32) and
  ``document_length`` (180), the inputs' caps with the marker; ``do_query_expansion``
  (true): queries padded to ``query_length`` with the mask token (else EOS, else pad),
  attended as keys only where ``attend_to_expansion_tokens``; ``skiplist_words``
  (``string.punctuation``) resolved as ``convert_tokens_to_ids`` does (a word the
  vocabulary lacks becomes the unknown token), dropped from documents.
- a **Stanford-NLP** folder (``colbert-ir/colbertv2.0``): ``config.json`` names
  ``HF_ColBERT`` (a BERT backbone: model/config.py), the projection is the checkpoint's
  ``linear.weight`` (no bias) and ``artifact.metadata`` (colbert-ai's ColBERTConfig, as
  PyLate reads it) gives ``query_token_id`` / ``doc_token_id`` (``[unused0]`` /
  ``[unused1]``), ``query_maxlen`` (32), ``doc_maxlen`` (180, PyLate's default) and
  ``attend_to_mask_tokens`` (false); queries are always expanded and documents drop
  punctuation. What the two references would score differently is refused:
  ``mask_punctuation`` false (PyLate ignores it), a ``similarity`` other than cosine or an
  ``interaction`` other than colbert.

Both normalize every token vector (PyLate's ``normalize_embeddings``) and score by MaxSim;
a PyLate folder's named prompts are not applied (``legacy_prompts``).
"""

from __future__ import annotations

import json
import string
import struct
from pathlib import Path
from typing import Any

from embedserve.errors import ModelLoadError
from embedserve.model.dense_config import DenseSpec
from embedserve.model.multivector import (
    MultiVectorSpec,
    QueryExpansion,
    checked_modules,
    expansion_token_id,
    positive,
    read_json,
    read_multivector,
    vocabulary,
)

STANFORD_ARCHITECTURE = "HF_ColBERT"
# PyLate 1.6.0's defaults (pylate/models/colbert.py).
_PYLATE_DEFAULTS = {"query_prefix": "[Q] ", "document_prefix": "[D] ", "query_length": 32,
                    "document_length": 180, "do_query_expansion": True, "attend_to_expansion_tokens": False}
# The module kinds a PyLate folder may list (the class name's last part).
_PYLATE_MODULES = ("Transformer", "Dense")
# The expansion token PyLate pads queries with: the first of these the tokenizer has.
_EXPANSION_TOKENS = ("mask_token", "eos_token", "pad_token")


def kind(model_dir: Path) -> str | None:
    """"pylate", "stanford", or None for any other folder."""
    config = model_dir / "config.json"
    if config.exists() and (read_json(config).get("architectures") or [None])[0] == STANFORD_ARCHITECTURE:
        return "stanford"
    st_config = model_dir / "config_sentence_transformers.json"
    if st_config.exists() and (read_json(st_config) or {}).get("model_type") == "ColBERT":
        return "pylate"
    modules = model_dir / "modules.json"
    if modules.exists() and any(str(m.get("type", "")).startswith("pylate.") for m in read_json(modules) or []):
        return "pylate"
    return None


def read_spec(model_dir: Path) -> MultiVectorSpec:
    """A multi-vector folder's spec, whichever layout it has."""
    folder = kind(model_dir)
    if folder == "pylate":
        return read_pylate(model_dir)
    if folder == "stanford":
        return read_stanford(model_dir)
    return read_multivector(model_dir)


def read_pylate(model_dir: Path) -> MultiVectorSpec:
    st_path = model_dir / "config_sentence_transformers.json"
    raw = read_json(st_path) if st_path.exists() else {}
    config = {**_PYLATE_DEFAULTS, **{k: v for k, v in raw.items() if k in _PYLATE_DEFAULTS and v is not None}}
    checked_modules(model_dir, _PYLATE_MODULES, "a PyLate ColBERT model")
    skiplist = raw.get("skiplist_words")
    return _spec(model_dir, str(st_path), query_prefix=config["query_prefix"],
                 document_prefix=config["document_prefix"], query_length=config["query_length"],
                 document_length=config["document_length"], expand=bool(config["do_query_expansion"]),
                 attend=bool(config["attend_to_expansion_tokens"]),
                 skiplist_words=list(string.punctuation) if skiplist is None else list(skiplist))


def read_stanford(model_dir: Path) -> MultiVectorSpec:
    path = model_dir / "artifact.metadata"
    metadata = read_json(path) if path.exists() else {}
    where = str(path)
    if metadata.get("mask_punctuation", True) is not True:
        raise ModelLoadError(f"{where}: mask_punctuation false is not supported (PyLate masks punctuation "
                             "regardless, colbert-ai does not)")
    if metadata.get("similarity", "cosine") != "cosine":
        raise ModelLoadError(f"{where}: similarity {metadata['similarity']!r} is not supported; only cosine "
                             "(MaxSim over normalized token vectors)")
    if metadata.get("interaction", "colbert") != "colbert":
        raise ModelLoadError(f"{where}: interaction {metadata['interaction']!r} is not supported; only colbert")
    return _spec(model_dir, where, query_prefix=metadata.get("query_token_id") or "[unused0]",
                 document_prefix=metadata.get("doc_token_id") or "[unused1]",
                 query_length=metadata.get("query_maxlen") or _PYLATE_DEFAULTS["query_length"],
                 document_length=metadata.get("doc_maxlen") or _PYLATE_DEFAULTS["document_length"],
                 expand=True, attend=bool(metadata.get("attend_to_mask_tokens", False)),
                 skiplist_words=list(string.punctuation))


def _spec(model_dir: Path, where: str, *, query_prefix: Any, document_prefix: Any, query_length: Any,
          document_length: Any, expand: bool, attend: bool, skiplist_words: list[str]) -> MultiVectorSpec:
    ids = vocabulary(model_dir)
    query_marker = _marker_id(ids, query_prefix, f"{where}: query prefix")
    document_marker = _marker_id(ids, document_prefix, f"{where}: document prefix")
    query_cap = positive(query_length, f"{where}: query length")
    document_cap = positive(document_length, f"{where}: document length")
    assert query_cap is not None and document_cap is not None      # both have defaults
    expansion = None
    if expand:
        token_id = expansion_token_id(model_dir, None, _EXPANSION_TOKENS, ids)
        if token_id is None:
            raise ModelLoadError(f"{where}: the tokenizer has no mask, EOS or pad token to expand queries with")
        expansion = QueryExpansion(strategy="fixed", length=query_cap, attend=attend, token_id=token_id)
    return MultiVectorSpec(skiplist_ids=_skiplist_ids(model_dir, ids, skiplist_words),
                           skiplist_tasks=("document",), similarity="maxsim", expansion=expansion,
                           query_length=query_cap, document_length=document_cap,
                           query_marker_id=query_marker, document_marker_id=document_marker)


def _marker_id(ids: dict[str, int], prefix: Any, where: str) -> int | None:
    """A prefix's token id (None for ""): PyLate adds a prefix the tokenizer lacks as a new
    token with an untrained embedding, which no saved folder can reproduce."""
    if prefix == "":
        return None
    if not isinstance(prefix, str) or prefix not in ids:
        raise ModelLoadError(f"{where} {prefix!r} is not a token of the model's tokenizer")
    return ids[prefix]


def _skiplist_ids(model_dir: Path, ids: dict[str, int], words: list[str]) -> tuple[int, ...]:
    """``convert_tokens_to_ids`` of each word: the unknown token's id for a word the
    vocabulary lacks (dropped where the tokenizer has none)."""
    unknown = _unknown_id(model_dir, ids)
    found = {ids.get(str(word), unknown) for word in words}
    return tuple(sorted(i for i in found if i is not None))


def _unknown_id(model_dir: Path, ids: dict[str, int]) -> int | None:
    model = (read_json(model_dir / "tokenizer.json").get("model") or {})
    name = model.get("unk_token")
    if isinstance(name, str):
        return ids.get(name)
    if isinstance(model.get("unk_id"), int):           # Unigram
        return int(model["unk_id"])
    return None


def legacy_prompts(prompts: dict[str, str], default_prompt_name: str | None) -> dict[str, str]:
    """The prompts a PyLate / Stanford-NLP folder's queries and documents get, as text: PyLate
    applies only the default prompt (if one is named) to both; the markers are token ids."""
    default = prompts.get(default_prompt_name, "") if default_prompt_name is not None else ""
    return {**prompts, "query": default, "document": default}


def stanford_dense(model_dir: Path, hidden_size: int) -> DenseSpec:
    """The projection of a Stanford-NLP checkpoint: its ``linear.weight`` [dim, hidden], no
    bias, read by engine/dense.py from the model's own weights. Its width comes from the
    safetensors header (no torch here), else ``artifact.metadata``'s ``dim`` (128)."""
    dim = _safetensors_shape(model_dir / "model.safetensors", "linear.weight")
    if dim is None:
        metadata = model_dir / "artifact.metadata"
        dim = [int((read_json(metadata) if metadata.exists() else {}).get("dim") or 128), hidden_size]
    if len(dim) != 2 or dim[1] != hidden_size:
        raise ModelLoadError(f"{model_dir}: linear.weight has shape {tuple(dim)}, expected (dim, {hidden_size})")
    return DenseSpec(model_dir, hidden_size, int(dim[0]), bias=False, activation="identity")


def _safetensors_shape(path: Path, name: str) -> list[int] | None:
    """``name``'s shape from a safetensors file's JSON header; None where the file is absent."""
    if not path.exists():
        return None
    try:
        with path.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
    except (OSError, ValueError, struct.error) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from None
    if name not in header:
        raise ModelLoadError(f"{path}: a Stanford-NLP ColBERT checkpoint without {name} (its projection)")
    return [int(n) for n in header[name]["shape"]]
