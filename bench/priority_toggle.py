"""``python -m bench priority_toggle``: the bulk job's share, with the online client switched on and off.

The same question as ``python -m bench priority`` (how much of its solo tokens/s a bulk
``embedserve embed --url`` job keeps while an interactive client sends a short query every
``--interval-ms``), measured within one long job instead of between whole jobs: the
interactive client runs for ``--segment-s`` seconds, pauses for as long, and so on until
the job ends. Why: this host's speed drifts by 10-30 % within a minute (a bulk job alone
ran at 15-25k tokens/s in one 4-round run), so whole jobs 20-40 s apart compare the host
as much as the queries; adjacent segments seconds apart do not.

Each segment's bulk tokens are the replicas' batch-class step tokens
(``embedserve_scheduler_class_step_tokens_sum{priority="batch"}``, read from the
gateway's ``/metrics`` at each switch: one scrape per segment, the same in both kinds).
Each segment with the client on is compared with the mean of the two off segments beside
it (a drift linear over the three cancels); reported: the median of those ratios, the
ratio of all on tokens/s to all off tokens/s, the interactive latency during the on
segments, and the target (issue 46: >= 0.85). The first segment (the job filling the
pipeline) and the one the job ends in are left out.
"""

from __future__ import annotations

import argparse
import re
import threading
import time
import urllib.request

import numpy as np

from bench.bulk_bench import run_embed
from bench.priority_bench import interactive_client, log, parse_arguments, percentiles, warm_serve
from bench.reference_data import MISSING_EXIT_STATUS

BATCH_TOKENS = re.compile(
    r'^embedserve_scheduler_class_step_tokens_sum\{[^}]*priority="batch"[^}]*\} ([0-9.e+]+)$', re.MULTILINE)


def batch_tokens(base_url: str) -> float:
    """Batch-class tokens the replicas have put in steps so far."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=10.0) as reply:
        return sum(float(v) for v in BATCH_TOKENS.findall(reply.read().decode()))


def on_off_ratios(segments: list[tuple[bool, float, float]]) -> list[float]:
    """Each on segment's tokens/s over the mean of its two off neighbours'."""
    ratios = []
    for i in range(1, len(segments) - 1):
        on, tokens, seconds = segments[i]
        before, after = segments[i - 1], segments[i + 1]
        if on and not before[0] and not after[0]:
            off_rate = (before[1] / before[2] + after[1] / after[2]) / 2
            ratios.append(tokens / seconds / off_rate)
    return ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench priority_toggle", description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=15000, help="bulk job documents (default: %(default)s)")
    parser.add_argument("--segment-s", type=float, default=4.0,
                        help="seconds the interactive client is on, then off (default: %(default)s)")
    args = parse_arguments(parser, argv)
    if args is None:
        return MISSING_EXIT_STATUS

    interval = args.interval_ms / 1e3
    segments: list[tuple[bool, float, float]] = []
    with warm_serve(args, args.docs) as served:
        base_url = served.base_url
        active, stop, finished = threading.Event(), threading.Event(), threading.Event()
        results: list[tuple[float, float, dict[str, float]]] = []
        summary: dict[str, float] = {}
        client = threading.Thread(target=lambda: results.extend(
            interactive_client(base_url, interval, stop, None, args.client, active=active)))

        def job() -> None:
            summary.update(run_embed(served.corpus, served.output, served.model_dir, "--url", base_url))
            finished.set()

        bulk = threading.Thread(target=job)
        client.start()
        log(f"one bulk job of {args.docs} documents, the client on and off every {args.segment_s:g} s")
        bulk.start()
        start = batch_tokens(base_url)
        while not finished.is_set() and batch_tokens(base_url) <= start:   # the job's own tokenizing
            finished.wait(0.2)
        on_windows: list[tuple[float, float]] = []
        on, last_t, last_tokens = False, time.monotonic(), batch_tokens(base_url)
        while not finished.is_set():
            (active.set if on else active.clear)()
            ended = finished.wait(args.segment_s)
            now, tokens = time.monotonic(), batch_tokens(base_url)
            if not ended:
                segments.append((on, tokens - last_tokens, now - last_t))
                if on:
                    on_windows.append((last_t, now))
            on, last_t, last_tokens = not on, now, tokens
        active.clear()
        stop.set()
        client.join()
        bulk.join()
    segments = segments[1:]            # the first: the pipeline filling
    ratios = on_off_ratios(segments)
    if not ratios:
        log("too few segments: raise --docs or lower --segment-s")
        return 1
    rate = {state: sum(t for on, t, _ in segments if on == state) / sum(s for on, _, s in segments if on == state)
            for state in (True, False)}
    during = [r for r in results if any(a <= r[0] <= b for a, b in on_windows[1:])]
    shared = percentiles(during)
    print(f"\nembedserve serve {args.serve_args or '(defaults)'}; one bulk job of {args.docs} documents "
          f"({summary.get('tokens', 0):,.0f} tokens, {summary.get('seconds', 0):.0f} s); a query every "
          f"{args.interval_ms:.0f} ms, client {args.client}, on and off every {args.segment_s:g} s\n")
    print("| segment | client | bulk tokens/s |\n|---:|---|---:|")
    for i, (on, tokens, seconds) in enumerate(segments, 2):
        print(f"| {i} | {'on' if on else 'off'} | {tokens / seconds:,.0f} |")
    print(f"\ninteractive during bulk: {shared['n']} queries, p50 {shared['p50']:.1f} ms, p90 {shared['p90']:.1f}, "
          f"p99 {shared['p99']:.1f}, max {shared['max']:.1f}")
    print(f"bulk tokens/s with the client on / its off neighbours, per on segment: "
          f"{', '.join(f'{r:.2f}' for r in ratios)}; median **{np.median(ratios):.2f}** "
          f"(quartiles {np.percentile(ratios, 25):.2f}-{np.percentile(ratios, 75):.2f}); all on / all off "
          f"{rate[True] / rate[False]:.2f} ({rate[True]:,.0f} / {rate[False]:,.0f} tokens/s)")
    print(f"\n- bulk tokens/s with the client on >= 0.85x off (median): "
          f"{'met' if np.median(ratios) >= 0.85 else 'NOT met'}")
    return 0
