"""Bodies of TEI's ``POST /`` and ``POST /similarity`` (pydantic).

``POST /`` takes what TEI's ``/`` takes for each kind of model, and what
``huggingface_hub.InferenceClient`` sends to a URL: ``feature_extraction`` puts
its options beside ``inputs`` (``normalize``, ``prompt_name``, ``truncate``,
``truncation_direction``, ``dimensions``, ``encoding_format``);
``sentence_similarity`` sends ``{"inputs": {"source_sentence", "sentences"},
"parameters": {}}``; ``text_classification`` sends ``{"inputs": text,
"parameters": {"function_to_apply", "top_k"}}``; TEI's ``/rerank`` body
(``query``, ``texts``) is what TEI's ``/`` takes for a reranker. Types are strict,
as in ``gateway/schemas.py``; unknown fields are ignored.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from embedserve.gateway.schemas import (
    _PRIORITY_DOC,
    Direction,
    EmbeddingsByType,
    EmbeddingTypes,
    RankedText,
    TokenIds,
    Truncate,
)

_MODEL = ("embedserve extension: the served model to use (GET /v1/models); needed only when "
          "several served models can answer this body")


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class SimilarityInput(_Body):
    source_sentence: StrictStr
    sentences: list[StrictStr]


class SimilarityParameters(_Body):
    truncate: Truncate = Field(default=None, description="as /embed's truncate")
    truncation_direction: Direction | None = None
    prompt_name: StrictStr | None = None


class RootParameters(SimilarityParameters):
    """``parameters``: sentence similarity's (above); text classification's are the
    classification hook's (``routes/tei.py``)."""

    function_to_apply: StrictStr | None = None
    top_k: StrictInt | None = None


class SimilarityRequest(_Body):
    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None
    model: StrictStr | None = Field(None, description=_MODEL)
    priority: StrictStr | None = Field(None, description=_PRIORITY_DOC)


class RootRequest(_Body):
    """Every body TEI's ``/`` accepts, told apart by its fields (``routes/tei.py``)."""

    inputs: StrictStr | list[StrictStr] | TokenIds | list[TokenIds] | SimilarityInput | None = Field(
        None, description="Text(s) or token ids to embed, or {source_sentence, sentences} for "
        "sentence similarity")
    parameters: RootParameters | None = None
    model: StrictStr | None = Field(None, description=_MODEL)
    priority: StrictStr | None = Field(None, description=_PRIORITY_DOC)
    # feature extraction (TEI's /embed fields, as InferenceClient sends them)
    normalize: StrictBool = True
    prompt_name: StrictStr | None = None
    truncate: Truncate = None
    truncation_direction: Direction | None = None
    dimensions: Annotated[StrictInt, Field(ge=1)] | None = None
    encoding_format: Literal["float", "base64"] | None = Field(
        None, description="float only: the answer is TEI's list of vectors")
    embedding_types: EmbeddingTypes | None = None
    # reranking (TEI's /rerank body)
    query: StrictStr | None = None
    texts: list[StrictStr] | None = None
    raw_scores: StrictBool = False
    return_text: StrictBool = False


# What POST / answers: vectors (or vectors by type), similarities, or ranks.
RootResponse = list[list[float]] | EmbeddingsByType | list[float] | list[RankedText]
