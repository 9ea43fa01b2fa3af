from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InputType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INPUT_TYPE_UNSPECIFIED: _ClassVar[InputType]
    INPUT_TYPE_QUERY: _ClassVar[InputType]
    INPUT_TYPE_DOCUMENT: _ClassVar[InputType]
INPUT_TYPE_UNSPECIFIED: InputType
INPUT_TYPE_QUERY: InputType
INPUT_TYPE_DOCUMENT: InputType

class EmbedTextsRequest(_message.Message):
    __slots__ = ("inputs", "model", "dimensions", "input_type", "embedding_types", "truncate", "chunk_overlap", "normalize")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    INPUT_TYPE_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_TYPES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_OVERLAP_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedScalarFieldContainer[str]
    model: str
    dimensions: int
    input_type: InputType
    embedding_types: _containers.RepeatedScalarFieldContainer[str]
    truncate: str
    chunk_overlap: int
    normalize: bool
    def __init__(self, inputs: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., dimensions: _Optional[int] = ..., input_type: _Optional[_Union[InputType, str]] = ..., embedding_types: _Optional[_Iterable[str]] = ..., truncate: _Optional[str] = ..., chunk_overlap: _Optional[int] = ..., normalize: _Optional[bool] = ...) -> None: ...

class Embedding(_message.Message):
    __slots__ = ("float", "int8", "uint8", "binary", "ubinary", "float16")
    FLOAT_FIELD_NUMBER: _ClassVar[int]
    INT8_FIELD_NUMBER: _ClassVar[int]
    UINT8_FIELD_NUMBER: _ClassVar[int]
    BINARY_FIELD_NUMBER: _ClassVar[int]
    UBINARY_FIELD_NUMBER: _ClassVar[int]
    FLOAT16_FIELD_NUMBER: _ClassVar[int]
    float: _containers.RepeatedScalarFieldContainer[float]
    int8: bytes
    uint8: bytes
    binary: bytes
    ubinary: bytes
    float16: bytes
    def __init__(self, float: _Optional[_Iterable[float]] = ..., int8: _Optional[bytes] = ..., uint8: _Optional[bytes] = ..., binary: _Optional[bytes] = ..., ubinary: _Optional[bytes] = ..., float16: _Optional[bytes] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "total_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    total_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ...) -> None: ...

class EmbedTextsResponse(_message.Message):
    __slots__ = ("embeddings", "model", "usage")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    embeddings: _containers.RepeatedCompositeFieldContainer[Embedding]
    model: str
    usage: Usage
    def __init__(self, embeddings: _Optional[_Iterable[_Union[Embedding, _Mapping]]] = ..., model: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ...) -> None: ...

class StreamError(_message.Message):
    __slots__ = ("code", "message", "field", "reason", "retry_after_s")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    field: str
    reason: str
    retry_after_s: float
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., field: _Optional[str] = ..., reason: _Optional[str] = ..., retry_after_s: _Optional[float] = ...) -> None: ...

class EmbedStreamResponse(_message.Message):
    __slots__ = ("index", "response", "error")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    index: int
    response: EmbedTextsResponse
    error: StreamError
    def __init__(self, index: _Optional[int] = ..., response: _Optional[_Union[EmbedTextsResponse, _Mapping]] = ..., error: _Optional[_Union[StreamError, _Mapping]] = ...) -> None: ...

class RerankRequest(_message.Message):
    __slots__ = ("query", "documents", "model", "top_n", "return_documents", "truncate", "raw_scores")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOP_N_FIELD_NUMBER: _ClassVar[int]
    RETURN_DOCUMENTS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    RAW_SCORES_FIELD_NUMBER: _ClassVar[int]
    query: str
    documents: _containers.RepeatedScalarFieldContainer[str]
    model: str
    top_n: int
    return_documents: bool
    truncate: bool
    raw_scores: bool
    def __init__(self, query: _Optional[str] = ..., documents: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., top_n: _Optional[int] = ..., return_documents: _Optional[bool] = ..., truncate: _Optional[bool] = ..., raw_scores: _Optional[bool] = ...) -> None: ...

class RankedDocument(_message.Message):
    __slots__ = ("index", "score", "document")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    index: int
    score: float
    document: str
    def __init__(self, index: _Optional[int] = ..., score: _Optional[float] = ..., document: _Optional[str] = ...) -> None: ...

class RerankResponse(_message.Message):
    __slots__ = ("results", "model", "usage")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[RankedDocument]
    model: str
    usage: Usage
    def __init__(self, results: _Optional[_Iterable[_Union[RankedDocument, _Mapping]]] = ..., model: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("inputs", "model", "add_special_tokens", "prompt_name")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_NAME_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedScalarFieldContainer[str]
    model: str
    add_special_tokens: bool
    prompt_name: str
    def __init__(self, inputs: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., add_special_tokens: _Optional[bool] = ..., prompt_name: _Optional[str] = ...) -> None: ...

class Token(_message.Message):
    __slots__ = ("id", "text", "piece", "special", "start", "stop")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    PIECE_FIELD_NUMBER: _ClassVar[int]
    SPECIAL_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    id: int
    text: str
    piece: str
    special: bool
    start: int
    stop: int
    def __init__(self, id: _Optional[int] = ..., text: _Optional[str] = ..., piece: _Optional[str] = ..., special: _Optional[bool] = ..., start: _Optional[int] = ..., stop: _Optional[int] = ...) -> None: ...

class TokenizedInput(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[Token]
    def __init__(self, tokens: _Optional[_Iterable[_Union[Token, _Mapping]]] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("inputs",)
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedCompositeFieldContainer[TokenizedInput]
    def __init__(self, inputs: _Optional[_Iterable[_Union[TokenizedInput, _Mapping]]] = ...) -> None: ...

class ServiceInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServedModelInfo(_message.Message):
    __slots__ = ("name", "aliases", "task", "dimension", "max_input_tokens", "normalize", "prompts")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ALIASES_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    aliases: _containers.RepeatedScalarFieldContainer[str]
    task: str
    dimension: int
    max_input_tokens: int
    normalize: bool
    prompts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., aliases: _Optional[_Iterable[str]] = ..., task: _Optional[str] = ..., dimension: _Optional[int] = ..., max_input_tokens: _Optional[int] = ..., normalize: _Optional[bool] = ..., prompts: _Optional[_Iterable[str]] = ...) -> None: ...

class ServiceInfoResponse(_message.Message):
    __slots__ = ("models", "version", "embedding_types", "max_inputs", "max_message_bytes")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_TYPES_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUTS_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ServedModelInfo]
    version: str
    embedding_types: _containers.RepeatedScalarFieldContainer[str]
    max_inputs: int
    max_message_bytes: int
    def __init__(self, models: _Optional[_Iterable[_Union[ServedModelInfo, _Mapping]]] = ..., version: _Optional[str] = ..., embedding_types: _Optional[_Iterable[str]] = ..., max_inputs: _Optional[int] = ..., max_message_bytes: _Optional[int] = ...) -> None: ...

class EmbedTokensTextRequest(_message.Message):
    __slots__ = ("inputs", "model", "input_type", "truncate")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INPUT_TYPE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedScalarFieldContainer[str]
    model: str
    input_type: InputType
    truncate: str
    def __init__(self, inputs: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., input_type: _Optional[_Union[InputType, str]] = ..., truncate: _Optional[str] = ...) -> None: ...

class TokenVectors(_message.Message):
    __slots__ = ("rows", "values")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    rows: int
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, rows: _Optional[int] = ..., values: _Optional[_Iterable[float]] = ...) -> None: ...

class EmbedTokensTextResponse(_message.Message):
    __slots__ = ("inputs", "dimension", "model", "usage")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedCompositeFieldContainer[TokenVectors]
    dimension: int
    model: str
    usage: Usage
    def __init__(self, inputs: _Optional[_Iterable[_Union[TokenVectors, _Mapping]]] = ..., dimension: _Optional[int] = ..., model: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ...) -> None: ...

class ClassifyTextsRequest(_message.Message):
    __slots__ = ("inputs", "text_pairs", "model", "raw_scores", "truncate")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    TEXT_PAIRS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RAW_SCORES_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedScalarFieldContainer[str]
    text_pairs: _containers.RepeatedScalarFieldContainer[str]
    model: str
    raw_scores: bool
    truncate: bool
    def __init__(self, inputs: _Optional[_Iterable[str]] = ..., text_pairs: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., raw_scores: _Optional[bool] = ..., truncate: _Optional[bool] = ...) -> None: ...

class LabelScore(_message.Message):
    __slots__ = ("label", "score")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    label: str
    score: float
    def __init__(self, label: _Optional[str] = ..., score: _Optional[float] = ...) -> None: ...

class Classification(_message.Message):
    __slots__ = ("scores",)
    SCORES_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedCompositeFieldContainer[LabelScore]
    def __init__(self, scores: _Optional[_Iterable[_Union[LabelScore, _Mapping]]] = ...) -> None: ...

class ClassifyTextsResponse(_message.Message):
    __slots__ = ("results", "model", "usage")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[Classification]
    model: str
    usage: Usage
    def __init__(self, results: _Optional[_Iterable[_Union[Classification, _Mapping]]] = ..., model: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ...) -> None: ...

class EmbedSparseTextsRequest(_message.Message):
    __slots__ = ("inputs", "model", "top_k", "truncate", "input_type")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    INPUT_TYPE_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedScalarFieldContainer[str]
    model: str
    top_k: int
    truncate: str
    input_type: InputType
    def __init__(self, inputs: _Optional[_Iterable[str]] = ..., model: _Optional[str] = ..., top_k: _Optional[int] = ..., truncate: _Optional[str] = ..., input_type: _Optional[_Union[InputType, str]] = ...) -> None: ...

class SparseEmbedding(_message.Message):
    __slots__ = ("indices", "values")
    INDICES_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    indices: _containers.RepeatedScalarFieldContainer[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, indices: _Optional[_Iterable[int]] = ..., values: _Optional[_Iterable[float]] = ...) -> None: ...

class EmbedSparseTextsResponse(_message.Message):
    __slots__ = ("embeddings", "model", "usage")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    embeddings: _containers.RepeatedCompositeFieldContainer[SparseEmbedding]
    model: str
    usage: Usage
    def __init__(self, embeddings: _Optional[_Iterable[_Union[SparseEmbedding, _Mapping]]] = ..., model: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ...) -> None: ...
