"""What a loaded tokenizer is, independent of the file it came from.

The loaders produce a :class:`TokenizerSpec`: ``model_proto.load_sentencepiece_model``
(a SentencePiece ``.model``), ``hf_json.load_tokenizer_json`` (a Hugging Face
``tokenizer.json``; WordPiece ones through ``wordpiece_json``) and
``bert_vocab.load_bert_vocab_dir`` (a BERT ``vocab.txt`` directory). A WordPiece spec
carries ``wordpiece`` parameters and runs kernels/normalize_bert.py + wordpiece.py
instead of the stages below (its scores are unused). The :class:`~embedserve.tokenizer.tokenizer.Tokenizer` consumes it.
This module is plain data: no parsing, no Numba, no I/O.

The staged encode path and the seam between the two normalizers
-----------------------------------------------------------------
Each stage is a Numba function writing into caller-owned scratch:

1. normalize (one of, chosen by ``spec.compat``)::

       n_bytes, n_words = normalize_sp_into(src, charsmap_trie, charsmap_blob, params,
                                            out_bytes, out_origin, out_words)
       n_bytes, n_words = normalize_hf_into(src, charsmap_trie, charsmap_blob, params,
                                            out_bytes, out_origin, out_words, want_offsets)

   - ``src``: uint8[:] UTF-8 bytes of the input (lone surrogates already replaced by
     U+FFFD, so always valid UTF-8).
   - ``charsmap_trie``: uint32[:] Darts-clone units, ``charsmap_blob``: uint8[:] the
     NUL-separated normalized strings (both from ``charsmap.parse_charsmap``; empty
     arrays when the model has no charsmap). Lookups: ``charsmap.longest_match`` (SP)
     and ``charsmap.shortest_match`` (HF).
   - ``params``: int64[:] mode flags, built in Python once per tokenizer by
     ``normalize_sp.sp_params(spec, charsmap_units)`` /
     ``normalize_hf.hf_params(spec, charsmap_units)``; the layout is private to each
     normalizer module. Both functions must return a tuple of two Python/int64 ints.
     Wiring (kernels/encode.py, tokenizer.py): ``encode.encode_raw`` calls
     ``normalize_hf_into`` when ``spec.compat == "hf"``; ``Tokenizer.__init__`` calls
     ``hf_params``; ``Tokenizer.from_file(".json")`` calls ``hf_json.load_tokenizer_json``;
     ``from_file(".model", compat="hf")`` calls ``hf_json.spec_for_hf_compat(spec)``
     (the pipeline transformers' XLM-R converter builds for a .model; optional). Large constant tables a
     normalizer needs (grapheme break properties) live as module-level NumPy arrays in that module.
   - ``out_bytes``: uint8[:] normalized UTF-8, with U+2581 for whitespace where the
     mode requires (SP: escape_whitespaces; HF: Metaspace).
   - ``out_origin``: int32[:, 2]: for normalized byte i, the [start, end) byte range of
     ``src`` it came from (a byte inserted from nothing, like sentencepiece's dummy-prefix
     ``▁``, gets the empty range at the position where it was inserted; hf mode's
     prepended ``▁`` gets its word's first character, as tokenizers aligns it). Used only to report
     character offsets and by hf mode's "first" prepend scheme; otherwise it may be
     ``None``, and nothing is written (kernels/origins.py). Offsets follow each
     reference's alignments (docs/tokenizer.md, "Offsets"); ``want_offsets`` (hf mode)
     says they will be reported, and the part of that alignment ids never read runs
     only then.
   - ``out_words``: int32[:, 2]: [start, end) ranges of ``out_bytes`` that Viterbi runs
     on, in order. SP mode: one range (the whole string; 0 words for empty output).
     HF mode: one range per pre-tokenized word.
   - returns ``(SCRATCH_TOO_SMALL, 0)`` when any output buffer is too small; the caller
     grows the scratch and retries (callers start at 2 * len(src) + 16 bytes; a charsmap
     rule can expand a 3-byte character to 33 bytes, so no fixed factor is always enough).

2. Viterbi per word range (``viterbi.viterbi_into``) over the double-array trie
   (``trie.build_trie``), scores float32 when ``compat == "sentencepiece"`` and
   float64 when ``compat == "hf"``.
3. template (specials), truncation and packing (``tokenizer.py``).

Ids everywhere are OUTPUT ids (what the model's embedding table expects): the loader
reorders pieces so that ``pieces[i]`` is the piece of output id ``i``. Only pieces of
kind NORMAL and USER_DEFINED are matchable in text (CONTROL pieces such as ``<s>`` are
never produced from text: user input cannot inject control tokens). In sentencepiece
mode USER_DEFINED pieces are also matched by the normalizer, longest first, and copied
unnormalized (normalize_sp.py); BYTE pieces only come from byte fallback (encode.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

Compat = Literal["hf", "sentencepiece"]

# Every kernel stage's answer, in place of a count, when caller-owned scratch is too
# small; the caller grows it and retries (see the contract above).
SCRATCH_TOO_SMALL = -1


class PieceKind(enum.IntEnum):
    """SentencePiece's ``ModelProto.SentencePiece.Type`` values (same numbers)."""

    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


@dataclass(frozen=True)
class HfPipeline:
    """The parts of a tokenizer.json normalizer/pre-tokenizer that matter (filled by T2).

    ``replace_rules``: (pattern, content) pairs applied after Precompiled, in order;
    the pattern is the JSON's literal string or regex (``" {2,}"``); normalize_hf
    decides which it can do exactly (the loader rejects the rest).
    """

    replace_rules: tuple[tuple[str, str], ...] = ()
    strip_left: bool = False
    strip_right: bool = False
    has_precompiled: bool = True
    metaspace_replacement: str = "\u2581"
    prepend_scheme: Literal["always", "first", "never"] = "always"
    split: bool = True
    whitespace_split: bool = False
    # The normalizer as tokenizers runs it, flattened, in order (authoritative; the
    # fields above summarize it). Steps: ("precompiled",), ("strip", left, right),
    # ("replace_literal", pattern, content), ("replace_run", char, min_count, content)
    # (a regex ``c{n,}`` / ``c+``). Built by hf_json; run by normalize_hf.
    normalizer_steps: tuple[tuple, ...] = (("precompiled",),)


@dataclass(frozen=True)
class BertNormalization:
    """tokenizers' ``BertNormalizer`` switches (``strip_accents`` already resolved: the
    JSON's null means "as ``lowercase``")."""

    clean_text: bool = True
    handle_chinese_chars: bool = True
    strip_accents: bool = True
    lowercase: bool = True


@dataclass(frozen=True)
class WordPieceParams:
    """A WordPiece model behind BERT's normalizer and pre-tokenizer (kernels/wordpiece.py).

    ``normalizer`` None: the file has no normalizer (nothing is changed). The
    pre-tokenizer is always ``BertPreTokenizer`` (whitespace, then punctuation).
    """

    continuing_subword_prefix: str = "##"
    max_input_chars_per_word: int = 100
    normalizer: BertNormalization | None = BertNormalization()


# A template is a sequence of items: an int is an output id of a special token, the
# strings "A" / "B" stand for the first / second sequence's tokens.
TemplateItem = int | str


@dataclass(frozen=True)
class TokenizerSpec:
    """Everything the encoder needs, in output-id order."""

    source: str
    compat: Compat
    pieces: list[str]
    scores: np.ndarray  # float64 [V]; cast to float32 by the trie in sentencepiece mode
    kinds: np.ndarray  # uint8 [V] of PieceKind
    unk_id: int
    bos_id: int
    eos_id: int
    pad_id: int
    precompiled_charsmap: bytes = b""
    # SentencePiece NormalizerSpec flags (used by compat="sentencepiece").
    add_dummy_prefix: bool = True
    remove_extra_whitespaces: bool = True
    escape_whitespaces: bool = True
    # Hugging Face pipeline (used by compat="hf"); None for a .model file.
    hf: HfPipeline | None = None
    single_template: tuple[TemplateItem, ...] = ("A",)
    pair_template: tuple[TemplateItem, ...] = ("A", "B")
    mask_id: int | None = None
    # sentencepiece's byte_fallback: an unknown run becomes one BYTE piece (``<0xXX>``)
    # per UTF-8 byte of its normalized text (compat="sentencepiece" only).
    byte_fallback: bool = False
    # Score of an unknown character; None = min NORMAL score - 10 (in float32 for
    # sentencepiece, float64 for hf). Set it when a reference computes it differently.
    unk_score: float | None = None
    extra: dict[str, str] = field(default_factory=dict)
    # Segment (token type) id of each template item, in the same order; () = all zeros.
    single_type_ids: tuple[int, ...] = ()
    pair_type_ids: tuple[int, ...] = ()
    # Set for a WordPiece tokenizer (scores are then unused); None: Unigram.
    wordpiece: WordPieceParams | None = None

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)


def xlmr_templates(bos_id: int, eos_id: int) -> tuple[tuple[TemplateItem, ...], tuple[TemplateItem, ...]]:
    """XLM-R's ``<s> A </s>`` and ``<s> A </s></s> B </s>``."""
    return (bos_id, "A", eos_id), (bos_id, "A", eos_id, eos_id, "B", eos_id)
