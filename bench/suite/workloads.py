"""The four workloads, each time-boxed, each answer checked before it counts.

1. ``low_latency``: batch of 1, strictly sequential requests; p50/p90/p99/max per input size.
2. ``rerank_latency``: one query against N documents (pairs of a fixed token count), sequential.
3. ``throughput``: ``throughput_clients`` client *processes* sending batches back to back;
   embeddings/s and tokens/s over the wall time from the common start to the last answer.
4. ``concurrency``: batch 1 at 1..16 concurrent callers (asyncio, one client process), latency
   percentiles and embeddings/s per level.

A subject is one running system seen through a client. Knows nothing about
starting systems or writing reports; ``log`` gets one progress line per step.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import numpy as np

from bench.suite.checks import BadAnswer, Reference, check_embeddings, check_scores
from bench.suite.clients import AsyncHttpClient, Client, HttpClient
from bench.suite.peer_process import HttpPeer
from bench.suite.profiles import Profile
from bench.suite.results import Row
from bench.suite.texts import TextSet

MAX_FAILURES = 3          # a system that failed this often in one measurement is not measured further
ANSWER_ERRORS = (BadAnswer, httpx.HTTPError)


@dataclass(frozen=True)
class Subject:
    name: str
    client: Client                # sequential calls (workloads 1-3 in-process)
    peer: HttpPeer | None         # None: in-process, no server for workloads 3 (processes) and 4
    min_cosine: float
    score_tolerance: float


def _too_long(row: Row, n: int, limit: int) -> bool:
    if n > limit:
        row.skipped = f"longer than the model's {limit} positions"
    return n > limit


def _progress(row: Row, log: Callable[[str], None]) -> None:
    if row.skipped:
        log(f"  {row.workload} {row.label}: n/a ({row.skipped})")
    elif row.failures:
        log(f"  {row.workload} {row.label}: FAILED ({row.failures}x: {row.failure})")
    elif row.workload in ("latency", "rerank", "concurrency"):
        f = row.latency_figures()
        log(f"  {row.workload} {row.label}: {len(row.latencies_ms)} requests, p50 {f['p50']:.1f} ms, "
            f"p99 {f['p99']:.1f} ms, {row.texts_per_s:.1f} texts/s")
    else:
        log(f"  {row.workload} {row.label}: {row.texts} texts in {row.seconds:.1f} s, "
            f"{row.texts_per_s:.1f} emb/s, {row.tokens_per_s:,.0f} tokens/s")


def _timed(row: Row, call: Callable[[int], tuple[float, int, int]], max_requests: int, box_s: float,
           min_samples: int, warmups: int, larger_is_better: bool) -> None:
    """Call ``call(i)`` -> (agreement, texts, tokens) sequentially within the box; record it all."""
    for i in range(warmups):
        try:
            row.agree(call(i)[0], larger_is_better)
        except ANSWER_ERRORS as exc:
            row.fail(f"{type(exc).__name__}: {exc}")
            return
    started = time.perf_counter()
    i = 0
    while i < max_requests and (i < min_samples or time.perf_counter() - started < box_s):
        sent = time.perf_counter()
        try:
            agreement, texts, tokens = call(warmups + i)
        except ANSWER_ERRORS as exc:
            row.fail(f"{type(exc).__name__}: {exc}")
            if row.failures >= MAX_FAILURES:
                break
            i += 1
            continue
        row.latencies_ms.append((time.perf_counter() - sent) * 1e3)
        row.texts += texts
        row.tokens += tokens
        row.agree(agreement, larger_is_better)
        i += 1
    row.seconds = time.perf_counter() - started


def low_latency(subject: Subject, texts: TextSet, ref: Reference, profile: Profile, limit: int,
                log: Callable[[str], None]) -> list[Row]:
    rows = []
    for n in profile.latency_sizes:
        row = Row(subject.name, "latency", f"{n} tokens", n)
        if not _too_long(row, n, limit):
            pool = texts.latency[n]

            def one(i: int, pool=pool, n=n) -> tuple[float, int, int]:
                text = pool[i % len(pool)]
                vectors = subject.client.embed([text])
                return check_embeddings(vectors, ref.embedding_matrix([text]), subject.min_cosine), 1, n

            _timed(row, one, profile.latency_requests, profile.latency_box_s, profile.min_samples, 1, True)
        _progress(row, log)
        rows.append(row)
    return rows


def rerank_latency(subject: Subject, texts: TextSet, ref: Reference, profile: Profile,
                   log: Callable[[str], None], seed: int = 0) -> list[Row]:
    rng = random.Random(seed)     # the same document draws for every system
    rows = []
    for position, n in enumerate(profile.rerank_docs):
        row = Row(subject.name, "rerank", f"{n} docs", n)
        draws = [rng.sample(texts.rerank_docs, n) for _ in range(profile.rerank_requests + 1)]

        def one(i: int, draws=draws, n=n) -> tuple[float, int, int]:
            docs = draws[i % len(draws)]
            scores = subject.client.rerank(texts.rerank_query, docs)
            expected = np.asarray([ref.rerank_logits[d] for d in docs])
            return check_scores(scores, expected, subject.score_tolerance), n, n * texts.rerank_pair_tokens

        # One warm-up request for the first size only: a 50-document request costs seconds on CPU.
        _timed(row, one, profile.rerank_requests, profile.rerank_box_s, profile.min_samples,
               1 if position == 0 else 0, False)
        _progress(row, log)
        rows.append(row)
    return rows


def _batches(pool_size: int, batch: int, client: int, clients: int):
    """Index lists for one client: consecutive windows of the pool, offset per client."""
    for k in itertools.count():
        first = (client + k * clients) * batch
        yield [(first + j) % pool_size for j in range(batch)]


def throughput_client(peer: HttpPeer, pool: list[str], expected: np.ndarray, counts: list[int],
                      batch: int, client: int, clients: int, box_s: float, min_cosine: float,
                      barrier, results) -> None:
    """One client process of workload 3: send batches until the box closes (at least one)."""
    http = HttpClient(peer)
    out = {"texts": 0, "tokens": 0, "failures": 0, "failure": "", "worst": 1.0, "last_done": 0.0}
    try:
        barrier.wait(timeout=300)
        started = time.time()
        for indices in _batches(len(pool), batch, client, clients):
            if out["texts"] and time.time() - started >= box_s:
                break
            try:
                vectors = http.embed([pool[i] for i in indices])
                out["worst"] = min(out["worst"], check_embeddings(vectors, expected[indices], min_cosine))
            except ANSWER_ERRORS as exc:
                out["failures"] += 1
                out["failure"] = out["failure"] or f"{type(exc).__name__}: {exc}"
                break
            out["texts"] += len(indices)
            out["tokens"] += sum(counts[i] for i in indices)
            out["last_done"] = time.time()
    finally:
        http.close()
        results.put(out)


def throughput(subject: Subject, texts: TextSet, ref: Reference, profile: Profile, limit: int,
               log: Callable[[str], None]) -> list[Row]:
    rows = []
    for label, pool in texts.throughput.items():
        size = int(label) if label.isdigit() else max(texts.token_counts[t] for t in pool)
        row = Row(subject.name, "throughput", f"{label} tokens" if label.isdigit() else label, size)
        if not _too_long(row, size, limit):
            counts = [texts.token_counts[t] for t in pool]
            expected = ref.embedding_matrix(pool)
            if _warm_up_batch(subject, row, pool, expected, profile):
                measure = _in_process_throughput if subject.peer is None else _process_throughput
                measure(subject, row, pool, expected, counts, profile)
        _progress(row, log)
        rows.append(row)
    return rows


def _warm_up_batch(subject: Subject, row: Row, pool: list[str], expected: np.ndarray, profile: Profile) -> bool:
    """One unmeasured batch, as the other workloads send one request before they time:
    a system's first batch may pay a one-time cost that is not its throughput (embedserve
    compiles its batch tokenizer kernel on first use after an install or an edit, ~40 s on
    2 cores). False (the row failed) when the answer is wrong."""
    indices = list(range(min(profile.throughput_batch, len(pool))))
    try:
        vectors = subject.client.embed([pool[i] for i in indices])
        row.agree(check_embeddings(vectors, expected[indices], subject.min_cosine), True)
    except ANSWER_ERRORS as exc:
        row.fail(f"{type(exc).__name__}: {exc}")
        return False
    return True


def _in_process_throughput(subject: Subject, row: Row, pool: list[str], expected: np.ndarray,
                           counts: list[int], profile: Profile) -> None:
    """A library has one caller: batches back to back in this process."""
    batches = _batches(len(pool), profile.throughput_batch, 0, 1)

    def one(_: int) -> tuple[float, int, int]:
        indices = next(batches)
        vectors = subject.client.embed([pool[i] for i in indices])
        worst = check_embeddings(vectors, expected[indices], subject.min_cosine)
        return worst, len(indices), sum(counts[i] for i in indices)

    _timed(row, one, 10_000, profile.throughput_box_s, 1, 0, True)


def _process_throughput(subject: Subject, row: Row, pool: list[str], expected: np.ndarray,
                        counts: list[int], profile: Profile) -> None:
    context = multiprocessing.get_context("spawn")
    clients = profile.throughput_clients
    barrier, results = context.Barrier(clients + 1), context.Queue()
    processes = [context.Process(target=throughput_client, daemon=True, args=(
        subject.peer, pool, expected, counts, profile.throughput_batch, c, clients,
        profile.throughput_box_s, subject.min_cosine, barrier, results)) for c in range(clients)]
    for process in processes:
        process.start()
    try:
        barrier.wait(timeout=300)
        started = time.time()
        outs = [results.get(timeout=1800) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=30)
    for out in outs:
        row.texts += out["texts"]
        row.tokens += out["tokens"]
        if out["failures"]:
            row.fail(out["failure"])
        elif out["texts"]:
            row.agree(out["worst"], True)
    row.seconds = max(out["last_done"] for out in outs) - started if row.texts else 0.0


async def _concurrent_level(subject: Subject, row: Row, pool: list[str], expected: np.ndarray,
                            tokens: int, level: int, profile: Profile) -> None:
    assert subject.peer is not None
    client = AsyncHttpClient(subject.peer, level)
    counter = itertools.count()
    started = time.perf_counter()

    async def caller() -> None:
        while row.failures < MAX_FAILURES:
            k = next(counter)
            if k >= profile.concurrency_requests or (
                    k >= max(level, profile.min_samples)
                    and time.perf_counter() - started >= profile.concurrency_box_s):
                return
            sent = time.perf_counter()
            try:
                vectors = await client.embed([pool[k % len(pool)]])
                worst = check_embeddings(vectors, expected[[k % len(pool)]], subject.min_cosine)
            except ANSWER_ERRORS as exc:
                row.fail(f"{type(exc).__name__}: {exc}")
                continue
            row.latencies_ms.append((time.perf_counter() - sent) * 1e3)
            row.texts += 1
            row.tokens += tokens
            row.agree(worst, True)

    try:
        await asyncio.gather(*(caller() for _ in range(level)))
    finally:
        row.seconds = time.perf_counter() - started
        await client.aclose()


def concurrency(subject: Subject, texts: TextSet, ref: Reference, profile: Profile,
                log: Callable[[str], None]) -> list[Row]:
    rows = []
    expected = ref.embedding_matrix(texts.concurrency)
    for level in profile.concurrency_levels:
        row = Row(subject.name, "concurrency", f"{level} client{'s' if level > 1 else ''}", level)
        if subject.peer is None:
            row.skipped = "in-process library: no server for concurrent clients"
        else:
            asyncio.run(_concurrent_level(subject, row, texts.concurrency, expected,
                                          texts.concurrency_tokens, level, profile))
        _progress(row, log)
        rows.append(row)
    return rows
