"""Load a SentencePiece ``.model`` file (a ``ModelProto``) into a TokenizerSpec.

A small protobuf wire-format reader, so the ``sentencepiece`` package is not needed at
run time. Only what the Unigram encoder uses is read, USER_DEFINED pieces and byte
fallback included; everything we cannot reproduce exactly (BPE/WORD/CHAR models,
whitespace as suffix, a normalizer without a precompiled charsmap other than
``identity``) is rejected with a ModelLoadError naming the file, the field and what is
supported.

Field numbers are those of sentencepiece_model.proto:
ModelProto{1: pieces, 2: trainer_spec, 3: normalizer_spec}
SentencePiece{1: piece, 2: score (float), 3: type}
TrainerSpec{3: model_type, 24: treat_whitespace_as_suffix, 35: byte_fallback,
            40: unk_id, 41: bos_id, 42: eos_id, 43: pad_id}
NormalizerSpec{1: name, 2: precompiled_charsmap, 3: add_dummy_prefix,
               4: remove_extra_whitespaces, 5: escape_whitespaces}
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from embedserve.errors import ModelLoadError
from embedserve.tokenizer.kernel_cache import cached_njit
from embedserve.tokenizer.spec import PieceKind, TokenizerSpec, xlmr_templates

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
_UNIGRAM = 1
_MODEL_TYPES = {1: "UNIGRAM", 2: "BPE", 3: "WORD", 4: "CHAR"}
# Sentinels of the scanning kernels below.
_MALFORMED = -1  # _varint_at's value and position for a truncated or over-long varint
_ABSENT = -1  # a spec range or piece start that the file does not have
_SCAN_OK = 0  # _scan_model's error when the whole file parsed (else a byte offset >= 1)


class _WireError(ValueError):
    pass


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise _WireError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise _WireError("varint too long")


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """Yield (field_number, wire_type, value) for one message; value is int or bytes."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, pos = _varint(buf, pos)
        elif wire == _FIXED64:
            value, pos = int.from_bytes(buf[pos:pos + 8], "little"), pos + 8
        elif wire == _FIXED32:
            value, pos = int.from_bytes(buf[pos:pos + 4], "little"), pos + 4
        elif wire == _LEN:
            size, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + size], pos + size  # type: ignore[assignment]  # a field is an int or bytes
        else:
            raise _WireError(f"unsupported wire type {wire}")
        if pos > len(buf):
            raise _WireError("truncated field")
        yield number, wire, value


def _int32(value: int | bytes) -> int:
    assert isinstance(value, int)
    return value - (1 << 64) if value >= 1 << 63 else value


def _message(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise _WireError("expected a length-delimited field")
    return value


@cached_njit()
def _varint_at(data, pos):
    result = 0
    shift = 0
    while pos < data.shape[0] and shift < 64:
        byte = np.int64(data[pos])
        pos += 1
        result |= (byte & 0x7F) << shift  # type: ignore[assignment]  # numba: one int64 type
        if byte < 0x80:
            return result, pos
        shift += 7
    return _MALFORMED, _MALFORMED


@cached_njit()
def _scan_model(data):
    """One pass over a ModelProto: the pieces as arrays, and where the specs are.

    Returns (piece_start, piece_len, score_bits, kind, count, spec_ranges, error) with
    spec_ranges = [trainer start, end, normalizer start, end] (_ABSENT if absent, the
    last occurrence wins as in protobuf) and error = _SCAN_OK or the byte offset of a
    malformed field.
    (Pieces are 250k small messages: a Python loop over them takes a second.)
    """
    cap = data.shape[0] // 4 + 1
    piece_start = np.full(cap, _ABSENT, np.int64)
    piece_len = np.zeros(cap, np.int64)
    score_bits = np.zeros(cap, np.uint32)
    kind = np.ones(cap, np.int64)
    spec_ranges = np.full(4, _ABSENT, np.int64)
    count = 0
    pos = 0
    n = data.shape[0]
    while pos < n:
        key, pos = _varint_at(data, pos)
        if key < 0:
            return piece_start, piece_len, score_bits, kind, count, spec_ranges, max(pos, 1)
        number, wire = key >> 3, key & 7
        if wire != 2:  # top-level fields we read are all length-delimited; skip others
            if wire == 0:
                _, pos = _varint_at(data, pos)
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            else:
                return piece_start, piece_len, score_bits, kind, count, spec_ranges, max(pos, 1)
            if pos < 0 or pos > n:
                return piece_start, piece_len, score_bits, kind, count, spec_ranges, n
            continue
        size, pos = _varint_at(data, pos)
        if size < 0 or pos + size > n:
            return piece_start, piece_len, score_bits, kind, count, spec_ranges, max(pos, 1)
        end = pos + size
        if number == 1:
            if count == cap:
                return piece_start, piece_len, score_bits, kind, count, spec_ranges, pos
            p = pos
            while p < end:
                k, p = _varint_at(data, p)
                if k < 0:
                    return piece_start, piece_len, score_bits, kind, count, spec_ranges, max(p, 1)
                f, w = k >> 3, k & 7
                if w == 2:
                    length, p = _varint_at(data, p)
                    if length < 0 or p + length > end:
                        return piece_start, piece_len, score_bits, kind, count, spec_ranges, max(p, 1)
                    if f == 1:
                        piece_start[count] = p
                        piece_len[count] = length
                    p += length
                elif w == 5:
                    if p + 4 > end:
                        return piece_start, piece_len, score_bits, kind, count, spec_ranges, p
                    if f == 2:
                        score_bits[count] = (np.uint32(data[p]) | (np.uint32(data[p + 1]) << 8)
                                             | (np.uint32(data[p + 2]) << 16) | (np.uint32(data[p + 3]) << 24))
                    p += 4
                elif w == 0:
                    value, p = _varint_at(data, p)
                    if p < 0:
                        return piece_start, piece_len, score_bits, kind, count, spec_ranges, end
                    if f == 3:
                        kind[count] = value
                elif w == 1:
                    p += 8
                else:
                    return piece_start, piece_len, score_bits, kind, count, spec_ranges, max(p, 1)
            if p != end:
                return piece_start, piece_len, score_bits, kind, count, spec_ranges, max(p, 1)
            count += 1
        elif number == 2:
            spec_ranges[0], spec_ranges[1] = pos, end
        elif number == 3:
            spec_ranges[2], spec_ranges[3] = pos, end
        pos = end
    return piece_start, piece_len, score_bits, kind, count, spec_ranges, _SCAN_OK


def _decode_pieces(data: bytes, starts: np.ndarray, lengths: np.ndarray) -> list[str]:
    if (starts == _ABSENT).any():
        raise _WireError("a piece without a string")
    return [data[s:s + n].decode("utf-8") for s, n in zip(starts.tolist(), lengths.tolist())]


def _parse_submessage(buf: bytes, defaults: dict[int, int | bytes]) -> dict[int, int | bytes]:
    out = dict(defaults)
    for number, _, value in _fields(buf):
        out[number] = value
    return out


def load_sentencepiece_model(path: str | Path, fairseq_ids: bool = False) -> TokenizerSpec:
    """Parse a SentencePiece ModelProto file.

    ``fairseq_ids``: reorder ids as XLM-R/fairseq do (``<s>``=0, ``<pad>``=1, ``</s>``=2,
    ``<unk>``=3, normal pieces at SentencePiece id + 1, ``<mask>`` last); otherwise ids
    are SentencePiece's own.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read SentencePiece model: {exc}") from exc

    def fail(field: str, what: str) -> ModelLoadError:
        return ModelLoadError(f"{path}: field {field}: {what}")

    trainer: dict[int, int | bytes] = {3: _UNIGRAM, 24: 0, 35: 0, 40: 0, 41: 1, 42: 2, 43: -1}
    normalizer: dict[int, int | bytes] = {1: b"", 2: b"", 3: 1, 4: 1, 5: 1}
    buf = np.frombuffer(data, np.uint8)
    starts, lengths, score_bits, kind_array, count, ranges, error = _scan_model(buf)
    if error != _SCAN_OK:
        raise ModelLoadError(f"{path}: not a SentencePiece ModelProto (malformed field near byte {error})")
    try:
        pieces = _decode_pieces(data, starts[:count], lengths[:count])
        if ranges[0] != _ABSENT:
            trainer = _parse_submessage(data[ranges[0]:ranges[1]], trainer)
        if ranges[2] != _ABSENT:
            normalizer = _parse_submessage(data[ranges[2]:ranges[3]], normalizer)
    except (_WireError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path}: not a SentencePiece ModelProto ({exc})") from exc
    scores = score_bits[:count].view(np.float32).astype(np.float64)
    kinds = kind_array[:count].tolist()
    if not pieces:
        raise fail("pieces", "no pieces; is this a SentencePiece .model file?")
    model_type = int(trainer[3])
    if model_type != _UNIGRAM:
        name = _MODEL_TYPES.get(model_type, str(model_type))
        raise fail("trainer_spec.model_type", f"{name} is not supported; only UNIGRAM is")
    if trainer[24]:
        raise fail("trainer_spec.treat_whitespace_as_suffix", "only a whitespace prefix is supported")
    byte_fallback = bool(trainer[35])
    supported = [PieceKind.NORMAL, PieceKind.UNKNOWN, PieceKind.CONTROL, PieceKind.UNUSED,
                 PieceKind.USER_DEFINED] + ([PieceKind.BYTE] if byte_fallback else [])
    for i in np.flatnonzero(~np.isin(kind_array[:count], supported))[:1].tolist():
        kind = kinds[i]
        what = PieceKind(kind).name if kind in PieceKind._value2member_map_ else str(kind)
        raise fail(f"pieces[{i}].type", f"{what} pieces ({pieces[i]!r}) are not supported; supported: "
                   f"{', '.join(PieceKind(k).name for k in supported)} (BYTE only with byte_fallback)")
    name = _message(normalizer[1]).decode("utf-8", "replace")
    charsmap = _message(normalizer[2])
    if not charsmap and name not in ("", "identity"):
        raise fail("normalizer_spec", f"normalizer {name!r} without a precompiled_charsmap is "
                   "not supported; supported: a precompiled charsmap, or 'identity'")

    unk, bos, eos, pad = (_int32(trainer[n]) for n in (40, 41, 42, 43))
    if not 0 <= unk < len(pieces) or kinds[unk] != PieceKind.UNKNOWN:
        raise fail("trainer_spec.unk_id", f"{unk} is not an UNKNOWN piece")
    common = dict(
        source=str(path), compat="sentencepiece", precompiled_charsmap=charsmap,
        add_dummy_prefix=bool(normalizer[3]), remove_extra_whitespaces=bool(normalizer[4]),
        escape_whitespaces=bool(normalizer[5]), extra={"normalizer": name}, byte_fallback=byte_fallback,
    )
    if fairseq_ids:
        return _fairseq_spec(pieces, scores, kinds, unk, bos, eos, common)
    bos_id = bos if 0 <= bos < len(pieces) else -1
    eos_id = eos if 0 <= eos < len(pieces) else -1
    if bos_id >= 0 and eos_id >= 0:
        single, pair = xlmr_templates(bos_id, eos_id)
    else:
        single, pair = ("A",), ("A", "B")
    return TokenizerSpec(
        pieces=pieces, scores=scores, kinds=np.asarray(kinds, np.uint8),
        unk_id=unk, bos_id=bos_id, eos_id=eos_id, pad_id=pad if 0 <= pad < len(pieces) else -1,
        single_template=single, pair_template=pair, **common)  # type: ignore[arg-type]


def _fairseq_spec(pieces: list[str], scores: np.ndarray, kinds: list[int], unk: int, bos: int,
                  eos: int, common: dict) -> TokenizerSpec:
    """XLM-R id order: 4 fairseq specials first, normal pieces shifted by one, <mask> last."""
    if (unk, bos, eos) != (0, 1, 2):
        raise ModelLoadError(f"{common['source']}: field trainer_spec: fairseq id order needs "
                             f"unk/bos/eos = 0/1/2, got {unk}/{bos}/{eos}")
    n = len(pieces) + 2  # + <pad> and <mask>
    out_pieces = ["<s>", "<pad>", "</s>", "<unk>"] + pieces[3:] + ["<mask>"]
    out_scores = np.zeros(n, np.float64)
    out_scores[4:n - 1] = scores[3:]
    out_kinds = np.empty(n, np.uint8)
    out_kinds[:4] = [PieceKind.CONTROL, PieceKind.CONTROL, PieceKind.CONTROL, PieceKind.UNKNOWN]
    out_kinds[4:n - 1] = kinds[3:]
    out_kinds[n - 1] = PieceKind.CONTROL
    single, pair = xlmr_templates(0, 2)
    return TokenizerSpec(
        pieces=out_pieces, scores=out_scores, kinds=out_kinds, unk_id=3, bos_id=0, eos_id=2,
        pad_id=1, mask_id=n - 1, single_template=single, pair_template=pair, **common)
