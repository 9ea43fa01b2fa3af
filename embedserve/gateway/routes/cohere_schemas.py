"""Bodies of Cohere's v2 API: ``POST /v2/embed`` and ``POST /v2/rerank`` (pydantic).

The request fields are the ``cohere`` SDK's (``ClientV2.embed`` / ``.rerank``,
7.x); the answers are what it parses (``EmbedByTypeResponse``,
``V2RerankResponse``). Fields whose values the route must check against the
model (``input_type``, ``embedding_types``, ``truncate``) are plain strings here
so that a wrong one is a 400 naming it and listing the accepted values.
Unknown fields are ignored; fields this server cannot honour (``images``,
mixed-content ``inputs``, span extraction) are refused by the routes.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

# Cohere's own ``priority`` is an integer (0 = handled first); embedserve's traffic classes
# are named by a string; an integer above 0 maps to the batch class (gateway/routes/cohere.py).
COHERE_PRIORITY_DOC = ("Cohere's integer priority (0, the default, is handled first): 0 leaves the class to the "
                       "x-embedserve-priority header (default interactive), a larger number runs the request in "
                       "the batch class. embedserve extension: a string names the traffic class, 'interactive' "
                       "or 'batch' (docs/priority.md).")


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class CohereEmbedRequest(_Body):
    texts: list[StrictStr] | None = None
    model: StrictStr | None = Field(None, description="a served model's name (GET /v1/models); "
                                    "omitted: the only served embedding model")
    input_type: StrictStr | None = Field(
        None, description="search_query, search_document, classification or clustering: the "
        "model's prompt of that name (search_query also 'query'; search_document also "
        "'document', 'passage' or 'corpus'), else the model's default prompt")
    embedding_types: Annotated[list[StrictStr], Field(min_length=1, max_length=7)] | None = Field(
        None, description="float (default), int8, uint8, binary, ubinary, base64 (float32 "
        "little-endian bytes), float16 (embedserve extension)")
    output_dimension: Annotated[StrictInt, Field(ge=1)] | None = None
    truncate: StrictStr | None = Field(None, description="NONE, START or END (default END)")
    max_tokens: StrictInt | None = Field(
        None, description="accepted when at least the model's window (inputs are cut to the "
        "window by truncate)")
    priority: StrictInt | StrictStr | None = Field(None, description=COHERE_PRIORITY_DOC)
    images: list[Any] | None = Field(None, description="refused: this server embeds text")
    inputs: list[Any] | None = Field(None, description="refused: send texts")


class ApiVersion(BaseModel):
    version: str = "2"


class BilledUnits(BaseModel):
    input_tokens: int | None = None
    search_units: int | None = None


class ApiMeta(BaseModel):
    api_version: ApiVersion
    billed_units: BilledUnits


class CohereEmbedResponse(BaseModel):
    id: str
    embeddings: dict[str, list[list[float]] | list[str]]
    texts: list[str]
    meta: ApiMeta
    response_type: str = "embeddings_by_type"


class RelevantSpans(_Body):
    mode: StrictStr | None = None


class CohereV2RerankRequest(_Body):
    query: StrictStr
    documents: list[StrictStr]
    model: StrictStr | None = Field(None, description="a served model's name (GET /v1/models); "
                                    "omitted: the only served reranker")
    top_n: Annotated[StrictInt, Field(ge=1)] | None = None
    max_tokens_per_doc: StrictInt | None = Field(
        None, description="accepted when at least the model's window (query and document are "
        "cut to the window together)")
    relevant_spans: RelevantSpans | None = Field(None, description="mode 'enabled' is refused")
    priority: StrictInt | StrictStr | None = Field(None, description=COHERE_PRIORITY_DOC)


class CohereV2RerankResult(BaseModel):
    index: int
    relevance_score: float


class CohereV2RerankResponse(BaseModel):
    id: str
    results: list[CohereV2RerankResult]
    meta: ApiMeta
