"""Short-query steps in process: the general path against small steps' flat loop, in one run.

    python -m bench short_query [--lengths 6,32,128] [--steps 300] [--threads N] [--idle-ms 0,2,20]
    python -m bench short_query --replica [...]

Loads the default model (multilingual-e5-small) in bf16 twice: once as served (steps of
up to 64 tokens take the flat loop, engine/small_steps.py) and once with
``small_steps=False`` (the general path through the modules, what every step ran
before). For each length it runs one-sequence steps inline (as a replica's event loop
does for calls over frames), alternating the two engines step by step so that a shared
machine's background load hits both alike, and reports wall p50 / p99 / min per path, the
ratio flat / general of each, and the process's mean CPU time per step (all threads:
it moves far less with a busy machine than wall time does; ``--threads 1`` keeps
OpenMP's spinning out of it). 128 tokens is over the flat loop's limit: both run the
general path there, so its ratio says what the noise is. ``--idle-ms`` repeats each
length with the process asleep that long before every step, as a replica is between
sporadic queries (its OpenMP threads asleep, its caches cooled by whatever ran
meanwhile): back to back (0) is the best case, not what a user's query meets.

``--replica`` compares instead the flat loop as a replica runs it (``small_step_threads=1``:
one OpenMP thread) with bf16_linear's linears on the calling thread alone
(``small_step_helper=False``) against the same with the kernel's helper thread taking a
share of each linear (csrc/helper_team.h, what a replica does where the AVX512-BF16 kernel
runs); torch keeps its threads (two or more, so the step's share allows the helper).

Then, for the first length, where a flat step's time goes: the same step with its parts
timed apart (embedding sum + LayerNorm; the linears; attention; add + LayerNorm; pooling;
the rest is the loop itself), by running each part's kernels alone on the step's shapes.
The load average (``/proc/loadavg``) is printed before and after: on a shared machine,
quote it with the figures. The HTTP view (client, gateway, replica, engine):
``python -m bench overhead --text "how do I bake bread?" --stack BEFORE_TREE --stack .``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from bench.without_amx import add_option, apply


def host() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def summary(seconds: list[float]) -> tuple[float, float, float]:
    ms = np.array(seconds) * 1e3
    return float(np.median(ms)), float(np.percentile(ms, 99)), float(ms.min())


def interleaved(engines: dict, batch, steps: int, warmup: int = 20, idle_s: float = 0.0) -> tuple[dict, dict]:
    """Wall seconds of ``steps`` inline steps per engine, the engines taking turns, each after
    ``idle_s`` asleep, and each step's CPU seconds (the process's, every thread: OpenMP's
    spinning included)."""
    times: dict[str, list[float]] = {name: [] for name in engines}
    cpu: dict[str, list[float]] = {name: [] for name in engines}
    for i in range(warmup + steps):
        for name, engine in engines.items():
            if idle_s:
                time.sleep(idle_s)
            started, cpu_started = time.perf_counter(), time.process_time()
            engine.step(batch, inline=True).wait()
            if i >= warmup:
                times[name].append(time.perf_counter() - started)
                cpu[name].append(time.process_time() - cpu_started)
    return times, cpu


def parts(engine, batch, padded, repeats: int) -> dict[str, float]:
    """Median wall ms of each part of a flat step (``batch``; ``padded``: as the runner pads
    it), its kernels run alone on the step's shapes."""
    import torch

    from embedserve.engine.small_steps import _attend, _linear, _norm

    small = engine._runner._small
    tokens = padded.num_tokens
    hidden = small._hidden
    ids = torch.from_numpy(padded.token_ids.astype(np.int64))
    positions = torch.arange(tokens) + small._position_offset
    types = small._no_types[:tokens]
    starts = torch.zeros(1, dtype=torch.int64)
    lengths = torch.tensor([tokens], dtype=torch.int64)
    x = small._embed(ids, types, positions)
    qkv = torch.randn(tokens, 3 * hidden).to(torch.bfloat16)
    context = torch.empty(tokens, small._heads, small._head_dim, dtype=torch.bfloat16)
    inter = _linear(small._layers[0].ffn_in, x, *small._layers[0].activation)
    threads = torch.get_num_threads()

    def linears() -> None:
        for layer in small._layers:
            _linear(layer.qkv, x)
            _linear(layer.attn_out, x)
            _linear(layer.ffn_in, x, *layer.activation)
            _linear(layer.ffn_out, inter)

    def attention() -> None:
        base = qkv.data_ptr()
        for _ in small._layers:
            _attend(base, base + 2 * hidden, base + 4 * hidden, context.data_ptr(), qkv.stride(0), hidden,
                    small._heads, small._head_dim, starts.data_ptr(), lengths.data_ptr(), 1, small._scale,
                    threads, small._amx)

    def norms() -> None:
        y = x.clone()
        for layer in small._layers:
            _norm(y, x, layer.attn_norm, tokens, hidden, threads)
            _norm(y, x, layer.ffn_norm, tokens, hidden, threads)

    def pooling() -> None:
        from embedserve.engine.modules.pooling import mean_pool
        mean_pool(x, torch.zeros(tokens, dtype=torch.int64), lengths, 1).numpy()

    work = {"whole step": lambda: engine.step(batch, inline=True).wait(),
            "embeddings": lambda: small._embed(ids, types, positions),
            "linears (48)": linears, "attention (12)": attention, "add + LayerNorm (24)": norms,
            "pooling": pooling}
    seconds: dict[str, list[float]] = {name: [] for name in work}
    with torch.inference_mode():
        for i in range(repeats + 5):          # the parts take turns, as the engines do above
            for name, call in work.items():
                started = time.perf_counter()
                call()
                if i >= 5:
                    seconds[name].append(time.perf_counter() - started)
    return {name: float(np.median(times) * 1e3) for name, times in seconds.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="6,32,128", help="tokens per one-sequence step")
    parser.add_argument("--steps", type=int, default=300, help="timed steps per length and path")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--idle-ms", default="0", help="idle gaps before each step, ms, comma-separated "
                        "(default: 0, back to back)")
    parser.add_argument("--replica", action="store_true",
                        help="one thread alone against one thread and bf16_linear's helper (flat loop both)")
    add_option(parser)
    args = parser.parse_args(argv)

    apply(args)
    import torch

    from embedserve.defaults.build import ensure_default_model
    from embedserve.defaults.model_args import default_cache_dir
    from embedserve.engine import Batch, Engine
    from embedserve.engine.cpu_shapes import pad_to_bucket

    if args.threads:
        torch.set_num_threads(args.threads)
    model_dir = ensure_default_model(default_cache_dir())
    lengths = [int(n) for n in args.lengths.split(",")]
    print(f"{host()}, {torch.get_num_threads()} threads, torch {torch.__version__}; load {load()}")
    rng = np.random.default_rng(0)
    if args.replica:   # A: one thread alone; B: one thread and the helper
        names = ("one thread", "with helper")
        a_options: dict = {"small_step_threads": 1, "small_step_helper": False}
        b_options: dict = {"small_step_threads": 1}
    else:              # A: the general path; B: the flat loop
        names = ("general", "flat")
        a_options, b_options = {"small_steps": False}, {}
    with (Engine.load(model_dir, dtype="bfloat16", **b_options) as flat,
          Engine.load(model_dir, dtype="bfloat16", **a_options) as general):
        if flat._runner._small is None:
            print("the flat loop does not cover this model here (no native bf16 kernels?)")
            return 1
        engines = {"general": general, "flat": flat}
        a, b = names
        print(f"\n| step | {a} p50 / p99 / min (ms) | {b} p50 / p99 / min (ms) | {b} / {a} p50 | min "
              f"| CPU ms per step, {a} / {b} | CPU {b} / {a} |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for idle_ms in [float(v) for v in args.idle_ms.split(",")]:
            for n in lengths:
                batch = Batch.from_sequences([rng.integers(5, 200_000, n).astype(np.int32)])
                times, cpu = interleaved(engines, batch, args.steps, idle_s=idle_ms / 1e3)
                (g50, g99, gmin), (f50, f99, fmin) = summary(times["general"]), summary(times["flat"])
                gcpu, fcpu = (float(np.mean(cpu[name]) * 1e3) for name in ("general", "flat"))
                after = f", after {idle_ms:g} ms idle" if idle_ms else ""
                print(f"| 1 x {n}{after} | {g50:.2f} / {g99:.2f} / {gmin:.2f} | {f50:.2f} / {f99:.2f} / {fmin:.2f} "
                      f"| {f50 / g50:.2f}x | {fmin / gmin:.2f}x | {gcpu:.2f} / {fcpu:.2f} | {fcpu / gcpu:.2f}x |")
        batch = Batch.from_sequences([rng.integers(5, 200_000, lengths[0]).astype(np.int32)])
        exact = flat._runner._exact_up_to >= batch.num_tokens   # as CpuRunner._run decides
        padded = batch if exact else pad_to_bucket(batch, flat.info.max_positions)
        if not flat._runner._small.covers(padded):    # the general path runs it: no flat parts
            print(f"\n1 x {lengths[0]} ({padded.num_tokens} rows after padding) is past the flat loop: "
                  "no breakdown (`python -m bench engine_profile` profiles the general path)")
            return 0
        print(f"\nWhere a flat 1 x {lengths[0]} step goes ({padded.num_tokens} rows after padding), "
              "median ms of each part run alone:")
        spent = parts(flat, batch, padded, max(50, args.steps // 3))
        named = sum(value for key, value in spent.items() if key != "whole step")
        for name, value in spent.items():
            print(f"  {name:24s} {value:6.3f}")
        # the parts run alone find the weights warmer than inside a step: this is an estimate
        print(f"  {'whole step - parts':24s} {spent['whole step'] - named:6.3f}  (the loop, hand-offs, colder caches)")
    print(f"\nload after: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
