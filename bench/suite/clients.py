"""The clients every system is measured through: one HTTP client for all servers, and ST in-process.

Owns the request shapes (OpenAI ``POST {embeddings_path}`` with ``{"model",
"input": [...]}``; Cohere-style ``POST {rerank_path}`` with ``{"model",
"query", "documents"}``), turning answers into arrays in input order, and the
same calls on an in-process sentence-transformers model (what a user writes
without a server). Every answer is checked by ``checks`` before it counts.
Knows nothing about workloads or timing.

One ``httpx`` client per caller with keep-alive and TCP_NODELAY (otherwise
Nagle plus the server's delayed ACK adds ~40 ms to every request, whoever
the server is), no proxies from the environment.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Protocol

import httpx
import numpy as np

from bench.suite.checks import BadAnswer
from bench.suite.peer_process import HttpPeer

TIMEOUT_S = 300.0
_NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


class Client(Protocol):
    def embed(self, texts: Sequence[str]) -> np.ndarray: ...
    def rerank(self, query: str, documents: Sequence[str]) -> np.ndarray: ...
    def close(self) -> None: ...


def embeddings_body(peer: HttpPeer, texts: Sequence[str]) -> dict:
    """The request body; texts lose the prefix the server adds itself (see HttpPeer.input_prefix)."""
    prefix = peer.input_prefix
    if prefix:
        if not all(t.startswith(prefix) for t in texts):
            raise ValueError(f"{peer.name} adds {prefix!r} itself; every text must start with it")
        texts = [t[len(prefix):] for t in texts]
    return {"model": peer.model, "input": list(texts)}


def parse_embeddings(payload: object, count: int) -> np.ndarray:
    """OpenAI ``{"data": [{"index", "embedding"}]}`` -> float32 [count, dim] in input order."""
    try:
        data = payload["data"]  # type: ignore[index]
        rows = sorted(data, key=lambda item: item["index"])
        if [item["index"] for item in rows] != list(range(len(rows))):
            raise BadAnswer(f"indices {[item['index'] for item in data][:8]} are not 0..{len(rows) - 1}")
        if len(rows) != count:
            raise BadAnswer(f"{len(rows)} vectors for {count} inputs")
        return np.asarray([item["embedding"] for item in rows], dtype=np.float32)
    except (KeyError, TypeError, ValueError) as exc:
        raise BadAnswer(f"not an OpenAI embeddings answer: {exc!r}") from None


def parse_rerank(payload: object, count: int) -> np.ndarray:
    """Cohere ``{"results": [{"index", "relevance_score"}]}`` -> scores [count] in document order."""
    try:
        results = payload["results"]  # type: ignore[index]
        indices = sorted(item["index"] for item in results)
        if indices != list(range(count)):
            raise BadAnswer(f"result indices {indices[:8]} are not 0..{count - 1}")
        scores = np.empty(count, dtype=np.float64)
        for item in results:
            scores[item["index"]] = float(item["relevance_score"])
        return scores
    except (KeyError, TypeError, ValueError) as exc:
        raise BadAnswer(f"not a rerank answer: {exc!r}") from None


def _answer(response: httpx.Response) -> object:
    if response.status_code != 200:
        raise BadAnswer(f"HTTP {response.status_code}: {response.text[:200]}")
    try:
        return response.json()
    except ValueError:
        raise BadAnswer(f"not JSON: {response.text[:200]!r}") from None


class HttpClient:
    """Blocking client for one peer (used sequentially; one per thread or process)."""

    def __init__(self, peer: HttpPeer, timeout_s: float = TIMEOUT_S) -> None:
        self.peer = peer
        self._http = httpx.Client(base_url=peer.base_url, timeout=timeout_s, trust_env=False,
                                  transport=httpx.HTTPTransport(socket_options=_NODELAY))

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        response = self._http.post(self.peer.embeddings_path, json=embeddings_body(self.peer, texts))
        return parse_embeddings(_answer(response), len(texts))

    def rerank(self, query: str, documents: Sequence[str]) -> np.ndarray:
        if self.peer.rerank_path is None:
            raise BadAnswer(f"{self.peer.name} has no rerank endpoint")
        body = {"model": self.peer.rerank_model, "query": query, "documents": list(documents)}
        return parse_rerank(_answer(self._http.post(self.peer.rerank_path, json=body)), len(documents))

    def close(self) -> None:
        self._http.close()


class AsyncHttpClient:
    """The same requests from asyncio, for many concurrent callers in one process."""

    def __init__(self, peer: HttpPeer, connections: int, timeout_s: float = TIMEOUT_S) -> None:
        self.peer = peer
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        self._http = httpx.AsyncClient(
            base_url=peer.base_url, timeout=timeout_s, trust_env=False,
            transport=httpx.AsyncHTTPTransport(socket_options=_NODELAY, limits=limits))

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        response = await self._http.post(self.peer.embeddings_path, json=embeddings_body(self.peer, texts))
        return parse_embeddings(_answer(response), len(texts))

    async def aclose(self) -> None:
        await self._http.aclose()


class InProcessClient:
    """sentence-transformers in this process: ``encode`` and ``CrossEncoder.predict``, batch as given."""

    def __init__(self, embedder, cross_encoder=None) -> None:
        self._embedder = embedder
        self._cross = cross_encoder

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self._embedder.encode(list(texts), batch_size=max(1, len(texts)), convert_to_numpy=True,
                                     normalize_embeddings=True)

    def rerank(self, query: str, documents: Sequence[str]) -> np.ndarray:
        if self._cross is None:
            raise BadAnswer("no cross-encoder loaded")
        return np.asarray(self._cross.predict([(query, d) for d in documents],
                                              batch_size=max(1, len(documents))), dtype=np.float64)

    def close(self) -> None:
        pass
