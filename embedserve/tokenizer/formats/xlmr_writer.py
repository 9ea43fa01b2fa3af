"""Write an XLM-R-style Unigram tokenizer as Hugging Face and SentencePiece files.

Owns serializing a vocabulary (pieces and scores in Hugging Face id order)
plus a precompiled charsmap into ``tokenizer.json`` (Unigram, Precompiled +
Replace(" {2,}", " "), Metaspace, the XLM-R template ``<s> A </s></s> B </s>``),
``sentencepiece.bpe.model`` (a ModelProto written with a small protobuf
encoder, so no sentencepiece is needed), ``tokenizer_config.json`` and
``special_tokens_map.json``. Used by the default-model builder only.

Id mapping (fairseq's): HF <s>=0, <pad>=1, </s>=2, <unk>=3, normal piece
i = SentencePiece id i - 1, <mask> last; SentencePiece <unk>=0, <s>=1, </s>=2.
"""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

import numpy as np

_SPECIALS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
# SentencePiece piece types (sentencepiece_model.proto)
_NORMAL, _UNKNOWN, _CONTROL = 1, 2, 3


def _added_token(token_id: int, content: str) -> dict:
    return {"id": token_id, "content": content, "single_word": False,
            "lstrip": content == "<mask>", "rstrip": False, "normalized": False, "special": True}


def _template(pair: bool) -> list[dict]:
    def special(name: str) -> dict:
        return {"SpecialToken": {"id": name, "type_id": 0}}

    def sequence(name: str) -> dict:
        return {"Sequence": {"id": name, "type_id": 0}}
    single = [special("<s>"), sequence("A"), special("</s>")]
    return single + [special("</s>"), sequence("B"), special("</s>")] if pair else single


def tokenizer_json(pieces: list[str], scores: np.ndarray, charsmap: bytes) -> dict:
    mask_id = len(pieces) - 1
    metaspace = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [_added_token(i, c) for c, i in _SPECIALS.items()] + [_added_token(mask_id, "<mask>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Precompiled", "precompiled_charsmap": base64.b64encode(charsmap).decode("ascii")},
            {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "}]},
        "pre_tokenizer": metaspace,
        "post_processor": {
            "type": "TemplateProcessing", "single": _template(False), "pair": _template(True),
            "special_tokens": {name: {"id": name, "ids": [_SPECIALS[name]], "tokens": [name]}
                               for name in ("</s>", "<s>")}},
        "decoder": metaspace,
        "model": {"type": "Unigram", "unk_id": _SPECIALS["<unk>"], "byte_fallback": False,
                  "vocab": [[piece, float(score)] for piece, score in zip(pieces, scores.tolist())]},
    }


# --- a minimal protobuf encoder for sentencepiece_model.proto --------------

def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1                  # negative int32 -> 10-byte two's complement
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field_varint(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _field_bytes(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _field_float(number: int, value: float) -> bytes:
    return _varint(number << 3 | 5) + struct.pack("<f", value)


def sentencepiece_model(pieces: list[str], scores: np.ndarray, charsmap: bytes) -> bytes:
    """The SentencePiece ModelProto for an HF-ordered fairseq vocabulary."""
    body = bytearray()
    spm_pieces = [("<unk>", 0.0, _UNKNOWN), ("<s>", 0.0, _CONTROL), ("</s>", 0.0, _CONTROL)]
    spm_pieces += [(pieces[i], float(scores[i]), _NORMAL) for i in range(4, len(pieces) - 1)]
    for piece, score, kind in spm_pieces:
        body += _field_bytes(1, _field_bytes(1, piece.encode("utf-8")) + _field_float(2, score)
                             + _field_varint(3, kind))
    trainer = (_field_varint(3, 1)                           # model_type UNIGRAM
               + _field_varint(4, len(spm_pieces))           # vocab_size
               + _field_varint(40, 0) + _field_varint(41, 1)  # unk_id, bos_id
               + _field_varint(42, 2) + _field_varint(43, -1))  # eos_id, pad_id (none)
    normalizer = (_field_bytes(1, b"nmt_nfkc") + _field_bytes(2, charsmap)
                  + _field_varint(3, 1) + _field_varint(4, 1) + _field_varint(5, 1))
    body += _field_bytes(2, trainer) + _field_bytes(3, normalizer)
    return bytes(body)


def write_tokenizer_files(directory: Path, pieces: list[str], scores: np.ndarray, charsmap: bytes,
                          max_length: int) -> None:
    (directory / "tokenizer.json").write_text(
        json.dumps(tokenizer_json(pieces, scores, charsmap), ensure_ascii=False), encoding="utf-8")
    (directory / "sentencepiece.bpe.model").write_bytes(sentencepiece_model(pieces, scores, charsmap))
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "sep_token": "</s>",
                "cls_token": "<s>", "pad_token": "<pad>", "mask_token": "<mask>"}
    (directory / "special_tokens_map.json").write_text(json.dumps(specials, indent=2))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "XLMRobertaTokenizer", "model_max_length": max_length,
         "clean_up_tokenization_spaces": True, **specials}, indent=2))
