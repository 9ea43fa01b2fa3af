"""``embedserve embed --url``: the same job through a running gateway.

Owns the HTTP side of a bulk job: requests sized to the gateway's limits
(read from ``/info``), as many in flight as its replicas can take, and
retries of 429 and 503 after the server's ``Retry-After`` (else exponential
backoff). Every request runs in the batch priority class (the
``x-embedserve-priority`` header, docs/priority.md), so online queries to the same
gateway go first. The vectors come back as base64 float32 from ``/v1/embeddings``.
Token counts, truncation flags, the refuse decision and the windows of
``chunk`` come from the local tokenizer of ``--model``, or without one from
the gateway's own ``/tokenize`` (``gateway_tokenizer.py``); the gateway
cuts and pools the same windows itself (asked with
``"truncate": "chunk"``). Every answer's ``usage`` is checked against the
local counts, so a gateway serving another model is an error, not silently
different numbers.
"""

from __future__ import annotations

import asyncio
import base64
import random
from pathlib import Path
from typing import Any

import numpy as np

from embedserve.bulk.gateway_tokenizer import GatewayTokenizer
from embedserve.errors import InvalidInput, Unavailable
from embedserve.gateway.priority import HEADER as PRIORITY_HEADER
from embedserve.link.wire import BATCH
from embedserve.local.embedded import EmbeddedPart
from embedserve.local.encoding import EncodedTexts, WindowTokenizer, check_overlap, encode_texts
from embedserve.local.options import EmbedOptions
from embedserve.local.precision import RANGED_PRECISIONS, check_precision, convert
from embedserve.model.info import ModelInfo, read_model_info
from embedserve.tokenizer import load_tokenizer

REQUEST_MAX_INPUTS = 256        # inputs per request (capped by the gateway's max_client_batch_size)
REQUEST_MAX_TOKENS = 16_384     # tokens per request: several chunks for the gateway to spread
REQUESTS_PER_REPLICA = 2        # in flight per healthy replica: one computing, one queued
MAX_ATTEMPTS = 30
BACKOFF_MAX_S = 30.0
RETRY_STATUSES = (429, 502, 503, 504)


class RemoteEmbedder:
    """prepare (tokenize locally) / compute (POST the texts) for ``run.run_job``."""

    def __init__(self, url: str, model_dir: Path | None, options: EmbedOptions, api_key: str | None = None,
                 timeout_s: float = 300.0, served_model: str | None = None) -> None:
        """``model_dir``: the served model's directory, whose tokenizer counts tokens here;
        None: the gateway's ``/tokenize`` counts them (no model on this machine)."""
        self.url = url.rstrip("/")
        self.options = options
        self._headers = {PRIORITY_HEADER: BATCH}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._timeout = timeout_s
        self.served_model = served_model
        server = self._served_info()
        self.model_id = str(server["model_id"])
        if model_dir is None:
            # What the job needs of the model, as the gateway describes it.
            self.info = ModelInfo(model_id=self.model_id, architecture=str(server.get("architecture")),
                                  vocab_size=0, pooling=str(server.get("pooling")),
                                  task="embed", dimension=int(server["dimension"]),
                                  max_positions=int(server["max_input_length"]),
                                  normalize=bool(server["normalize"]),
                                  prompts=dict(server.get("prompts") or {}),
                                  default_prompt_name=server.get("default_prompt_name"))
        else:
            self.info = read_model_info(Path(model_dir))
        if server["dimension"] != self.info.dimension:
            raise InvalidInput(f"{self.url} serves {server['dimension']}-dimensional vectors; the local "
                               f"model {model_dir} makes {self.info.dimension}: pass the served model as --model")
        self.max_inputs = min(REQUEST_MAX_INPUTS, int(server["max_client_batch_size"]))
        self.max_tokens = min(REQUEST_MAX_TOKENS, int(server["max_inflight_tokens"]))
        self.limit = int(server["max_input_length"])
        healthy = sum(bool(r["healthy"]) for r in server["replicas"]) or 1
        self.concurrency = REQUESTS_PER_REPLICA * healthy
        self.dimension = options.dimensions or self.info.dimension
        check_precision(options.precision, self.dimension)
        self.prompt = self.info.prompt(options.input_type, "input_type")
        self.tokenizer: WindowTokenizer
        self._tokenize_client: Any
        if model_dir is None:
            import httpx

            self._tokenize_client = httpx.Client(base_url=self.url, headers=self._headers,
                                                 timeout=timeout_s)
            # The gateway adds the prompt itself (prompt_name), as /v1/embeddings does.
            self.tokenizer = GatewayTokenizer(self._tokenize_client, options.input_type,
                                              served_model)
            self.prompt = ""
        else:
            self._tokenize_client = None
            self.tokenizer = load_tokenizer(model_dir)
        if options.long_inputs == "chunk":
            check_overlap(self.tokenizer, self.limit, options.chunk_overlap)
        self.ranges = self._ranges() if options.precision in RANGED_PRECISIONS else None

    def _served_info(self) -> dict[str, Any]:
        """The gateway's /info for the model this job embeds with: ``served_model``, or the
        only model it serves. InvalidInput listing the served models when one must be picked."""
        import httpx

        params = {"model": self.served_model} if self.served_model else {}
        with httpx.Client(base_url=self.url, headers=self._headers, timeout=self._timeout) as client:
            reply = client.get("/info", params=params)
            if reply.status_code == 404 and self.served_model:
                raise InvalidInput(f"{self.url} serves no model named {self.served_model!r}; "
                                   f"pick one of {_served_models(client.get('/info').json())} "
                                   "with --served-model", field="served_model")
        if reply.status_code == 401:
            raise InvalidInput(f"{self.url} refused the API key ({reply.status_code}); pass the "
                               "gateway's key as --api-key or EMBEDSERVE_API_KEY", field="api_key")
        if reply.status_code != 200:
            raise Unavailable(f"{self.url}/info answered {reply.status_code}: {reply.text[:200]}")
        server = reply.json()
        if "models" in server:   # several models and none picked
            raise InvalidInput(f"{self.url} serves several models: {_served_models(server)}; pick "
                               "the embedding model with --served-model NAME", field="served_model")
        if server.get("model_type") != "embedding":
            raise InvalidInput(f"{self.url} serves {server.get('model_id')!r}, a "
                               f"{server.get('model_type')} model, not an embedding model; pick an "
                               "embedding model with --served-model NAME", field="served_model")
        return server

    def _ranges(self) -> np.ndarray:
        """int8/uint8: the gateway's calibration ranges, so local bucketing equals the server's."""
        import httpx

        params: dict[str, Any] = {} if self.options.dimensions is None else {"dimensions": self.options.dimensions}
        if self.served_model:
            params["model"] = self.served_model
        with httpx.Client(base_url=self.url, headers=self._headers, timeout=self._timeout) as client:
            reply = client.get("/v1/quantization/ranges", params=params)
        if reply.status_code != 200:
            raise InvalidInput(f"{self.url} has no calibration ranges for {self.options.precision} "
                               f"({reply.status_code}: {reply.text[:200]})", field="precision")
        return np.asarray(reply.json()["ranges"], dtype=np.float32)

    def close(self) -> None:
        if self._tokenize_client is not None:
            self._tokenize_client.close()

    def prepare(self, texts: list[str]) -> tuple[list[str], EncodedTexts]:
        return texts, encode_texts(self.tokenizer, texts, self.prompt, self.limit, self.options.long_inputs,
                                   self.options.chunk_overlap)

    def compute(self, prepared: tuple[list[str], EncodedTexts]) -> EmbeddedPart:
        texts, encoded = prepared
        tokens = encoded.tokens           # a chunked text counts all its windows, as the gateway's usage
        requests = self._requests(tokens)
        vectors = asyncio.run(self._send_all([[texts[int(encoded.rows[i])] for i in r] for r in requests],
                                             [int(tokens[r].sum()) for r in requests]))
        raw = np.concatenate(vectors) if vectors else np.zeros((0, self.dimension), np.float32)
        return EmbeddedPart(encoded.rows, convert(raw, self.options.precision, self.ranges),
                            tokens, encoded.encoded.truncated.astype(bool), encoded.chunked,
                            encoded.problems)

    def _requests(self, lengths: np.ndarray) -> list[np.ndarray]:
        """Consecutive runs of rows within the per-request input and token caps."""
        out, start, tokens = [], 0, 0
        for i, n in enumerate(lengths.tolist()):
            if i > start and (i - start == self.max_inputs or tokens + n > self.max_tokens):
                out.append(np.arange(start, i))
                start, tokens = i, 0
            tokens += n
        if start < len(lengths):
            out.append(np.arange(start, len(lengths)))
        return out

    async def _send_all(self, batches: list[list[str]], expected_tokens: list[int]) -> list[np.ndarray]:
        import httpx

        gate = asyncio.Semaphore(self.concurrency)
        async with httpx.AsyncClient(base_url=self.url, headers=self._headers, timeout=self._timeout) as client:
            async def one(texts: list[str], tokens: int) -> np.ndarray:
                async with gate:
                    return await self._post(client, texts, tokens)
            return list(await asyncio.gather(*(one(b, t) for b, t in zip(batches, expected_tokens))))

    async def _post(self, client: Any, texts: list[str], expected_tokens: int) -> np.ndarray:
        import httpx

        body: dict[str, Any] = {"input": texts, "encoding_format": "base64"}
        if self.served_model:
            body["model"] = self.served_model
        if self.options.long_inputs == "chunk":
            body["truncate"] = "chunk"
            body["chunk_overlap"] = self.options.chunk_overlap
        else:
            body["truncate"] = self.options.long_inputs == "truncate"
        if self.options.input_type is not None:
            body["input_type"] = self.options.input_type
        if self.options.dimensions is not None:
            body["dimensions"] = self.options.dimensions
        for attempt in range(MAX_ATTEMPTS):
            try:
                reply = await client.post("/v1/embeddings", json=body)
            except httpx.TransportError as exc:
                reason, wait = f"{type(exc).__name__}: {exc}", None
            else:
                if reply.status_code == 200:
                    return self._vectors(reply.json(), len(texts), expected_tokens)
                if reply.status_code not in RETRY_STATUSES:
                    raise InvalidInput(f"{self.url}/v1/embeddings answered {reply.status_code}: "
                                       f"{reply.text[:300]}")
                reason, wait = f"status {reply.status_code}", _retry_after(reply.headers.get("retry-after"))
            backoff = min(BACKOFF_MAX_S, 0.25 * 2 ** attempt) * (0.5 + random.random() / 2)
            await asyncio.sleep(wait if wait is not None else backoff)
        raise Unavailable(f"{self.url}: gave up after {MAX_ATTEMPTS} attempts ({reason})")

    def _vectors(self, payload: dict[str, Any], count: int, expected_tokens: int) -> np.ndarray:
        counted = payload["usage"]["total_tokens"]
        if counted != expected_tokens:
            raise InvalidInput(f"the gateway counted {counted} tokens where the tokenizer of --model "
                               f"counted {expected_tokens}: it serves another model; pass that one as --model")
        data = sorted(payload["data"], key=lambda d: d["index"])
        if len(data) != count:
            raise InvalidInput(f"the gateway answered {len(data)} vectors for {count} inputs")
        return np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in data])


def _served_models(info: dict[str, Any]) -> str:
    """``NAME (embedding), NAME (reranker)``: each model an /info answer lists, by its first name."""
    answers = info.get("models", [info])
    return ", ".join(f"{a['model_id']} ({a['model_type']})" for a in answers)


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
