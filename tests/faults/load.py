"""Steady embedding traffic whose right answers are known, and its bookkeeping.

The answers come from sentence-transformers on the same model directory
(the reference, computed before any traffic). Every request carries one to
three of the probe texts in a random order, so a vector returned for the
wrong text or in the wrong position is caught, not only a failed request.

Each answer is sorted into one of four outcomes:

    correct     200, every vector matches its text (cosine >= MATCH_COSINE)
    retryable   429 or 503: the stack said "not now" in a way clients retry
    wrong       anything else: a 200 with a wrong vector, or any other status
    lost        no HTTP answer at all (connection reset, client timeout)
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

# The engine matches sentence-transformers at cosine >= 0.9999 on this model;
# probe texts are chosen so that any two differ far below this.
MATCH_COSINE = 0.999

PROBE_TEXTS = (
    "The lighthouse keeper counted forty ships before the storm reached the harbour.",
    "Photosynthesis turns sunlight, water and carbon dioxide into sugar and oxygen.",
    "Der Zug nach München hatte wegen eines Stellwerksausfalls zwei Stunden Verspätung.",
    "La receta pide tres huevos, harina de trigo y una pizca de sal marina.",
    "Quantum error correction spreads one logical qubit over many physical ones.",
    "東京の地下鉄は朝のラッシュアワーに非常に混雑します。",
    "Le marché aux puces du dimanche attire des collectionneurs de toute la région.",
    "A balanced binary search tree keeps lookups logarithmic in the number of keys.",
    "Москва — крупнейший город России по численности населения.",
    "The orchestra tuned to the oboe's A before the symphony began.",
    "Volcanic ash grounded flights across northern Europe for almost a week.",
    "Il gatto dormiva sul davanzale, ignorando completamente il traffico di sotto.",
    "Compound interest makes early savings grow much faster than late ones.",
    "인공지능 모델은 대량의 데이터로부터 패턴을 학습한다.",
    "Glaciers carve U-shaped valleys as they slowly grind down the mountains.",
    "The referee stopped the match after a floodlight failure in the second half.",
)


@dataclass(frozen=True)
class Expected:
    """Reference vectors (L2-normalized rows) for ``PROBE_TEXTS``."""

    texts: tuple[str, ...]
    vectors: np.ndarray  # float32 [len(texts), dim]

    def max_pairwise_cosine(self) -> float:
        sims = self.vectors @ self.vectors.T
        np.fill_diagonal(sims, -1.0)
        return float(sims.max())


def reference_vectors(model_dir: Path, texts: Sequence[str] = PROBE_TEXTS) -> Expected:
    """sentence-transformers' embeddings of ``texts`` with the model in ``model_dir``."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
    vectors = model.encode(list(texts), convert_to_numpy=True, normalize_embeddings=True)
    return Expected(tuple(texts), np.asarray(vectors, dtype=np.float32))


@dataclass
class Outcomes:
    """Counts and latencies of the requests sent during one phase."""

    sent: int = 0
    correct: int = 0
    retryable: int = 0
    wrong: int = 0
    lost: int = 0
    latencies_s: list[float] = field(default_factory=list)
    wrong_examples: list[str] = field(default_factory=list)

    @property
    def answered(self) -> int:
        return self.correct + self.retryable + self.wrong + self.lost

    def p99_ms(self) -> float:
        if not self.latencies_s:
            return float("nan")
        return float(np.percentile(np.asarray(self.latencies_s), 99) * 1e3)

    def max_ms(self) -> float:
        return max(self.latencies_s, default=float("nan")) * 1e3

    def record(self, outcome: str, latency_s: float, detail: str = "") -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)
        if outcome != "lost":
            self.latencies_s.append(latency_s)
        if outcome == "wrong" and len(self.wrong_examples) < 5:
            self.wrong_examples.append(detail)


def classify(response: httpx.Response, indices: Sequence[int], expected: Expected) -> tuple[str, str]:
    """(outcome, detail) of one answer to a request for ``indices`` of the probe texts."""
    if response.status_code in (429, 503):
        return "retryable", ""
    if response.status_code != 200:
        return "wrong", f"status {response.status_code}: {response.text[:200]}"
    data = response.json().get("data", [])
    if len(data) != len(indices):
        return "wrong", f"{len(data)} vectors for {len(indices)} inputs"
    for position, (item, text_index) in enumerate(zip(data, indices)):
        vector = np.asarray(item["embedding"], dtype=np.float32)
        norm = float(np.linalg.norm(vector)) or 1.0
        cosine = float(expected.vectors[text_index] @ vector) / norm
        if item.get("index") != position or cosine < MATCH_COSINE:
            return "wrong", f"input {position} (text {text_index}): index {item.get('index')}, cos {cosine:.5f}"
    return "correct", ""


class LoadGenerator:
    """``concurrency`` clients sending requests back to back into the current phase."""

    def __init__(self, base_url: str, model: str, expected: Expected, concurrency: int = 4,
                 timeout_s: float = 60.0, seed: int = 0) -> None:
        self._url = f"{base_url}/v1/embeddings"
        self._model = model
        self._expected = expected
        self._concurrency = concurrency
        self._timeout_s = timeout_s
        self._random = random.Random(seed)
        self.phase = Outcomes()
        self._running = False
        self._tasks: list[asyncio.Task] = []
        self._client: httpx.AsyncClient | None = None

    async def __aenter__(self) -> LoadGenerator:
        limits = httpx.Limits(max_connections=128)  # room for the overload burst
        self._client = httpx.AsyncClient(timeout=self._timeout_s, limits=limits, trust_env=False)
        self._running = True
        self._tasks = [asyncio.create_task(self._client_loop()) for _ in range(self._concurrency)]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._running = False
        await asyncio.gather(*self._tasks)  # each finishes its request in flight
        assert self._client is not None
        await self._client.aclose()

    def next_phase(self) -> Outcomes:
        """Start counting into a new phase; return the finished one.

        A request is counted in the phase it was sent in, even when its answer
        arrives after the phase ended.
        """
        finished, self.phase = self.phase, Outcomes()
        return finished

    async def send_one(self, n_texts: int | None = None) -> None:
        """Send one request and record it in the current phase."""
        assert self._client is not None
        count = n_texts or self._random.randint(1, 3)
        indices = [self._random.randrange(len(self._expected.texts)) for _ in range(count)]
        body = {"model": self._model, "input": [self._expected.texts[i] for i in indices]}
        phase = self.phase
        phase.sent += 1
        started = time.perf_counter()
        try:
            response = await self._client.post(self._url, json=body)
        except httpx.HTTPError as exc:
            phase.record("lost", time.perf_counter() - started, repr(exc))
            return
        outcome, detail = classify(response, indices, self._expected)
        phase.record(outcome, time.perf_counter() - started, detail)

    async def settle(self, phase: Outcomes) -> None:
        """Wait until every request sent in ``phase`` has its outcome (bounded by the timeout)."""
        deadline = time.monotonic() + self._timeout_s + 5.0
        while phase.answered < phase.sent and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def _client_loop(self) -> None:
        while self._running:
            await self.send_one()
