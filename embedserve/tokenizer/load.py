"""The one place that decides which tokenizer implementation runs a model.

``load_tokenizer(model_dir)`` / ``load_tokenizer_file(path)`` return a
``backend.TokenizerBackend``: the native Numba encoder when it runs the file exactly,
else :class:`~embedserve.tokenizer.hf_tokenizer.HfTokenizer` (the ``tokenizers``
library itself), so no model with a valid tokenizer.json fails to load for tokenizer
reasons. The choice and its reason are logged.

The decision is a function of the tokenizer.json: ``native_backend_for(doc)`` looks at
the model (its type, byte_fallback); then the native loader reads the rest
(normalizer, pre-tokenizer, post-processor, added tokens) and refuses, with a
``ModelLoadError`` naming the field, anything it cannot reproduce exactly; such a
refusal sends the file to ``tokenizers`` too. A SentencePiece ``.model`` (and
``compat="sentencepiece"``) always runs natively: there is no library fallback for it
at run time.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from embedserve.errors import ModelLoadError
from embedserve.tokenizer.backend import TokenizerBackend
from embedserve.tokenizer.formats.hf_json import read_tokenizer_json, tokenizer_json_spec
from embedserve.tokenizer.hf_tokenizer import HfTokenizer
from embedserve.tokenizer.spec import Compat
from embedserve.tokenizer.tokenizer import DEFAULT_CACHE_DIR, Tokenizer

log = logging.getLogger(__name__)

# tokenizer.json model.type -> the native backend that may run it (the native loader
# still checks the rest of the file). A new native model type is one entry here.
NATIVE_MODEL_TYPES = {
    "Unigram": "native-unigram",
    "WordPiece": "native-wordpiece",
}


def native_backend_for(doc: Any) -> tuple[str | None, str]:
    """(the native backend for this tokenizer.json, or None; the reason, for the log)."""
    model = doc.get("model") if isinstance(doc, dict) else None
    kind = model.get("type") if isinstance(model, dict) else None
    if kind not in NATIVE_MODEL_TYPES:
        return None, f"model type {kind!r} has no native encoder"
    if model.get("byte_fallback"):  # type: ignore[union-attr]  # a dict: kind is None otherwise
        return None, f"{kind} with byte_fallback has no native encoder in hf mode"
    return NATIVE_MODEL_TYPES[kind], f"{kind} model"


def load_tokenizer(model_dir: str | Path, compat: Compat = "hf",
                   cache_dir: str | Path | None = DEFAULT_CACHE_DIR) -> TokenizerBackend:
    """A model directory's tokenizer: tokenizer.json when present (and compat is "hf"),
    else sentencepiece.bpe.model in XLM-R id order (native)."""
    json_path = Path(model_dir) / "tokenizer.json"
    if compat == "hf" and json_path.is_file():
        return load_tokenizer_file(json_path, "hf", cache_dir)
    return Tokenizer.from_model_dir(model_dir, compat, cache_dir)


def load_tokenizer_file(path: str | Path, compat: Compat | None = None,
                        cache_dir: str | Path | None = DEFAULT_CACHE_DIR) -> TokenizerBackend:
    """A ``tokenizer.json`` (native when supported, else ``tokenizers``) or a ``.model`` (native)."""
    path = Path(path)
    if path.suffix != ".json" or compat == "sentencepiece":
        return Tokenizer.from_file(path, compat, cache_dir)
    doc = read_tokenizer_json(path)  # parsed once, for the choice and the native loader
    native, why = native_backend_for(doc)
    if native is not None:
        try:
            tokenizer = Tokenizer(tokenizer_json_spec(doc, str(path)),
                                  Path(cache_dir) if cache_dir is not None else None)
        except ModelLoadError as exc:
            why = f"the native {native} encoder refused it: {exc.message}"
        else:
            log.info("tokenizer %s: backend %s (%s)", path, tokenizer.backend, why)
            return tokenizer
    del doc  # not held while the fallback parses the file its own way
    try:
        fallback = HfTokenizer(path.read_text(encoding="utf-8"), str(path))
    except ModelLoadError as exc:
        raise ModelLoadError(f"{exc.message} (native: {why})") from exc
    log.info("tokenizer %s: backend %s (%s)", path, fallback.backend, why)
    return fallback
