"""Load a BERT-family ``tokenizer.json`` (model ``WordPiece``) into a TokenizerSpec.

Supported, exactly as tokenizers 0.23.3 runs them:

- model ``WordPiece``: ``vocab`` (ids 0..V-1), ``unk_token`` (in the vocabulary),
  ``continuing_subword_prefix``, ``max_input_chars_per_word``;
- normalizer ``BertNormalizer`` (each switch as the file says; ``strip_accents`` null
  follows ``lowercase``) or none;
- pre_tokenizer ``BertPreTokenizer``;
- post_processor ``TemplateProcessing`` (with each item's ``type_id``), ``BertProcessing``
  or none;
- added tokens only if special and in the vocabulary (CONTROL pieces: never matched
  in text; see hf_json.py).

The file's ``truncation`` and ``padding`` are ignored (the encode API decides), as is
the ``decoder``. Anything else raises ModelLoadError naming the file and the field.
hf_json.load_tokenizer_json hands such files here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from embedserve.errors import ModelLoadError
from embedserve.tokenizer.formats.hf_json import (
    _Fail,
    _first_special,
    _last_special,
    _read_added_tokens,
    _read_post_processor,
)
from embedserve.tokenizer.spec import BertNormalization, PieceKind, TokenizerSpec, WordPieceParams


def read_wordpiece_json(doc: dict, source: str) -> TokenizerSpec:
    """A parsed tokenizer.json whose model is WordPiece, as a spec (compat "hf")."""
    fail = _Fail(source)
    model = doc["model"]
    pieces = _read_vocab(model.get("vocab"), fail)
    unk = model.get("unk_token", "[UNK]")
    index = {piece: i for i, piece in enumerate(pieces)}
    if unk not in index:
        raise fail("model.unk_token", f"{unk!r} is not in the vocabulary")
    prefix = model.get("continuing_subword_prefix", "##")
    max_chars = model.get("max_input_chars_per_word", 100)
    if not isinstance(prefix, str):
        raise fail("model.continuing_subword_prefix", "expected a string")
    if not isinstance(max_chars, int) or isinstance(max_chars, bool) or max_chars < 0:
        raise fail("model.max_input_chars_per_word", "expected an integer >= 0")
    normalizer = read_bert_normalizer(doc.get("normalizer"), fail)
    pre = doc.get("pre_tokenizer")
    if not (isinstance(pre, dict) and pre.get("type") == "BertPreTokenizer"):
        kind = pre.get("type") if isinstance(pre, dict) else pre
        raise fail("pre_tokenizer.type", f"{kind!r} is not supported with WordPiece; supported: BertPreTokenizer")
    specials = _read_added_tokens(doc.get("added_tokens") or [], pieces, fail)
    return wordpiece_spec(source, pieces, index[unk], specials, doc.get("post_processor"),
                          WordPieceParams(prefix, max_chars, normalizer), fail)


def wordpiece_spec(source: str, pieces: list[str], unk_id: int, specials: dict[str, int], post_processor: Any,
                   params: WordPieceParams, fail: _Fail) -> TokenizerSpec:
    """The spec for a WordPiece vocabulary in id order; special tokens become CONTROL."""
    kinds = np.full(len(pieces), PieceKind.NORMAL, np.uint8)
    seen: dict[str, int] = {}
    for i, piece in enumerate(pieces):  # a repeated piece: the last id wins, as in a dict built in order
        if piece in seen:
            kinds[seen[piece]] = PieceKind.UNUSED
        seen[piece] = i
    for token_id in specials.values():
        kinds[token_id] = PieceKind.CONTROL
    kinds[unk_id] = PieceKind.UNKNOWN
    single, pair, single_types, pair_types = _read_post_processor(post_processor, specials, len(pieces), fail,
                                                                  -1, -1)
    return TokenizerSpec(
        source=source, compat="hf", pieces=pieces, scores=np.zeros(len(pieces)), kinds=kinds, unk_id=unk_id,
        bos_id=_first_special(single, -1), eos_id=_last_special(single, -1), pad_id=specials.get("[PAD]", -1),
        single_template=single, pair_template=pair, mask_id=specials.get("[MASK]"),
        single_type_ids=single_types, pair_type_ids=pair_types, wordpiece=params)


def read_bert_normalizer(node: Any, fail: _Fail) -> BertNormalization | None:
    if node is None:
        return None
    if not (isinstance(node, dict) and node.get("type") == "BertNormalizer"):
        kind = node.get("type") if isinstance(node, dict) else node
        raise fail("normalizer.type", f"{kind!r} is not supported with WordPiece; supported: BertNormalizer, none")
    switches = {}
    for name in ("clean_text", "handle_chinese_chars", "lowercase"):
        value = node.get(name, True)
        if not isinstance(value, bool):
            raise fail(f"normalizer.{name}", "expected true or false")
        switches[name] = value
    strip = node.get("strip_accents")
    if strip is not None and not isinstance(strip, bool):
        raise fail("normalizer.strip_accents", "expected true, false or null")
    return BertNormalization(switches["clean_text"], switches["handle_chinese_chars"],
                             switches["lowercase"] if strip is None else strip, switches["lowercase"])


def _read_vocab(vocab: Any, fail: _Fail) -> list[str]:
    if not isinstance(vocab, dict) or not vocab:
        raise fail("model.vocab", "expected a non-empty object of piece: id")
    pieces: list[str | None] = [None] * len(vocab)
    for piece, token_id in vocab.items():
        if not isinstance(token_id, int) or isinstance(token_id, bool) or not 0 <= token_id < len(vocab) \
                or pieces[token_id] is not None:
            raise ModelLoadError(f"{fail.source}: field model.vocab[{piece!r}]: id {token_id!r}: supported: "
                                 f"ids 0..{len(vocab) - 1}, each once")
        pieces[token_id] = piece
    return pieces  # type: ignore[return-value]
