from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_FLOAT32: _ClassVar[DType]
    DTYPE_FLOAT16: _ClassVar[DType]
    DTYPE_INT8: _ClassVar[DType]
    DTYPE_UINT8: _ClassVar[DType]
    DTYPE_INT32: _ClassVar[DType]

class Precision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRECISION_FLOAT32: _ClassVar[Precision]
    PRECISION_FLOAT16: _ClassVar[Precision]
    PRECISION_INT8: _ClassVar[Precision]
    PRECISION_UINT8: _ClassVar[Precision]
    PRECISION_BINARY: _ClassVar[Precision]
    PRECISION_UBINARY: _ClassVar[Precision]

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIORITY_INTERACTIVE: _ClassVar[Priority]
    PRIORITY_BATCH: _ClassVar[Priority]
DTYPE_FLOAT32: DType
DTYPE_FLOAT16: DType
DTYPE_INT8: DType
DTYPE_UINT8: DType
DTYPE_INT32: DType
PRECISION_FLOAT32: Precision
PRECISION_FLOAT16: Precision
PRECISION_INT8: Precision
PRECISION_UINT8: Precision
PRECISION_BINARY: Precision
PRECISION_UBINARY: Precision
PRIORITY_INTERACTIVE: Priority
PRIORITY_BATCH: Priority

class PackedTokens(_message.Message):
    __slots__ = ("token_ids", "lengths", "token_type_ids")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_TYPE_IDS_FIELD_NUMBER: _ClassVar[int]
    token_ids: bytes
    lengths: bytes
    token_type_ids: bytes
    def __init__(self, token_ids: _Optional[bytes] = ..., lengths: _Optional[bytes] = ..., token_type_ids: _Optional[bytes] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("data", "dtype", "shape")
    DATA_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, data: _Optional[bytes] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queue_us", "compute_us", "total_us", "wake_us")
    QUEUE_US_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_US_FIELD_NUMBER: _ClassVar[int]
    TOTAL_US_FIELD_NUMBER: _ClassVar[int]
    WAKE_US_FIELD_NUMBER: _ClassVar[int]
    queue_us: int
    compute_us: int
    total_us: int
    wake_us: int
    def __init__(self, queue_us: _Optional[int] = ..., compute_us: _Optional[int] = ..., total_us: _Optional[int] = ..., wake_us: _Optional[int] = ...) -> None: ...

class TraceContext(_message.Message):
    __slots__ = ("traceparent", "tracestate")
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    TRACESTATE_FIELD_NUMBER: _ClassVar[int]
    traceparent: str
    tracestate: str
    def __init__(self, traceparent: _Optional[str] = ..., tracestate: _Optional[str] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("tokens", "normalize", "dimensions", "dtype", "request_id", "precisions", "priority", "trace")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PRECISIONS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    tokens: PackedTokens
    normalize: bool
    dimensions: int
    dtype: DType
    request_id: str
    precisions: _containers.RepeatedScalarFieldContainer[Precision]
    priority: Priority
    trace: TraceContext
    def __init__(self, tokens: _Optional[_Union[PackedTokens, _Mapping]] = ..., normalize: _Optional[bool] = ..., dimensions: _Optional[int] = ..., dtype: _Optional[_Union[DType, str]] = ..., request_id: _Optional[str] = ..., precisions: _Optional[_Iterable[_Union[Precision, str]]] = ..., priority: _Optional[_Union[Priority, str]] = ..., trace: _Optional[_Union[TraceContext, _Mapping]] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("embeddings", "timings", "request_id", "quantized")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    QUANTIZED_FIELD_NUMBER: _ClassVar[int]
    embeddings: Tensor
    timings: Timings
    request_id: str
    quantized: _containers.RepeatedCompositeFieldContainer[Tensor]
    def __init__(self, embeddings: _Optional[_Union[Tensor, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., request_id: _Optional[str] = ..., quantized: _Optional[_Iterable[_Union[Tensor, _Mapping]]] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("pairs", "sigmoid", "request_id", "priority", "trace")
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    SIGMOID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    pairs: PackedTokens
    sigmoid: bool
    request_id: str
    priority: Priority
    trace: TraceContext
    def __init__(self, pairs: _Optional[_Union[PackedTokens, _Mapping]] = ..., sigmoid: _Optional[bool] = ..., request_id: _Optional[str] = ..., priority: _Optional[_Union[Priority, str]] = ..., trace: _Optional[_Union[TraceContext, _Mapping]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("scores", "timings", "request_id")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    scores: Tensor
    timings: Timings
    request_id: str
    def __init__(self, scores: _Optional[_Union[Tensor, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("model_id", "dimension", "max_positions", "max_batch_tokens", "max_batch_sequences", "tasks", "version", "device", "dtype", "max_queue_tokens", "calibration_id", "calibration_sample_size", "calibration_texts_id", "dtype_reason", "frame_port", "instance_id", "labels")
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    MAX_POSITIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_ID_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_SAMPLE_SIZE_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_TEXTS_ID_FIELD_NUMBER: _ClassVar[int]
    DTYPE_REASON_FIELD_NUMBER: _ClassVar[int]
    FRAME_PORT_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    model_id: str
    dimension: int
    max_positions: int
    max_batch_tokens: int
    max_batch_sequences: int
    tasks: _containers.RepeatedScalarFieldContainer[str]
    version: str
    device: str
    dtype: str
    max_queue_tokens: int
    calibration_id: str
    calibration_sample_size: int
    calibration_texts_id: str
    dtype_reason: str
    frame_port: int
    instance_id: str
    labels: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model_id: _Optional[str] = ..., dimension: _Optional[int] = ..., max_positions: _Optional[int] = ..., max_batch_tokens: _Optional[int] = ..., max_batch_sequences: _Optional[int] = ..., tasks: _Optional[_Iterable[str]] = ..., version: _Optional[str] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., max_queue_tokens: _Optional[int] = ..., calibration_id: _Optional[str] = ..., calibration_sample_size: _Optional[int] = ..., calibration_texts_id: _Optional[str] = ..., dtype_reason: _Optional[str] = ..., frame_port: _Optional[int] = ..., instance_id: _Optional[str] = ..., labels: _Optional[_Iterable[str]] = ...) -> None: ...

class RangesRequest(_message.Message):
    __slots__ = ("dimensions", "normalize")
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    dimensions: int
    normalize: bool
    def __init__(self, dimensions: _Optional[int] = ..., normalize: _Optional[bool] = ...) -> None: ...

class RangesResponse(_message.Message):
    __slots__ = ("ranges", "calibration_id", "sample_size")
    RANGES_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_SIZE_FIELD_NUMBER: _ClassVar[int]
    ranges: Tensor
    calibration_id: str
    sample_size: int
    def __init__(self, ranges: _Optional[_Union[Tensor, _Mapping]] = ..., calibration_id: _Optional[str] = ..., sample_size: _Optional[int] = ...) -> None: ...

class ClassifyRequest(_message.Message):
    __slots__ = ("tokens", "raw_scores", "request_id", "priority", "trace")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    RAW_SCORES_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    tokens: PackedTokens
    raw_scores: bool
    request_id: str
    priority: Priority
    trace: TraceContext
    def __init__(self, tokens: _Optional[_Union[PackedTokens, _Mapping]] = ..., raw_scores: _Optional[bool] = ..., request_id: _Optional[str] = ..., priority: _Optional[_Union[Priority, str]] = ..., trace: _Optional[_Union[TraceContext, _Mapping]] = ...) -> None: ...

class ClassifyResponse(_message.Message):
    __slots__ = ("scores", "timings", "request_id")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    scores: Tensor
    timings: Timings
    request_id: str
    def __init__(self, scores: _Optional[_Union[Tensor, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class EmbedSparseRequest(_message.Message):
    __slots__ = ("tokens", "top_k", "request_id", "priority", "trace")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    tokens: PackedTokens
    top_k: int
    request_id: str
    priority: Priority
    trace: TraceContext
    def __init__(self, tokens: _Optional[_Union[PackedTokens, _Mapping]] = ..., top_k: _Optional[int] = ..., request_id: _Optional[str] = ..., priority: _Optional[_Union[Priority, str]] = ..., trace: _Optional[_Union[TraceContext, _Mapping]] = ...) -> None: ...

class EmbedSparseResponse(_message.Message):
    __slots__ = ("counts", "indices", "values", "timings", "request_id")
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    counts: Tensor
    indices: Tensor
    values: Tensor
    timings: Timings
    request_id: str
    def __init__(self, counts: _Optional[_Union[Tensor, _Mapping]] = ..., indices: _Optional[_Union[Tensor, _Mapping]] = ..., values: _Optional[_Union[Tensor, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class EmbedTokensRequest(_message.Message):
    __slots__ = ("tokens", "query", "request_id", "priority", "trace")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    tokens: PackedTokens
    query: bool
    request_id: str
    priority: Priority
    trace: TraceContext
    def __init__(self, tokens: _Optional[_Union[PackedTokens, _Mapping]] = ..., query: _Optional[bool] = ..., request_id: _Optional[str] = ..., priority: _Optional[_Union[Priority, str]] = ..., trace: _Optional[_Union[TraceContext, _Mapping]] = ...) -> None: ...

class EmbedTokensResponse(_message.Message):
    __slots__ = ("counts", "vectors", "timings", "request_id")
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    counts: Tensor
    vectors: Tensor
    timings: Timings
    request_id: str
    def __init__(self, counts: _Optional[_Union[Tensor, _Mapping]] = ..., vectors: _Optional[_Union[Tensor, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...
