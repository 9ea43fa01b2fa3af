"""Load a BERT model directory that has no tokenizer.json: ``vocab.txt`` + ``tokenizer_config.json``.

The tokenizer built is the one transformers' ``BertTokenizerFast.from_pretrained`` builds
from the same files (transformers 5): WordPiece over ``vocab.txt`` (one piece per line,
id = line number, only the newline stripped; a repeated piece keeps its last id),
``[UNK]`` from ``unk_token``, continuation prefix ``##``, at most 100 characters a word;
``BertNormalizer(clean_text=True, handle_chinese_chars=tokenize_chinese_chars,
strip_accents=strip_accents, lowercase=do_lower_case)``; ``BertPreTokenizer``; and the
template ``[CLS]:0 $A:0 [SEP]:0`` / ``... $B:1 [SEP]:1``. Special tokens come from
tokenizer_config.json, else special_tokens_map.json, else BERT's defaults.
``model_max_length`` is kept in ``spec.extra``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from embedserve.errors import ModelLoadError
from embedserve.tokenizer.formats.hf_json import _Fail
from embedserve.tokenizer.formats.wordpiece_json import wordpiece_spec
from embedserve.tokenizer.spec import BertNormalization, TokenizerSpec, WordPieceParams

SPECIAL_DEFAULTS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                    "mask_token": "[MASK]"}


def load_bert_vocab_dir(model_dir: str | Path) -> TokenizerSpec:
    model_dir = Path(model_dir)
    vocab_path = model_dir / "vocab.txt"
    source = str(vocab_path)
    try:
        lines = vocab_path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{source}: cannot read vocab.txt: {exc}") from exc
    if lines and lines[-1] == "":
        lines.pop()  # the newline after the last piece ends a line; it starts none
    if not lines:
        raise ModelLoadError(f"{source}: the vocabulary is empty")
    config = _read_json(model_dir / "tokenizer_config.json")
    special_map = _read_json(model_dir / "special_tokens_map.json")
    index = {piece: i for i, piece in enumerate(lines)}  # the last id wins, as transformers' load_vocab
    specials: dict[str, int] = {}
    names: dict[str, str] = {}
    for key, default in SPECIAL_DEFAULTS.items():
        content = _token_content(config.get(key, special_map.get(key, default)), key, model_dir)
        names[key] = content
        if content in index:
            specials[content] = index[content]
    unk = names["unk_token"]
    if unk not in specials:
        raise ModelLoadError(f"{source}: the unknown token {unk!r} is not in the vocabulary")
    for key in ("cls_token", "sep_token"):
        if names[key] not in specials:
            raise ModelLoadError(f"{source}: the {key} {names[key]!r} is not in the vocabulary")
    cls, sep = names["cls_token"], names["sep_token"]
    post_processor = {
        "type": "TemplateProcessing",
        "single": [_special(cls, 0), _sequence("A", 0), _special(sep, 0)],
        "pair": [_special(cls, 0), _sequence("A", 0), _special(sep, 0), _sequence("B", 1), _special(sep, 1)],
        "special_tokens": {name: {"id": name, "ids": [specials[name]], "tokens": [name]} for name in (cls, sep)},
    }
    lowercase = _flag(config, "do_lower_case", True, model_dir)
    strip = config.get("strip_accents")
    if strip is not None and not isinstance(strip, bool):
        raise ModelLoadError(f"{model_dir / 'tokenizer_config.json'}: strip_accents: expected true, false or null")
    normalization = BertNormalization(True, _flag(config, "tokenize_chinese_chars", True, model_dir),
                                      lowercase if strip is None else strip, lowercase)
    spec = wordpiece_spec(source, lines, specials[unk], specials, post_processor,
                          WordPieceParams("##", 100, normalization), _Fail(source))
    max_length = config.get("model_max_length")
    if isinstance(max_length, int) and not isinstance(max_length, bool):
        spec.extra["model_max_length"] = str(max_length)
    return spec


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}: cannot read: {exc}") from exc
    if not isinstance(doc, dict):
        raise ModelLoadError(f"{path}: expected a JSON object")
    return doc


def _token_content(value: Any, key: str, model_dir: Path) -> str:
    """A special token given as a string or as an AddedToken object ({"content": ...})."""
    if isinstance(value, dict):
        value = value.get("content")
    if not isinstance(value, str) or not value:
        raise ModelLoadError(f"{model_dir}: {key}: expected a token string")
    return value


def _flag(config: dict, key: str, default: bool, model_dir: Path) -> bool:
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise ModelLoadError(f"{model_dir / 'tokenizer_config.json'}: {key}: expected true or false")
    return value


def _special(name: str, type_id: int) -> dict:
    return {"SpecialToken": {"id": name, "type_id": type_id}}


def _sequence(name: str, type_id: int) -> dict:
    return {"Sequence": {"id": name, "type_id": type_id}}
