"""The codec for the gateway <-> scheduler wire (protos/embedserve/v1/inference.proto).

Owns turning NumPy arrays into the proto's packed ``bytes`` fields and back,
and checking that what arrives is self-consistent (sizes, lengths, dtypes).
It knows nothing about models: whether ids fit a vocabulary or sequences fit
the position table is the scheduler's check. Both sides use this module, so a
malformed message raises ``InvalidInput`` naming the field on either side.

Everything is little-endian on the wire (``<i4``, ``<f4``, ``<f2``); reading
uses ``np.frombuffer``, so an unpacked array is a read-only view of the
message's bytes (no copy, no per-element Python objects).

Notes for the gateway (helper G), kept here because both sides build on it:
- The .proto's message and field names are the lead's, unchanged.
- ``pack_tokens(ids, lengths)`` accepts ``lengths`` or, via
  ``lengths_from_cu_seqlens``, an ``EncodedBatch``'s ``cu_seqlens``.
- ``tensor_to_array`` returns float32 or float16 exactly as sent; cast if you
  need float32 (``.astype(np.float32)``).
- Split chunks so one call carries at most ``InfoResponse.max_queue_tokens``
  tokens: a larger call can never fit the replica's queue and gets
  INVALID_ARGUMENT ("split it"); RESOURCE_EXHAUSTED means "full now, retry".
- ``embedserve scheduler --port 0 --metrics-port 0`` prints one line once it
  is SERVING: ``embedserve scheduler listening on HOST:PORT metrics HOST:PORT``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from embedserve.errors import InvalidInput
from embedserve.protos import inference_pb2

_INT32 = np.dtype("<i4")
_WIRE_DTYPES: dict[int, np.dtype] = {
    inference_pb2.DTYPE_FLOAT32: np.dtype("<f4"),
    inference_pb2.DTYPE_FLOAT16: np.dtype("<f2"),
}
_DTYPE_NAMES = {"float32": inference_pb2.DTYPE_FLOAT32, "float16": inference_pb2.DTYPE_FLOAT16}


@dataclass(frozen=True)
class Tokens:
    """A ragged batch as arrays: what ``PackedTokens`` carries."""

    token_ids: np.ndarray                 # int32 [T]
    lengths: np.ndarray                   # int32 [B], each >= 1, sum == T
    token_type_ids: np.ndarray | None     # int32 [T], or None for all zeros

    @property
    def num_sequences(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    def offsets(self) -> np.ndarray:
        """int64 [B+1]: where each sequence starts in ``token_ids`` (cu_seqlens)."""
        offsets = np.zeros(self.num_sequences + 1, dtype=np.int64)
        np.cumsum(self.lengths, out=offsets[1:])
        return offsets


def lengths_from_cu_seqlens(cu_seqlens: np.ndarray) -> np.ndarray:
    """int32 [B] lengths from cumulative lengths [B+1] that start at 0."""
    return np.diff(np.asarray(cu_seqlens)).astype(np.int32)


def pack_tokens(token_ids: np.ndarray, lengths: np.ndarray,
                token_type_ids: np.ndarray | None = None) -> inference_pb2.PackedTokens:
    """Arrays -> PackedTokens. Checks the same invariants ``unpack_tokens`` does."""
    tokens = Tokens(np.asarray(token_ids), np.asarray(lengths),
                    None if token_type_ids is None else np.asarray(token_type_ids))
    _check_tokens(tokens, field="tokens")
    return inference_pb2.PackedTokens(
        token_ids=tokens.token_ids.astype(_INT32, copy=False).tobytes(),
        lengths=tokens.lengths.astype(_INT32, copy=False).tobytes(),
        token_type_ids=b"" if tokens.token_type_ids is None
        else tokens.token_type_ids.astype(_INT32, copy=False).tobytes(),
    )


def unpack_tokens(packed: inference_pb2.PackedTokens, field: str = "tokens") -> Tokens:
    """PackedTokens -> arrays (zero-copy views), or InvalidInput naming ``field``."""
    token_ids = _int32_view(packed.token_ids, f"{field}.token_ids")
    lengths = _int32_view(packed.lengths, f"{field}.lengths")
    type_ids = (_int32_view(packed.token_type_ids, f"{field}.token_type_ids")
                if packed.token_type_ids else None)
    tokens = Tokens(token_ids, lengths, type_ids)
    _check_tokens(tokens, field)
    return tokens


def array_to_tensor(array: np.ndarray, dtype: int | str = "float32") -> inference_pb2.Tensor:
    """A float array -> Tensor in the wire dtype (``DTYPE_*`` value or its name)."""
    wire_dtype = _DTYPE_NAMES[dtype] if isinstance(dtype, str) else dtype
    if wire_dtype not in _WIRE_DTYPES:
        raise InvalidInput(f"unsupported tensor dtype {dtype!r}", field="dtype")
    data = np.ascontiguousarray(array, dtype=_WIRE_DTYPES[wire_dtype])
    return inference_pb2.Tensor(data=data.tobytes(), dtype=wire_dtype, shape=list(data.shape))


def tensor_to_array(tensor: inference_pb2.Tensor, field: str = "tensor") -> np.ndarray:
    """Tensor -> a read-only array of its dtype and shape, or InvalidInput."""
    dtype = _WIRE_DTYPES.get(tensor.dtype)
    if dtype is None:
        raise InvalidInput(f"{field}.dtype {tensor.dtype} is not a known DType", field=field)
    shape = tuple(int(n) for n in tensor.shape)
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(tensor.data) != expected:
        raise InvalidInput(f"{field}.data has {len(tensor.data)} bytes; shape {list(shape)} of "
                           f"{dtype.name} needs {expected}", field=field)
    return np.frombuffer(tensor.data, dtype=dtype).reshape(shape)


def _int32_view(data: bytes, field: str) -> np.ndarray:
    if len(data) % 4:
        raise InvalidInput(f"{field} has {len(data)} bytes, not a whole number of int32",
                           field=field)
    return np.frombuffer(data, dtype=_INT32)


def _check_tokens(tokens: Tokens, field: str) -> None:
    ids, lengths, type_ids = tokens.token_ids, tokens.lengths, tokens.token_type_ids
    if ids.ndim != 1 or lengths.ndim != 1:
        raise InvalidInput(f"{field}: token_ids and lengths must be one-dimensional", field=field)
    if lengths.shape[0] == 0:
        raise InvalidInput(f"{field}: no sequences", field=f"{field}.lengths")
    if int(lengths.min()) < 1:
        index = int(np.argmin(lengths))
        raise InvalidInput(f"{field}: sequence {index} is empty (every length must be >= 1)",
                           field=f"{field}.lengths")
    total = int(lengths.sum(dtype=np.int64))
    if total != ids.shape[0]:
        raise InvalidInput(f"{field}: lengths sum to {total} but token_ids holds {ids.shape[0]}",
                           field=f"{field}.lengths")
    if type_ids is not None and type_ids.shape != ids.shape:
        raise InvalidInput(f"{field}: token_type_ids holds {type_ids.shape[0]} entries, "
                           f"token_ids {ids.shape[0]}", field=f"{field}.token_type_ids")
