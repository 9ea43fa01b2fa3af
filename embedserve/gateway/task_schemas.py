"""Request bodies of the task routes (pydantic): classification, sparse and multi-vector embeddings.

Owns the shapes only: TEI's ``/predict``, ``/embed_sparse`` and ``/embed_all``, vLLM's
``/classify``. Kept apart from schemas.py (the embedding and reranking shapes);
strict types as there, unknown fields ignored as there.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from embedserve.gateway.schemas import (
    _DIRECTION_DOC,
    _MODEL_FIELD,
    _PRIORITY_DOC,
    _TRUNCATE_DOC,
    Direction,
    TokenIds,
    Truncate,
)

TOP_K_DOC = ("embedserve extension: keep each input's top_k largest weights (sentence-transformers' "
             "max_active_dims); omitted: every nonzero.")


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


# TEI: a string, a pair [a, b], or a batch of [a] and [a, b] items.
PredictInput = StrictStr | list[StrictStr] | list[list[StrictStr]]


class PredictRequest(_Request):
    inputs: PredictInput = Field(description="A string, a pair of strings [a, b], or a batch of "
                                 "single [a] and pair [a, b] items (TEI's shapes).")
    model: StrictStr | None = Field(None, description=_MODEL_FIELD)
    raw_scores: StrictBool = Field(False, description="The logits as they are, not probabilities.")
    truncate: StrictBool = False
    truncation_direction: Direction = "right"
    priority: StrictStr | None = Field(None, description=_PRIORITY_DOC)


class ClassifyRequest(_Request):
    input: StrictStr | list[StrictStr] = Field(description="A string or a list of strings.")
    model: StrictStr | None = None
    truncate_prompt_tokens: StrictInt | None = Field(
        None, description="vLLM's field: -1 or a positive count cuts inputs to the model's "
        "window (from the left, as vLLM keeps the last tokens); omitted: refuse over-long inputs.")
    user: StrictStr | None = None
    priority: StrictStr | None = Field(None, description=_PRIORITY_DOC)


class EmbedSparseRequest(_Request):
    inputs: StrictStr | list[StrictStr] | TokenIds | list[TokenIds]
    model: StrictStr | None = Field(None, description=_MODEL_FIELD)
    truncate: Truncate = Field(None, description=_TRUNCATE_DOC)
    truncation_direction: Direction | None = Field(None, description=_DIRECTION_DOC)
    prompt_name: StrictStr | None = None
    top_k: Annotated[StrictInt, Field(ge=1)] | None = Field(None, description=TOP_K_DOC)
    priority: StrictStr | None = Field(None, description=_PRIORITY_DOC)


class EmbedAllRequest(_Request):
    inputs: StrictStr | list[StrictStr]
    model: StrictStr | None = Field(None, description=_MODEL_FIELD)
    truncate: Truncate = Field(None, description=_TRUNCATE_DOC)
    truncation_direction: Direction | None = Field(None, description=_DIRECTION_DOC)
    prompt_name: StrictStr | None = None
    input_type: Literal["query", "document"] | None = Field(
        None, description="embedserve extension, for a multi-vector model: encode as queries (the model's "
        "query marker, no skiplist) or documents (the default: its document marker and skiplist), as "
        "MultiVectorEncoder's encode_query / encode_document do. Refused for an embedding model.")


class SparseValue(BaseModel):
    index: int
    value: float


class Prediction(BaseModel):
    score: float
    label: str


class ClassificationData(BaseModel):
    index: int
    label: str
    probs: list[float]
    num_classes: int


class ClassificationUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


class ClassificationResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ClassificationData]
    usage: ClassificationUsage
