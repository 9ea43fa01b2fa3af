"""The codec for the gateway <-> scheduler wire (protos/embedserve/v1/inference.proto).

Owns turning a ``RaggedBatch`` into the proto's packed ``bytes`` fields and
back, float arrays into ``Tensor`` and back, and a ``ModelInfo`` into the
``Info`` reply and back. Checks that what arrives is self-consistent with
``embedserve.validate``'s layout rules (so a malformed message raises
``InvalidInput`` naming the field, on either side, in the words every tier
uses); whether ids fit a vocabulary or sequences fit the position table is
the scheduler's check against its model.

Everything is little-endian on the wire (``<i4``, ``<f4``, ``<f2``); reading
uses ``np.frombuffer``, so an unpacked array is a read-only view of the
message's bytes (no copy, no per-element Python objects). ``PackedTokens``
carries per-sequence ``lengths``; ``cu_seqlens`` is rebuilt from them.

``tensor_to_array`` returns float32, float16, int8, uint8 or int32 exactly as sent
(quantized vectors travel packed as int8/uint8, ``Precision`` names which). A call
carrying more than ``InfoResponse.max_queue_tokens`` tokens can never fit the
replica's queue and gets INVALID_ARGUMENT ("split it"); RESOURCE_EXHAUSTED
means "full now, retry".
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from embedserve import validate
from embedserve.errors import InvalidInput
from embedserve.model.info import ModelInfo
from embedserve.protos import inference_pb2
from embedserve.ragged import RaggedBatch

_INT32 = np.dtype("<i4")
_WIRE_DTYPES: dict[int, np.dtype] = {
    inference_pb2.DTYPE_FLOAT32: np.dtype("<f4"),
    inference_pb2.DTYPE_FLOAT16: np.dtype("<f2"),
    inference_pb2.DTYPE_INT8: np.dtype("i1"),
    inference_pb2.DTYPE_UINT8: np.dtype("u1"),
    inference_pb2.DTYPE_INT32: np.dtype("<i4"),
}
_DTYPE_NAMES = {"float32": inference_pb2.DTYPE_FLOAT32, "float16": inference_pb2.DTYPE_FLOAT16,
                "int8": inference_pb2.DTYPE_INT8, "uint8": inference_pb2.DTYPE_UINT8,
                "int32": inference_pb2.DTYPE_INT32}
# embedserve.model.quantize's precision names <-> the proto's Precision values.
_PRECISIONS: dict[str, int] = {
    "float32": inference_pb2.PRECISION_FLOAT32, "float16": inference_pb2.PRECISION_FLOAT16,
    "int8": inference_pb2.PRECISION_INT8, "uint8": inference_pb2.PRECISION_UINT8,
    "binary": inference_pb2.PRECISION_BINARY, "ubinary": inference_pb2.PRECISION_UBINARY,
}
_PRECISION_NAMES = {value: name for name, value in _PRECISIONS.items()}
# The traffic classes (docs/priority.md), the default first, <-> the proto's Priority.
INTERACTIVE = "interactive"
BATCH = "batch"
PRIORITIES = (INTERACTIVE, BATCH)
_PRIORITIES: dict[str, int] = {INTERACTIVE: inference_pb2.PRIORITY_INTERACTIVE,
                               BATCH: inference_pb2.PRIORITY_BATCH}
_PRIORITY_NAMES = {value: name for name, value in _PRIORITIES.items()}


def pack_tokens(tokens: RaggedBatch, field: str = "tokens") -> inference_pb2.PackedTokens:
    """RaggedBatch -> PackedTokens. Checks the same layout ``unpack_tokens`` does."""
    validate.check_ragged(tokens, field)
    return inference_pb2.PackedTokens(
        token_ids=tokens.token_ids.astype(_INT32, copy=False).tobytes(),
        lengths=tokens.lengths.astype(_INT32, copy=False).tobytes(),
        token_type_ids=b"" if tokens.token_type_ids is None
        else tokens.token_type_ids.astype(_INT32, copy=False).tobytes(),
    )


def unpack_tokens(packed: inference_pb2.PackedTokens, field: str = "tokens") -> RaggedBatch:
    """PackedTokens -> a RaggedBatch of zero-copy id views, or InvalidInput naming ``field``."""
    token_ids = _int32_view(packed.token_ids, f"{field}.token_ids")
    lengths = _int32_view(packed.lengths, f"{field}.lengths")
    type_ids = (_int32_view(packed.token_type_ids, f"{field}.token_type_ids")
                if packed.token_type_ids else None)
    # Summed in int64, so lengths adding up past 2**31 are reported as their sum,
    # not as what it wraps to in int32.
    validate.check_sequence_lengths(lengths, token_ids.shape[0], field)
    # The rest of check_ragged: the views are int32 and one-dimensional by construction,
    # and the running sums fit int32 (they end at the id count, just checked).
    validate.check_token_types(type_ids, token_ids.shape[0], field)
    cu_seqlens = np.zeros(lengths.shape[0] + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu_seqlens[1:])
    return RaggedBatch(token_ids, cu_seqlens, type_ids)


def model_info_to_proto(info: ModelInfo, *, max_batch_tokens: int, max_batch_sequences: int,
                        max_queue_tokens: int, version: str) -> inference_pb2.InfoResponse:
    """What a replica reports: its model, plus the batching limits it runs under."""
    return inference_pb2.InfoResponse(
        model_id=info.model_id, dimension=info.dimension, max_positions=info.max_positions,
        max_batch_tokens=max_batch_tokens, max_batch_sequences=max_batch_sequences,
        tasks=[info.task], version=version, device=info.device or "", dtype=info.dtype or "",
        dtype_reason=info.dtype_reason or "",
        max_queue_tokens=max_queue_tokens, calibration_id=info.calibration_id or "",
        calibration_sample_size=info.calibration_sample_size,
        calibration_texts_id=info.calibration_texts_id or "", labels=list(info.labels))


def model_info_from_proto(reply: inference_pb2.InfoResponse, described: ModelInfo) -> ModelInfo:
    """A replica's report over the gateway's own reading of the model directory.

    The reply carries only some of the facts; the replica's word wins on
    those it alone knows (where the weights live) and on the model id when
    it names one.
    """
    return replace(described, model_id=reply.model_id or described.model_id,
                   device=reply.device or None, dtype=reply.dtype or None,
                   dtype_reason=reply.dtype_reason or None,
                   calibration_id=reply.calibration_id or None,
                   calibration_sample_size=reply.calibration_sample_size,
                   calibration_texts_id=reply.calibration_texts_id or None)


def precisions_to_proto(names: list[str] | tuple[str, ...]) -> list[int]:
    """Precision names (``embedserve.model.quantize.PRECISIONS``) -> proto values."""
    unknown = [name for name in names if name not in _PRECISIONS]
    if unknown:
        raise InvalidInput(f"unknown precision {unknown[0]!r}; expected one of "
                           f"{', '.join(_PRECISIONS)}", field="precisions")
    return [_PRECISIONS[name] for name in names]


def precisions_from_proto(values) -> list[str]:
    """Proto Precision values -> names, or InvalidInput for a value this version lacks or a
    value named twice (so a request names at most one of each)."""
    names = []
    for value in values:
        if value not in _PRECISION_NAMES:
            raise InvalidInput(f"unknown precision {value}", field="precisions")
        if _PRECISION_NAMES[value] in names:
            # Each is computed and sent once more: a repeated one only amplifies the reply.
            raise InvalidInput(f"precision {_PRECISION_NAMES[value]} is named twice",
                               field="precisions")
        names.append(_PRECISION_NAMES[value])
    return names


def priority_to_proto(name: str) -> int:
    """A class name (``PRIORITIES``) -> the proto's ``Priority`` value."""
    return _PRIORITIES[name]


def priority_from_proto(value: int, field: str = "priority") -> str:
    """The proto's ``Priority`` value -> its class name, or InvalidInput for an unknown one
    (a newer gateway's class this replica does not know: refused, never guessed)."""
    name = _PRIORITY_NAMES.get(value)
    if name is None:
        raise InvalidInput(f"{field} {value} is not a known Priority "
                           f"(known: {', '.join(PRIORITIES)})", field=field)
    return name


def model_mismatch(reply: inference_pb2.InfoResponse, described: ModelInfo) -> str:
    """Why a replica's report says it serves another model than ``described`` ("": it does not).

    Compares what both sides know (task, width, length limit); two models
    alike in all three pass, so this catches mis-wiring, not every swap.
    """
    if reply.tasks and described.task not in reply.tasks:
        return f"it serves {'/'.join(reply.tasks)}, not {described.task} ({described.model_id})"
    if reply.dimension != described.dimension:
        return (f"its model is {reply.dimension} wide, {described.model_id} is "
                f"{described.dimension}")
    if reply.max_positions and reply.max_positions != described.max_positions:
        return (f"its model takes {reply.max_positions} positions, {described.model_id} takes "
                f"{described.max_positions}")
    return ""


def array_to_tensor(array: np.ndarray, dtype: int | str = "float32") -> inference_pb2.Tensor:
    """An array -> Tensor in the wire dtype (``DTYPE_*`` value or its name: float32,
    float16, int8, uint8)."""
    wire_dtype = _DTYPE_NAMES[dtype] if isinstance(dtype, str) else dtype
    if wire_dtype not in _WIRE_DTYPES:
        raise InvalidInput(f"unsupported tensor dtype {dtype!r}", field="dtype")
    data = np.ascontiguousarray(array, dtype=_WIRE_DTYPES[wire_dtype])
    return inference_pb2.Tensor(data=data.tobytes(), dtype=wire_dtype, shape=list(data.shape))  # type: ignore[arg-type]  # a DType value


def tensor_to_array(tensor: inference_pb2.Tensor, field: str = "tensor") -> np.ndarray:
    """Tensor -> a read-only array of its dtype and shape, or InvalidInput."""
    dtype = _WIRE_DTYPES.get(tensor.dtype)
    if dtype is None:
        raise InvalidInput(f"{field}.dtype {tensor.dtype} is not a known DType", field=field)
    shape = tuple(int(n) for n in tensor.shape)
    expected = math.prod(shape) * dtype.itemsize
    if len(tensor.data) != expected:
        raise InvalidInput(f"{field}.data has {len(tensor.data)} bytes; shape {list(shape)} of "
                           f"{dtype.name} needs {expected}", field=field)
    return np.frombuffer(tensor.data, dtype=dtype).reshape(shape)


def _int32_view(data: bytes, field: str) -> np.ndarray:
    if len(data) % 4:
        raise InvalidInput(f"{field} has {len(data)} bytes, not a whole number of int32",
                           field=field)
    return np.frombuffer(data, dtype=_INT32)
