"""Token ids from a gateway's ``/tokenize``, for ``embedserve embed --url`` without ``--model``.

The bulk job decides per document how many tokens it has, whether it is too
long, where it is cut and into which windows (``local/encoding.py``); with a
model directory on the client its tokenizer answers, and without one the
gateway's: ``/tokenize`` returns each text's ids, specials included, exactly
as the gateway tokenizes it for ``/v1/embeddings`` (with the same prompt,
by ``prompt_name``). The specials' split into before and after the text is
learned once from one probe text, with and without them. Costs a second pass over the text (the
answer lists every token), and no model on the client. Implements the part
of ``TokenizerBackend`` that ``encode_texts`` uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from embedserve.errors import InvalidInput, Unavailable
from embedserve.tokenizer import EncodedBatch

TOKENIZE_BATCH = 256   # texts per /tokenize request: bodies of a few MB


class GatewayTokenizer:
    def __init__(self, client: Any, prompt_name: str | None, model: str | None) -> None:
        """``client``: an ``httpx.Client`` on the gateway (its key in the headers);
        ``prompt_name``: the embedding requests' ``input_type`` (None: the model's default);
        ``model``: the served name the requests carry (None: the only model)."""
        self._client = client
        self._prompt_name = prompt_name
        self._model = model
        bare = self._ids(["a"], add_special_tokens=False)[0]
        one = self._ids(["a"], add_special_tokens=True)[0]
        # ids("a") = prefix + bare + suffix (the prompt, if any, is in bare: it counts as
        # content, as it does when the gateway cuts windows).
        prefix_length = next((i for i in range(len(one)) if list(one[i:i + len(bare)]) == list(bare)),
                             None)
        if prefix_length is None:
            raise InvalidInput("cannot tell the gateway's special tokens apart from a text's")
        suffix_length = len(one) - prefix_length - len(bare)
        self._specials = (one[:prefix_length].astype(np.int32),
                          one[len(one) - suffix_length:].astype(np.int32))

    @property
    def single_specials(self) -> tuple[np.ndarray, np.ndarray]:
        return self._specials

    def _ids(self, texts: Sequence[str], add_special_tokens: bool) -> list[np.ndarray]:
        body: dict[str, Any] = {"inputs": list(texts), "add_special_tokens": add_special_tokens}
        if self._prompt_name is not None:
            body["prompt_name"] = self._prompt_name
        if self._model is not None:
            body["model"] = self._model
        reply = self._client.post("/tokenize", json=body)
        if reply.status_code != 200:
            raise Unavailable(f"/tokenize answered {reply.status_code}: {reply.text[:300]}")
        return [np.array([t["id"] for t in tokens], dtype=np.int32) for tokens in reply.json()]

    def encode_batch(self, texts: Sequence[str], max_length: int | None = None,
                     truncation: str | None = None, **_: Any) -> EncodedBatch:
        """Each text's ids as the gateway has them; cut to ``max_length`` (specials kept)
        from the ``truncation`` end when asked."""
        sequences: list[np.ndarray] = []
        for start in range(0, len(texts), TOKENIZE_BATCH):
            sequences += self._ids(texts[start:start + TOKENIZE_BATCH], add_special_tokens=True)
        original = np.array([len(s) for s in sequences], dtype=np.int32)
        truncated = np.zeros(len(sequences), dtype=bool)
        if max_length is not None and truncation is not None:
            prefix, suffix = (len(s) for s in self._specials)
            room = max_length - prefix - suffix
            for i, ids in enumerate(sequences):
                if len(ids) > max_length:
                    content = ids[prefix:len(ids) - suffix]
                    kept = content[:room] if truncation == "right" else content[-room:]
                    sequences[i] = np.concatenate([ids[:prefix], kept, ids[len(ids) - suffix:]])
                    truncated[i] = True
        cu = np.zeros(len(sequences) + 1, dtype=np.int32)
        np.cumsum([len(s) for s in sequences], out=cu[1:])
        ids = np.concatenate(sequences) if sequences else np.zeros(0, np.int32)
        return EncodedBatch(ids.astype(np.int32), cu, truncated=truncated, original_lengths=original)
