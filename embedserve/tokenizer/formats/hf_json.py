"""Load a Hugging Face ``tokenizer.json`` with a Unigram model into a TokenizerSpec.

(A file whose model is ``WordPiece`` is handed to wordpiece_json.py, which shares the
added-token and post-processor readers here.)

Supported, exactly as tokenizers 0.23.3 runs them:

- model ``Unigram`` with an ``unk_id`` and ``byte_fallback`` false;
- normalizer: ``Precompiled``, ``Replace`` (a literal string, or a regex that is a
  literal or one character repeated: ``" {2,}"``, ``"x+"``), ``Strip``, nested in
  ``Sequence`` in any order, or none;
- pre_tokenizer: ``Metaspace`` (``prepend_scheme`` always/first/never or the legacy
  ``add_prefix_space``, ``split``), alone or after ``WhitespaceSplit`` in a ``Sequence``;
- post_processor: ``TemplateProcessing`` (each item's ``type_id`` kept as the segment
  id), ``RobertaProcessing``, ``BertProcessing`` or none (XLM-R's ``<s> A </s>`` /
  ``<s> A </s></s> B </s>``);
- added tokens only if special and in the model vocabulary (they become CONTROL
  pieces: never matched in text, unlike tokenizers, which splits them out).

The file's ``truncation`` and ``padding`` are ignored (the encode API's ``max_length``
decides), as is the ``decoder``.

Anything else raises ModelLoadError naming the file, the JSON field path and what is
supported. This module only reads JSON; normalize_hf.py runs the pipeline.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from embedserve.errors import ModelLoadError
from embedserve.tokenizer.spec import HfPipeline, PieceKind, TemplateItem, TokenizerSpec, xlmr_templates

_SUPPORTED_NORMALIZERS = "Precompiled, Replace, Strip, or a Sequence of them"
_SUPPORTED_PRE_TOKENIZERS = "Metaspace, or a Sequence of WhitespaceSplit then Metaspace"
_REGEX_META = set(".^$*+?{}[]\\|()")
_REPEAT = re.compile(r"^(\\?.)(\{(\d+),\}|\+)$", re.S)


class _Fail:
    """Builds ModelLoadErrors that name the file and the JSON field."""

    def __init__(self, source: str) -> None:
        self.source = source

    def __call__(self, field: str, what: str) -> ModelLoadError:
        return ModelLoadError(f"{self.source}: field {field}: {what}")


def load_tokenizer_json(path: str | Path) -> TokenizerSpec:
    """Read ``path`` (a tokenizer.json) into a TokenizerSpec with ``compat="hf"``."""
    return tokenizer_json_spec(read_tokenizer_json(path), str(path))


def read_tokenizer_json(path: str | Path) -> Any:
    """The parsed tokenizer.json, or a ModelLoadError naming the file.

    orjson: ~0.3 s less of every gateway's start on XLM-R's 17 MB file. It accepts
    exactly the JSON `tokenizers` (serde_json) does: no NaN, no lone surrogates.
    """
    try:
        return orjson.loads(Path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}: cannot read tokenizer.json: {exc}") from exc


def tokenizer_json_spec(doc: Any, source: str) -> TokenizerSpec:
    """A parsed tokenizer.json (``source`` names it in errors) as a TokenizerSpec, compat "hf"."""
    fail = _Fail(source)
    if not isinstance(doc, dict):
        raise fail("(root)", "expected a JSON object")

    model = doc.get("model")
    if isinstance(model, dict) and model.get("type") == "WordPiece":
        from embedserve.tokenizer.formats.wordpiece_json import read_wordpiece_json
        return read_wordpiece_json(doc, source)
    pieces, scores, unk_id = _read_model(model, fail)
    kinds = np.full(len(pieces), PieceKind.NORMAL, np.uint8)
    kinds[unk_id] = PieceKind.UNKNOWN
    specials = _read_added_tokens(doc.get("added_tokens") or [], pieces, fail)
    for token_id in specials.values():
        if token_id != unk_id:
            kinds[token_id] = PieceKind.CONTROL

    steps, charsmap = _read_normalizer(doc.get("normalizer"), "normalizer", fail)
    pipeline = _read_pre_tokenizer(doc.get("pre_tokenizer"), fail, steps)
    bos, eos = specials.get("<s>", -1), specials.get("</s>", -1)  # -1: the file has none
    single, pair, single_types, pair_types = _read_post_processor(doc.get("post_processor"), specials,
                                                                  len(pieces), fail, bos, eos)
    return TokenizerSpec(
        source=source, compat="hf", pieces=pieces, scores=scores, kinds=kinds, unk_id=unk_id,
        bos_id=_first_special(single, bos), eos_id=_last_special(single, eos),
        pad_id=specials.get("<pad>", -1), precompiled_charsmap=charsmap, hf=pipeline,
        single_template=single, pair_template=pair, mask_id=specials.get("<mask>"),
        single_type_ids=single_types, pair_type_ids=pair_types)


def spec_for_hf_compat(spec: TokenizerSpec) -> TokenizerSpec:
    """A SentencePiece-loaded spec run the way Hugging Face converts it (2020 hub shape):
    Precompiled + Replace(" {2,}", " "), then Metaspace (always prepend, split)."""
    from dataclasses import replace

    if spec.byte_fallback or (spec.kinds == PieceKind.USER_DEFINED).any():
        raise ModelLoadError(f"{spec.source}: USER_DEFINED pieces and byte_fallback run in "
                             "compat='sentencepiece' only; compat='hf' needs a tokenizer.json")
    steps = (("precompiled",), ("replace_run", " ", 2, " "))
    pipeline = HfPipeline(replace_rules=((" {2,}", " "),), normalizer_steps=steps,
                          has_precompiled=bool(spec.precompiled_charsmap))
    return replace(spec, compat="hf", hf=pipeline)


# ---- model ---------------------------------------------------------------------------
def _read_model(model: Any, fail: _Fail) -> tuple[list[str], np.ndarray, int]:
    if not isinstance(model, dict):
        raise fail("model", "missing; supported: a Unigram model")
    if model.get("type") != "Unigram":
        raise fail("model.type", f"{model.get('type')!r} is not supported; supported: Unigram, WordPiece")
    if model.get("byte_fallback"):
        raise fail("model.byte_fallback", "true is not supported; supported: false")
    vocab = model.get("vocab")
    if not isinstance(vocab, list) or not vocab:
        raise fail("model.vocab", "expected a non-empty list of [piece, score]")
    pieces, scores = _read_vocab(vocab, fail)
    if len(set(pieces)) != len(pieces):
        raise fail("model.vocab", "duplicate pieces are not supported")
    unk_id = model.get("unk_id")
    if not isinstance(unk_id, int) or isinstance(unk_id, bool) or not 0 <= unk_id < len(pieces):
        raise fail("model.unk_id", f"{unk_id!r}: supported: an id in the vocabulary")
    return pieces, scores, unk_id


def _read_vocab(vocab: list, fail: _Fail) -> tuple[list[str], np.ndarray]:
    """model.vocab's pieces and scores; every entry must be [piece (string), score (number)].

    Checked a column at a time (type() into a set, over C-level iterators): a loop over
    XLM-R's 250,002 entries testing each one cost ~0.4 s of every gateway's start. Only
    a vocabulary that fails is walked entry by entry, to name the first bad one.
    """
    pairs = {type(entry) for entry in vocab} <= {list} and {len(entry) for entry in vocab} == {2}
    pieces = [entry[0] for entry in vocab] if pairs else []
    scores = [entry[1] for entry in vocab] if pairs else []
    if not (pairs and {type(piece) for piece in pieces} <= {str}
            and {type(score) for score in scores} <= {int, float}):  # bool is neither
        raise _first_bad_entry(vocab, fail)
    return pieces, np.array(scores, np.float64)


def _first_bad_entry(vocab: list, fail: _Fail) -> ModelLoadError:
    for i, entry in enumerate(vocab):
        if (not isinstance(entry, list) or len(entry) != 2 or not isinstance(entry[0], str)
                or not isinstance(entry[1], (int, float)) or isinstance(entry[1], bool)):
            return fail(f"model.vocab[{i}]", "expected [piece (string), score (number)]")
    return fail("model.vocab", "expected a list of [piece (string), score (number)]")


def _read_added_tokens(added: Any, pieces: list[str], fail: _Fail) -> dict[str, int]:
    if not isinstance(added, list):
        raise fail("added_tokens", "expected a list")
    specials: dict[str, int] = {}
    for i, token in enumerate(added):
        field = f"added_tokens[{i}]"
        if not isinstance(token, dict) or not isinstance(token.get("id"), int):
            raise fail(field, "expected an object with an integer id")
        token_id, content = token["id"], token.get("content")
        if not token.get("special", False):
            raise fail(f"{field}.special", "non-special added tokens are not supported; "
                                           "supported: special tokens (never matched in text)")
        if not 0 <= token_id < len(pieces) or pieces[token_id] != content:
            raise fail(f"{field}.id", f"{content!r} is not piece {token_id} of the model vocabulary")
        specials[content] = token_id
    return specials


# ---- normalizer ----------------------------------------------------------------------
def _read_normalizer(node: Any, field: str, fail: _Fail) -> tuple[tuple[tuple, ...], bytes]:
    """Flattened normalizer steps and the (single) precompiled charsmap."""
    if node is None:
        return (), b""
    if not isinstance(node, dict):
        raise fail(field, f"expected an object; supported: {_SUPPORTED_NORMALIZERS}")
    kind = node.get("type")
    if kind == "Sequence":
        steps: list[tuple] = []
        charsmap = b""
        for i, child in enumerate(node.get("normalizers") or []):
            child_steps, child_map = _read_normalizer(child, f"{field}.normalizers[{i}]", fail)
            if child_map and charsmap and child_map != charsmap:
                raise fail(f"{field}.normalizers[{i}]", "two different Precompiled charsmaps; "
                                                        "supported: one")
            charsmap = charsmap or child_map
            steps.extend(child_steps)
        return tuple(steps), charsmap
    if kind == "Precompiled":
        encoded = node.get("precompiled_charsmap")
        if not encoded:
            return (), b""
        try:
            charsmap = base64.b64decode(encoded, validate=True)
        except (ValueError, TypeError) as exc:
            raise fail(f"{field}.precompiled_charsmap", f"not base64: {exc}") from exc
        return (("precompiled",),), charsmap
    if kind == "Replace":
        return (_read_replace(node, field, fail),), b""
    if kind == "Strip":
        left, right = node.get("strip_left", True), node.get("strip_right", True)
        return (("strip", bool(left), bool(right)),), b""
    raise fail(f"{field}.type", f"{kind!r} is not supported; supported: {_SUPPORTED_NORMALIZERS}")


def _read_replace(node: dict, field: str, fail: _Fail) -> tuple:
    pattern, content = node.get("pattern"), node.get("content")
    if not isinstance(content, str):
        raise fail(f"{field}.content", "expected a string")
    if isinstance(pattern, dict) and isinstance(pattern.get("String"), str) and pattern["String"]:
        return ("replace_literal", pattern["String"], content)
    if isinstance(pattern, dict) and isinstance(pattern.get("Regex"), str) and pattern["Regex"]:
        regex = pattern["Regex"]
        if not _REGEX_META & set(regex):
            return ("replace_literal", regex, content)
        repeat = _REPEAT.match(regex)
        if repeat:
            atom = repeat.group(1)
            char = atom[1] if len(atom) == 2 else atom
            if len(atom) == 1 and char in _REGEX_META or len(atom) == 2 and char.isalnum():
                raise fail(f"{field}.pattern.Regex", f"{regex!r}: supported: a literal, or one "
                                                     "literal character with {n,} or +")
            count = int(repeat.group(3)) if repeat.group(3) else 1
            if count == 0:
                raise fail(f"{field}.pattern.Regex", f"{regex!r} matches the empty string; "
                                                     "supported: a repeat count of at least 1")
            return ("replace_run", char, count, content)
        raise fail(f"{field}.pattern.Regex", f"{regex!r} cannot be run exactly; supported: a "
                                             "literal, or one literal character with {n,} or +")
    raise fail(f"{field}.pattern", "expected {\"String\": ...} or {\"Regex\": ...}, non-empty")


# ---- pre-tokenizer -------------------------------------------------------------------
def _read_pre_tokenizer(node: Any, fail: _Fail, steps: tuple[tuple, ...]) -> HfPipeline:
    whitespace_split = False
    metaspace, field = node, "pre_tokenizer"
    if isinstance(node, dict) and node.get("type") == "Sequence":
        children = node.get("pretokenizers") or []
        types = [c.get("type") if isinstance(c, dict) else None for c in children]
        if types == ["WhitespaceSplit", "Metaspace"]:
            whitespace_split, metaspace, field = True, children[1], "pre_tokenizer.pretokenizers[1]"
        elif types == ["Metaspace"]:
            metaspace, field = children[0], "pre_tokenizer.pretokenizers[0]"
        else:
            raise fail("pre_tokenizer.pretokenizers", f"{types}: supported: {_SUPPORTED_PRE_TOKENIZERS}")
    if not isinstance(metaspace, dict) or metaspace.get("type") != "Metaspace":
        kind = metaspace.get("type") if isinstance(metaspace, dict) else metaspace
        raise fail(f"{field}.type" if isinstance(metaspace, dict) else field,
                   f"{kind!r} is not supported; supported: {_SUPPORTED_PRE_TOKENIZERS}")
    replacement = metaspace.get("replacement", "\u2581")
    if not isinstance(replacement, str) or len(replacement) != 1:
        raise fail(f"{field}.replacement", f"{replacement!r}: supported: one character")
    scheme = _prepend_scheme(metaspace, field, fail)
    split = metaspace.get("split", True)
    replace_rules = tuple((s[1] if s[0] == "replace_literal" else f"{re.escape(s[1])}{{{s[2]},}}", s[-1])
                          for s in steps if s[0].startswith("replace"))
    strips = [s for s in steps if s[0] == "strip"]
    return HfPipeline(
        replace_rules=replace_rules, strip_left=any(s[1] for s in strips),
        strip_right=any(s[2] for s in strips), has_precompiled=("precompiled",) in steps,
        metaspace_replacement=replacement, prepend_scheme=scheme, split=bool(split),  # type: ignore[arg-type]  # checked
        whitespace_split=whitespace_split, normalizer_steps=steps)


def _prepend_scheme(node: dict, field: str, fail: _Fail) -> str:
    """tokenizers 0.23.3: prepend_scheme defaults to "always"; the legacy add_prefix_space
    false must come with "never" (tokenizers refuses the file otherwise). A lone
    ``add_prefix_space: false`` (older files) is read as "never", as older tokenizers did."""
    scheme = node.get("prepend_scheme")
    legacy = node.get("add_prefix_space")
    if scheme is None:
        scheme = "never" if legacy is False else "always"
    if scheme not in ("always", "first", "never"):
        raise fail(f"{field}.prepend_scheme", f"{scheme!r}: supported: always, first, never")
    if legacy is False and scheme != "never":
        raise fail(f"{field}.add_prefix_space", f"false contradicts prepend_scheme {scheme!r}; "
                                                "supported: false only with prepend_scheme never")
    return scheme


# ---- post-processor ------------------------------------------------------------------
Templates = tuple[tuple[TemplateItem, ...], tuple[TemplateItem, ...], tuple[int, ...], tuple[int, ...]]


def _read_post_processor(node: Any, specials: dict[str, int], vocab_size: int, fail: _Fail,
                         bos: int, eos: int) -> Templates:
    """(single, pair, single type ids, pair type ids): the templates and each item's segment id."""
    if node is None:  # XLM-R's defaults when it has <s> and </s>, else (as tokenizers) none
        if "<s>" in specials and "</s>" in specials:
            return _untyped(*xlmr_templates(bos, eos))
        return _untyped(("A",), ("A", "B"))
    kind = node.get("type") if isinstance(node, dict) else None
    if kind == "RobertaProcessing":
        cls_id, sep_id = _pair_id(node, "cls", vocab_size, fail), _pair_id(node, "sep", vocab_size, fail)
        return _untyped(*xlmr_templates(cls_id, sep_id))
    if kind == "BertProcessing":  # [CLS] A [SEP] / [CLS] A [SEP] B:1 [SEP]:1
        cls_id, sep_id = _pair_id(node, "cls", vocab_size, fail), _pair_id(node, "sep", vocab_size, fail)
        return ((cls_id, "A", sep_id), (cls_id, "A", sep_id, "B", sep_id), (0, 0, 0), (0, 0, 0, 1, 1))
    if kind != "TemplateProcessing":
        raise fail("post_processor.type", f"{kind!r} is not supported; supported: "
                                          "TemplateProcessing, RobertaProcessing, BertProcessing, none")
    tokens = node.get("special_tokens") or {}
    single, single_types = _template(node.get("single"), "post_processor.single", tokens, ("A",), fail)
    pair, pair_types = _template(node.get("pair"), "post_processor.pair", tokens, ("A", "B"), fail)
    return single, pair, single_types, pair_types


def _untyped(single: tuple[TemplateItem, ...], pair: tuple[TemplateItem, ...]) -> Templates:
    return single, pair, (0,) * len(single), (0,) * len(pair)


def _pair_id(node: dict, key: str, vocab_size: int, fail: _Fail) -> int:
    value = node.get(key)
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], int)
            and 0 <= value[1] < vocab_size):
        raise fail(f"post_processor.{key}", "expected [token, id] with an id in the vocabulary")
    return value[1]


def _template(items: Any, field: str, tokens: dict, slots: tuple[str, ...],
              fail: _Fail) -> tuple[tuple[TemplateItem, ...], tuple[int, ...]]:
    if not isinstance(items, list):
        raise fail(field, "expected a list of SpecialToken / Sequence items")
    out: list[TemplateItem] = []
    types: list[int] = []
    for i, item in enumerate(items):
        kind = next(iter(item), None) if isinstance(item, dict) and len(item) == 1 else None
        body = item[kind] if kind in ("Sequence", "SpecialToken") else None
        type_id = body.get("type_id", 0) if isinstance(body, dict) else None
        if not isinstance(type_id, int) or isinstance(type_id, bool) or type_id < 0:
            raise fail(f"{field}[{i}]", "expected a SpecialToken or Sequence item with a type_id >= 0")
        if kind == "Sequence":
            out.append(body.get("id"))  # type: ignore[union-attr]  # a dict: type_id checked
            types.append(type_id)
        else:
            name = body.get("id")  # type: ignore[union-attr]  # a dict: type_id checked
            ids = (tokens.get(name) or {}).get("ids")
            if not isinstance(ids, list) or not all(isinstance(x, int) for x in ids):
                raise fail(f"{field}[{i}]", f"special token {name!r} not in post_processor.special_tokens")
            out.extend(ids)
            types.extend([type_id] * len(ids))
    if tuple(x for x in out if isinstance(x, str)) != slots:
        raise fail(field, f"sequence slots {[x for x in out if isinstance(x, str)]}: supported: {list(slots)}")
    return tuple(out), tuple(types)


def _first_special(template: tuple[TemplateItem, ...], default: int) -> int:
    return template[0] if template and isinstance(template[0], int) else default


def _last_special(template: tuple[TemplateItem, ...], default: int) -> int:
    return template[-1] if template and isinstance(template[-1], int) else default
