"""Request and response bodies of the public HTTP API (pydantic).

Owns the shapes only: OpenAI's ``/v1/embeddings``, TEI's ``/embed``,
``/rerank`` and ``/tokenize``, and the Cohere/Jina-style ``/v1/rerank``.
Types are strict (a number is not a string) so that a wrong type is a 422
naming the field rather than a silent coercion. Limits that depend on the
model or the settings (counts, lengths, dimensions) are checked by the
routes, which know them.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

TokenIds = list[StrictInt]
EmbeddingInput = StrictStr | list[StrictStr] | TokenIds | list[TokenIds]
# Checked by the route (400 naming ``embedding_types[i]``), not by pydantic.
EMBEDDING_TYPES_HELP = (
    "Cohere-style: return the vectors in each of these types, as an object keyed by type: "
    "float, int8, uint8 (per-dimension buckets between the model's calibrated minimum and "
    "maximum, GET /v1/quantization/ranges), binary (int8), ubinary (uint8; 8 dimensions per "
    "byte, 1 where the value is > 0), float16 (embedserve extension). Bit-exact with "
    "sentence-transformers' quantize_embeddings given the same ranges.")
EmbeddingTypes = Annotated[list[StrictStr], Field(min_length=1, max_length=6,
                                                  examples=[["float", "int8", "ubinary"]])]


class _Request(BaseModel):
    # Unknown fields are ignored, as OpenAI and TEI clients send extras.
    model_config = ConfigDict(extra="ignore")


# What the embedding routes do with an input longer than the model's window
# (gateway/long_inputs.py). Strings are checked there, so that an unknown one
# is a 400 naming the field and listing the accepted values.
Truncate = StrictBool | StrictStr | None
Direction = Literal["left", "right", "Left", "Right"]
_TRUNCATE_DOC = (
    "Inputs longer than the model's window. Omitted: the server's --auto-truncate (default "
    "refuse). false or 'NONE'/'refuse': 413 input_too_long. true: cut to the window, special "
    "tokens kept, from truncation_direction's end. 'END'/'right', 'START'/'left': cut from that "
    "end (Cohere's values). 'chunk': embed every window of the model's length (chunk_overlap "
    "tokens shared) and pool them weighted by their tokens; usage counts every token embedded. "
    "Strings are case-insensitive (TEI and Jina send a boolean, Cohere a string).")
_DIRECTION_DOC = ("Which end truncate=true cuts (TEI's field). Omitted: the server's direction "
                  "when it truncates by default, else right.")
# Checked by the route (gateway/priority.py: 400 naming the field), case-insensitive.
_PRIORITY_DOC = ("embedserve extension: the traffic class, 'interactive' (default) or 'batch' "
                 "(docs/priority.md). Batch work yields to interactive work in the gateway and "
                 "the replicas. Also the x-embedserve-priority header; this field wins over it, "
                 "an operator's --batch-api-key or --route-priority over both.")
_OVERLAP_DOC = ("embedserve extension: content tokens consecutive windows share under "
                "truncate='chunk', in [0, window - 1]. Omitted: the server's --chunk-overlap.")


# -- OpenAI ------------------------------------------------------------------

class EmbeddingsRequest(_Request):
    input: EmbeddingInput = Field(description="A string, a list of strings, a list of token "
                                  "ids, or a list of lists of token ids (without special tokens).")
    model: StrictStr | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[StrictInt, Field(ge=1)] | None = None
    user: StrictStr | None = None
    input_type: Literal["query", "passage"] | None = Field(
        None, description="embedserve extension: apply the model's prompt of this name.")
    truncate: Truncate = Field(None, description=_TRUNCATE_DOC)
    truncation_direction: Direction | None = Field(None, description=_DIRECTION_DOC)
    chunk_overlap: StrictInt | None = Field(None, description=_OVERLAP_DOC)
    embedding_types: EmbeddingTypes | None = Field(
        None, description=EMBEDDING_TYPES_HELP + " Each data[i].embedding is then that object "
        "(with encoding_format=base64, each vector is the base64 of its little-endian bytes).")
    sparse: StrictBool = Field(
        False, description="embedserve extension, for a sparse (SPLADE) model: each "
        "data[i].embedding is {\"indices\": [vocabulary ids, ascending], \"values\": [weights]}, "
        "its nonzeros (docs/tasks.md).")
    top_k: Annotated[StrictInt, Field(ge=1)] | None = Field(
        None, description="embedserve extension, with sparse: keep each input's top_k largest "
        "weights; omitted: every nonzero.")
    priority: StrictStr | None = Field(None, description=_PRIORITY_DOC)


class EmbeddingObject(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str | dict[str, list[float] | list[int] | str]


class EmbeddingsUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingObject]
    model: str
    usage: EmbeddingsUsage


class ModelObject(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "embedserve"
    task: str | None = Field(None, description="embedserve extension: embed, score, classify or sparse")
    outputs: list[str] | None = Field(None, description="embedserve extension: what the model returns")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]


# -- TEI ---------------------------------------------------------------------

# TEI serves one model and has no ``model`` field; here it picks one of several.
_MODEL_FIELD = ("embedserve extension: the served model to use (GET /v1/models); needed only "
                "when several served models can do this")


class EmbedRequest(_Request):
    inputs: StrictStr | list[StrictStr] | TokenIds | list[TokenIds]
    model: StrictStr | None = Field(None, description=_MODEL_FIELD)
    normalize: StrictBool = True
    truncate: Truncate = Field(None, description=_TRUNCATE_DOC)
    truncation_direction: Direction | None = Field(None, description=_DIRECTION_DOC)
    chunk_overlap: StrictInt | None = Field(None, description=_OVERLAP_DOC)
    prompt_name: StrictStr | None = None
    dimensions: Annotated[StrictInt, Field(ge=1)] | None = None
    embedding_types: EmbeddingTypes | None = Field(
        None, description="embedserve extension. " + EMBEDDING_TYPES_HELP + " The answer is then "
        "Cohere's {\"embeddings\": {type: [[...], ...]}} instead of a bare list.")
    priority: StrictStr | None = Field(None, description=_PRIORITY_DOC)


class EmbeddingsByType(BaseModel):
    """Cohere's shape for embedding_types: one list of vectors per requested type."""

    embeddings: dict[str, list[list[float]]]
    response_type: Literal["embeddings_by_type"] = "embeddings_by_type"


class QuantizationRanges(BaseModel):
    calibration_id: str = Field(description="digest of the calibration sample's vectors")
    sample_size: int
    dimensions: int
    normalize: bool
    ranges: list[list[float]] = Field(description="[2][d]: per-dimension minimum, then maximum "
                                      "(float32 values), as quantize_embeddings(ranges=...) takes")


_INSTRUCTION_DOC = ("embedserve extension, for an LLM reranker (Qwen3-Reranker): the task "
                    "instruction in its prompt; omitted: the model card's default (docs/tasks.md).")


class RerankRequest(_Request):
    query: StrictStr
    model: StrictStr | None = Field(None, description=_MODEL_FIELD)
    texts: list[StrictStr]
    instruction: StrictStr | None = Field(None, description=_INSTRUCTION_DOC)
    raw_scores: StrictBool = False
    return_text: StrictBool = False
    truncate: StrictBool = False
    truncation_direction: Direction = "right"
    priority: StrictStr | None = Field(None, description=_PRIORITY_DOC)


class RankedText(BaseModel):
    index: int
    score: float
    text: str | None = None


class TokenizeRequest(_Request):
    inputs: StrictStr | list[StrictStr]
    model: StrictStr | None = Field(None, description=_MODEL_FIELD)
    add_special_tokens: StrictBool = True
    prompt_name: StrictStr | None = None


class TokenInfo(BaseModel):
    id: int
    text: str = Field(description="the input characters this token covers (its piece for specials)")
    piece: str
    special: bool
    start: int | None = Field(None, description="character offset into the (prompted) input")
    stop: int | None = None


# -- Cohere / Jina -----------------------------------------------------------

class DocumentText(_Request):
    text: StrictStr


class CohereRerankRequest(_Request):
    query: StrictStr
    documents: list[StrictStr | DocumentText]
    model: StrictStr | None = None
    top_n: Annotated[StrictInt, Field(ge=1)] | None = None
    instruction: StrictStr | None = Field(None, description=_INSTRUCTION_DOC)
    return_documents: StrictBool = False
    truncate: StrictBool = True
    priority: StrictStr | None = Field(None, description=_PRIORITY_DOC)


class CohereRerankResult(BaseModel):
    index: int
    relevance_score: float
    document: DocumentText | None = None


class CohereRerankUsage(BaseModel):
    total_tokens: int


class CohereRerankResponse(BaseModel):
    model: str
    results: list[CohereRerankResult]
    usage: CohereRerankUsage


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error shape, used by every non-2xx answer of the gateway."""

    error: ErrorDetail
