"""HfTokenizer: a tokenizer.json run by Hugging Face ``tokenizers`` itself (``backend`` "tokenizers").

The fallback for everything the native encoder does not run (``load.py`` decides):
byte-level BPE (GPT-2, Llama-3, Qwen2/Qwen3), Unigram with byte_fallback, any
normalizer, pre-tokenizer or post-processor. Ids, type ids and offsets are the
library's own, so it is exact by construction; this module only adapts the library to
``backend.TokenizerBackend``:

- the template, truncation and type ids are the library's: a call with truncation runs
  on a clone of the tokenizer with ``enable_truncation(max_length, longest_first,
  direction)`` set (one clone per setting, kept: the library's truncation is tokenizer
  state, and mutating a shared tokenizer under concurrent calls would race);
- special tokens come only from the template: ``encode_special_tokens`` is on, so text
  that looks like ``<|endoftext|>`` is ordinary text (as in the native encoder);
- lone surrogates (JSON can carry them) become U+FFFD, as in the native encoder (the
  library refuses such strings);
- ``truncated`` / ``original_lengths`` of a cut text count the library's overflowing
  encodings; of a cut pair, a second, template-free encode of the texts.

Importing ``tokenizers`` loads no torch (the gateway stays torch-free). Batches run on
the library's Rayon pool (``RAYON_NUM_THREADS`` sizes it); ``threads=1`` encodes text
by text on the calling thread instead.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from embedserve.errors import InvalidInput, ModelLoadError
from embedserve.tokenizer.backend import Truncation
from embedserve.tokenizer.encoded import EncodedBatch
from embedserve.tokenizer.spec import Compat
from embedserve.tokenizer.templates import NO_LIMIT, truncation_limit

_SURROGATE = re.compile("[\ud800-\udfff]")
# Texts probed to read the single template's specials off a real encoding: the first
# that yields a content token decides (a tiny vocabulary may lack some characters).
_PROBES = ("a", "hello", "0", ".", "\u4e00")
# Truncation settings whose clone is kept; the gateway uses two (left, right).
MAX_TRUNCATION_CLONES = 8


def _clean(text: str) -> str:
    if not isinstance(text, str):
        raise InvalidInput(f"expected a string, got {type(text).__name__}")
    if text.isascii() or not _SURROGATE.search(text):
        return text
    return _SURROGATE.sub("\ufffd", text)


class HfTokenizer:
    """``tokenizers.Tokenizer`` behind the TokenizerBackend surface."""

    backend = "tokenizers"

    def __init__(self, tokenizer_json: str, source: str, threads: int | None = None) -> None:
        """``tokenizer_json``: the file's text; ``source`` names it in errors and logs."""
        import tokenizers

        self.source = source
        self._json = tokenizer_json
        try:
            self._full = self._new(tokenizer_json)
        except Exception as exc:  # the library raises plain Exceptions for bad files
            raise ModelLoadError(f"{source}: tokenizers cannot load this tokenizer.json: {exc}") from exc
        doc = json.loads(tokenizer_json)
        self._threads = threads
        # The template-free encoder (counts before cuts, for pairs) and one tokenizer per
        # truncation, each built on first use: a build is most of a second for a large
        # vocabulary, and a caller that encodes no pairs (a calibration) never needs the first.
        self._raw: tokenizers.Tokenizer | None = None
        self._clones: dict[tuple[int, str], tokenizers.Tokenizer] = {}
        self._clones_lock = threading.Lock()
        self._vocab_size = 1 + max(self._full.get_vocab(with_added_tokens=True).values(), default=-1)
        self._n_added = (self._full.num_special_tokens_to_add(False), self._full.num_special_tokens_to_add(True))
        self._specials = self._read_single_specials()
        self._unk_id = self._model_token_id(doc.get("model") or {}, "unk_token", "unk_id")

    @classmethod
    def from_file(cls, path: str | Path, threads: int | None = None) -> HfTokenizer:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelLoadError(f"{path}: cannot read tokenizer.json: {exc}") from exc
        return cls(text, str(path), threads)

    @staticmethod
    def _new(tokenizer_json: str):
        import tokenizers

        tokenizer = tokenizers.Tokenizer.from_str(tokenizer_json)
        tokenizer.no_truncation()  # the file's own truncation/padding never apply: the API's
        tokenizer.no_padding()     # max_length decides, and batches are packed, not padded
        tokenizer.encode_special_tokens = True
        return tokenizer

    # ---- vocabulary ----------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def compat(self) -> Compat:
        return "hf"

    @property
    def single_specials(self) -> tuple[np.ndarray, np.ndarray]:
        return self._specials

    @property
    def bos_id(self) -> int:
        return int(self._specials[0][0]) if len(self._specials[0]) else -1

    @property
    def eos_id(self) -> int:
        return int(self._specials[1][-1]) if len(self._specials[1]) else -1

    @property
    def unk_id(self) -> int:
        return self._unk_id

    def id_to_piece(self, token_id: int) -> str:
        piece = self._full.id_to_token(token_id) if 0 <= token_id < self._vocab_size else None
        if piece is None:
            raise InvalidInput(f"token id {token_id} is outside the vocabulary (0..{self._vocab_size - 1})")
        return piece

    # ---- encoding ------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> np.ndarray:
        ids = self._full.encode(_clean(text), add_special_tokens=add_special_tokens).ids
        return np.asarray(ids, np.int32)

    def encode_batch(self, texts: Sequence[str], max_length: int | None = None,
                     truncation: Truncation = None, add_special_tokens: bool = True,
                     return_offsets: bool = False) -> EncodedBatch:
        limit, _ = truncation_limit(max_length, truncation)
        texts = self._texts(texts)
        added = self._n_added[0] if add_special_tokens else 0
        if limit != NO_LIMIT and limit < added:
            raise InvalidInput(f"max_length {limit} leaves no room for the special tokens", "max_length")
        encodings = self._run(self._for(limit, truncation), texts, add_special_tokens)
        lengths = np.fromiter((len(e.ids) for e in encodings), np.int64, len(encodings))
        if limit == NO_LIMIT:
            original = lengths
        else:  # the cut-off tokens are in the overflowing encodings, each with the template again
            original = lengths + np.fromiter((sum(len(o.ids) - added for o in e.overflowing) for e in encodings),
                                             np.int64, len(encodings))
        return _pack(encodings, lengths, original, return_offsets)

    def encode_pair(self, a: str, b: str, max_length: int | None = None,
                    truncation: Truncation = None, add_special_tokens: bool = True) -> np.ndarray:
        return self.encode_pairs(a, [b], max_length, truncation, add_special_tokens).sequence(0).copy()

    def encode_pairs(self, query: str, docs: Sequence[str], max_length: int | None = None,
                     truncation: Truncation = None, add_special_tokens: bool = True,
                     return_offsets: bool = False) -> EncodedBatch:
        limit, _ = truncation_limit(max_length, truncation)
        query, docs = _clean(query), self._texts(docs)
        added = self._n_added[1] if add_special_tokens else 0
        if limit != NO_LIMIT and limit < added:
            raise InvalidInput(f"max_length {limit} leaves no room for the special tokens", "max_length")
        pairs = [(query, doc) for doc in docs]
        encodings = self._run(self._for(limit, truncation), pairs, add_special_tokens)
        lengths = np.fromiter((len(e.ids) for e in encodings), np.int64, len(encodings))
        if limit == NO_LIMIT:
            original = lengths
        else:
            counts = self._raw_counts([query, *docs])
            original = counts[0] + counts[1:] + added
        return _pack(encodings, lengths, original, return_offsets)

    def tokenize(self, text: str) -> list[str]:
        return self._full.encode(_clean(text), add_special_tokens=False).tokens

    # ---- internals -----------------------------------------------------------------
    @staticmethod
    def _texts(texts: Sequence[str]) -> list[str]:
        if isinstance(texts, str):
            raise InvalidInput("expected a list of strings, got one string")
        return [_clean(t) for t in texts]

    def _run(self, tokenizer, inputs: list, add_special_tokens: bool) -> list:
        """Encodings of texts or (a, b) pairs: on the library's Rayon pool, or text by text
        on this thread when ``threads`` is 1."""
        if self._threads == 1:
            return [tokenizer.encode(*(x if isinstance(x, tuple) else (x,)), add_special_tokens=add_special_tokens)
                    for x in inputs]
        return tokenizer.encode_batch(inputs, add_special_tokens=add_special_tokens)

    def _raw_counts(self, texts: list[str]) -> np.ndarray:
        with self._clones_lock:
            if self._raw is None:
                doc = json.loads(self._json)
                doc["post_processor"] = None
                self._raw = self._new(json.dumps(doc))
            raw = self._raw
        encodings = self._run(raw, texts, False)
        return np.fromiter((len(e.ids) for e in encodings), np.int64, len(encodings))

    def _for(self, limit: int, truncation: Truncation):
        """The tokenizer that cuts to ``limit`` from ``truncation``'s side (the shared one
        when there is no limit)."""
        if limit == NO_LIMIT:
            return self._full
        key = (limit, str(truncation))
        with self._clones_lock:
            clone = self._clones.get(key)
            if clone is None:
                if len(self._clones) >= MAX_TRUNCATION_CLONES:
                    self._clones.pop(next(iter(self._clones)))
                clone = self._new(self._json)
                clone.enable_truncation(limit, stride=0, strategy="longest_first", direction=truncation)
                self._clones[key] = clone
            return clone

    def _read_single_specials(self) -> tuple[np.ndarray, np.ndarray]:
        """The ids before and after the text in the single template, read off an encoding."""
        for probe in _PROBES:
            encoding = self._full.encode(probe)
            sequence = encoding.sequence_ids
            content = [i for i, s in enumerate(sequence) if s is not None]
            if content:
                ids = np.asarray(encoding.ids, np.int32)
                return ids[:content[0]].copy(), ids[content[-1] + 1:].copy()
        ids = np.asarray(self._full.encode("").ids, np.int32)
        return ids, np.zeros(0, np.int32)

    def _model_token_id(self, model: dict, token_key: str, id_key: str) -> int:
        if isinstance(model.get(id_key), int):
            return int(model[id_key])
        token = model.get(token_key)
        token_id = self._full.token_to_id(token) if isinstance(token, str) else None
        return -1 if token_id is None else int(token_id)


def _pack(encodings: list, lengths: np.ndarray, original: np.ndarray, return_offsets: bool) -> EncodedBatch:
    """Library encodings -> one packed EncodedBatch (type ids only when any is non-zero)."""
    cu = np.zeros(len(encodings) + 1, np.int32)
    np.cumsum(lengths, out=cu[1:])
    ids = np.fromiter((t for e in encodings for t in e.ids), np.int32, int(cu[-1]))
    types = np.fromiter((t for e in encodings for t in e.type_ids), np.int32, int(cu[-1]))
    offsets = None
    if return_offsets:
        offsets = np.array([o for e in encodings for o in e.offsets], np.int32).reshape(-1, 2)
    return EncodedBatch(ids, cu, types if types.any() else None,
                        truncated=np.asarray(original > lengths), original_lengths=original.astype(np.int32),
                        offsets=offsets)
