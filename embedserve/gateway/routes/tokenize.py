"""TEI ``POST /tokenize``: ids, pieces and character offsets per input.

Offsets index the input string as sent (after the prompt, when one is
applied, they index the prompted string). Special tokens come only from the
model's template (text that looks like ``<s>`` is plain text), so they are
the template's positions at each end; they cover no characters: their
``start``/``stop`` are null and ``text`` is the piece.
"""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from embedserve.gateway.pipeline import Gateway, timed
from embedserve.gateway.routes.embed import json_response
from embedserve.gateway.schemas import TokenInfo, TokenizeRequest

router = APIRouter()


@router.post("/tokenize", response_model=list[list[TokenInfo]], tags=["TEI"],
             summary="Tokenize inputs")
async def tokenize(body: TokenizeRequest, request: Request) -> Response:
    gateway, _ = request.app.state.router.route(body.model, None)
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    return json_response(await token_rows(gateway, request, texts, body.prompt_name,
                                          body.add_special_tokens))


async def token_rows(gateway: Gateway, request: Request, texts: list[str], prompt_name: str | None,
                     add_special_tokens: bool) -> list[list[dict]]:
    """Per text, its tokens as ``TokenInfo`` dicts (the gRPC API's Tokenize uses it too)."""
    gateway.check_count(len(texts), "inputs")
    prompt = gateway.model.prompt(prompt_name, "prompt_name")
    prompted = [prompt + t for t in texts]
    encoded = await timed(request, "tokenize", gateway.preprocessor.encode_texts(
        texts, prompt, truncate=False, direction="right", field="inputs", return_offsets=True,
        add_special_tokens=add_special_tokens, check_length=False))
    tokenizer = gateway.preprocessor.tokenizer
    head, tail = gateway.preprocessor.template_sizes if add_special_tokens else (0, 0)
    ids = encoded.token_ids.tolist()
    offsets = np.asarray(encoded.offsets).tolist()
    cu = np.asarray(encoded.cu_seqlens).tolist()
    out = []
    for b, text in enumerate(prompted):
        tokens = []
        for t in range(cu[b], cu[b + 1]):
            start, stop = offsets[t]
            piece = tokenizer.id_to_piece(ids[t])
            special = t - cu[b] < head or cu[b + 1] - t <= tail
            tokens.append({"id": ids[t], "text": piece if special else text[start:stop], "piece": piece,
                           "special": special, "start": None if special else start,
                           "stop": None if special else stop})
        out.append(tokens)
    return out
