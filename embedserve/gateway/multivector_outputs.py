"""A multi-vector model's answer as the gateway holds it, and MaxSim over it.

Owns turning the replicas' flat token vectors (counts, vectors; dispatch.py joins chunks
by concatenation) back into one ``[L_i, dim]`` array per input; which marker prompt a
query or a document gets (MultiVectorEncoder's ``encode_query`` / ``encode_document``
choice); and MaxSim, sentence-transformers' ``maxsim``: for each query token the largest
dot product with any document token, summed over the query's tokens (``meanmaxsim``:
divided by their count). The vectors are already normalized where the model normalizes,
so that dot product is the cosine. Used by routes/multivector.py and routes/rerank.py.
"""

from __future__ import annotations

import numpy as np
from starlette.requests import Request

from embedserve.errors import InvalidInput
from embedserve.gateway.long_inputs import LongInputPolicy
from embedserve.gateway.pipeline import Gateway, timed
from embedserve.model import multivector
from embedserve.model.info import ModelInfo
from embedserve.ragged import RaggedBatch


def check_multivector_policy(policy: LongInputPolicy) -> None:
    if policy.mode == "chunk":
        raise InvalidInput("truncate='chunk' is not available for token vectors; send "
                           "truncate=true or shorter inputs", field="truncate")


def marker_prompt(model: ModelInfo, input_type: str, prompt_name: str | None) -> str:
    """The text put before each input: ``prompt_name``'s prompt when given, else the
    model's marker for ``input_type`` (model/multivector.py)."""
    marker = multivector.marker_prompt(model.prompts, input_type)   # checks input_type
    return model.prompt(prompt_name, "prompt_name") if prompt_name is not None else marker


def split_tokens(counts: np.ndarray, vectors: np.ndarray) -> list[np.ndarray]:
    """Flat token vectors -> each input's [L_i, dim]."""
    ends = np.cumsum(counts)
    return [vectors[a:b] for a, b in zip((ends - counts).tolist(), ends.tolist(), strict=True)]


async def token_vectors(gateway: Gateway, request: Request, texts: list[str], input_type: str | None,
                        prompt_name: str | None, policy: LongInputPolicy, field: str,
                        route: str) -> tuple[list[np.ndarray], RaggedBatch]:
    """Each text's token vectors and the packed tokens. A multi-vector model's are marked as
    ``input_type`` (None: a document); an embedding model's are its last hidden states, with
    the prompt its /embed would put first (``prompt_name``, else its default prompt)."""
    limit = None
    if gateway.task == "embed":
        if input_type is not None:
            raise InvalidInput(f"input_type applies to a multi-vector model; `{gateway.model_id}` is an "
                               "embedding model (send prompt_name for one of its prompts)", field="input_type")
        prompt = gateway.model.prompt(prompt_name, "prompt_name")
    else:
        input_type = input_type or "document"
        prompt = marker_prompt(gateway.model, input_type, prompt_name)
        spec = gateway.model.multivector
        if spec is not None:   # query_length / document_length / a fixed query expansion's length
            limit = spec.input_limit(input_type, gateway.model.max_positions)
    packed = await timed(request, "tokenize", gateway.preprocessor.encode_texts(
        texts, prompt, policy.mode == "truncate", policy.direction, field,
        check_length=policy.mode == "refuse", max_length=limit))
    counts, vectors = await gateway.embed_tokens(request, packed, input_type == "query", route)
    return split_tokens(counts, vectors), packed


def maxsim(query: np.ndarray, documents: list[np.ndarray], similarity: str = "maxsim") -> np.ndarray:
    """query [q, d], documents [L_j, d] each -> float32 [n]: sum over the query's tokens of
    the best dot product with any of the document's tokens (``meanmaxsim``: over q)."""
    q = query.astype(np.float64)
    scores = np.array([(q @ doc.astype(np.float64).T).max(axis=1).sum() if doc.shape[0] else 0.0
                       for doc in documents], dtype=np.float64)
    if similarity == "meanmaxsim" and q.shape[0]:
        scores /= q.shape[0]
    return scores.astype(np.float32)
