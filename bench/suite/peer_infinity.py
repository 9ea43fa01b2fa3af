"""infinity-emb as a benchmark peer: its own virtual environment, then its server, in five configurations.

Owns installing ``infinity-emb[server,torch,optimum]==0.0.78`` into a venv
of its own (its pins clash with ours: numpy<2, sentence-transformers<4,
transformers<5) with torch held at the CPU build 2.13.0 and the ONNX stack
(optimum, optimum-onnx, onnxruntime) at the versions verified together here
by a constraints file (an unpinned torch pulls a multi-GB CUDA build), and
running ``infinity_emb v2 --device cpu`` on the embedding model and
optionally a reranker, with telemetry off and the Hugging Face hub offline.
The configurations (``InfinityConfig``) are the ones a user picks from its
CLI: the torch engine in fp32, bf16 or int8 (``--dtype``; int8 is torch's
``quantize_dynamic`` of every linear layer, int8 weights and activations), and the ONNX Runtime
engine (``--engine optimum``) on an ``optimum-cli`` export of the model,
graph-optimized the way infinity does it, in fp32 or quantized to int8
(``onnx_export``: infinity's CPU engine prefers a model's quantized ONNX file;
embeddings only: the reranker is not exported).

What infinity does to inputs (read from its 0.0.78 source, checked by the
suite's cosine probe): embeddings go through SentenceTransformer.tokenize
with no prompt, so nothing like ``query: `` is added, and are always
L2-normalized; rerank strips whitespace from query and documents, truncates
the pair ``longest_first`` to the tokenizer's max length, and returns
sigmoid(logit) sorted highest first (``raw_scores`` false by default). Its
optimum engine pools with CLS unless told ``--pooling-method mean`` (it does
not read the sentence-transformers pooling config), so it is told.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.suite.onnx_export import ensure_onnx_export, ensure_onnx_int8, infinity_cache_dir
from bench.suite.peer_process import HttpPeer, PeerUnavailable, run_logged_step, running_server
from embedserve.launch.processes import free_port

INFINITY_VERSION = "0.0.78"
INFINITY_REQUIREMENT = f"infinity-emb[server,torch,optimum]=={INFINITY_VERSION}"
# The versions verified together here; torch is the one that must not float.
# huggingface-hub: transformers 4.57 needs < 1.0, and without a pin pip
# downloads every 1.x release before it backtracks.
CONSTRAINTS = ("torch==2.13.0", "sentence-transformers==3.4.1", "transformers==4.57.6", "numpy==1.26.4",
               "optimum==2.1.0", "optimum-onnx==0.1.0", "onnxruntime==1.32.0", "onnx==1.23.2",
               "huggingface-hub==0.36.2")
INCOMPLETE_MARKER = ".embedserve-install-incomplete"
INSTALL_TIMEOUT_S = 1800.0
PROBE_TIMEOUT_S = 180.0
READY_TIMEOUT_S = 600.0          # two models load (~30 s here on 2 busy cores)

_PROBE = ("import json, importlib.metadata as m; import infinity_emb, torch, sentence_transformers; "
          "import onnxruntime, optimum.onnxruntime; "
          "print(json.dumps({p: m.version(p) for p in "
          "('infinity-emb', 'torch', 'sentence-transformers', 'transformers', 'onnxruntime', 'optimum')}))")


def _venv_python(venv_dir: Path) -> Path:
    return venv_dir / "bin" / "python"


def probe_venv(venv_dir: Path) -> dict[str, str]:
    """Versions installed in ``venv_dir``; raises PeerUnavailable if it cannot import infinity."""
    python = _venv_python(venv_dir)
    try:
        done = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PeerUnavailable(f"infinity venv {venv_dir} is not usable: {exc}") from None
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()[-2000:] or "(no output)"
        raise PeerUnavailable(f"infinity venv {venv_dir} is not usable: {python} exited "
                              f"with status {done.returncode}:\n{output}")
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise PeerUnavailable(f"infinity venv {venv_dir}: unexpected probe output {done.stdout!r}") from None


def _install(venv_dir: Path, work_dir: Path, log: Callable[[str], None]) -> None:
    constraints = work_dir / "infinity-constraints.txt"
    constraints.write_text("\n".join(CONSTRAINTS) + "\n")
    install_log = work_dir / "infinity-install.log"
    steps = [[sys.executable, "-m", "venv", str(venv_dir)],
             [str(_venv_python(venv_dir)), "-m", "pip", "install", "--disable-pip-version-check",
              "-c", str(constraints), INFINITY_REQUIREMENT]]
    log(f"infinity: installing {INFINITY_REQUIREMENT} into {venv_dir} (log: {install_log}); "
        "this takes minutes")
    started = time.monotonic()
    install_log.write_bytes(b"")
    for i, step in enumerate(steps):
        run_logged_step(step, install_log, f"infinity install ({' '.join(step[:4])})", INSTALL_TIMEOUT_S)
        if i == 0:
            # Marks a venv this code created, so a half-finished one may be replaced.
            (venv_dir / INCOMPLETE_MARKER).touch()
    log(f"infinity: installed in {time.monotonic() - started:.0f} s")


def ensure_infinity_venv(venv_dir: Path, work_dir: Path, log: Callable[[str], None],
                         install: bool = True) -> dict[str, str]:
    """Reuse a working venv, else install one; returns the installed versions.

    A venv that exists but cannot import infinity is left alone (it may be
    someone's) and reported, unless this code's own unfinished install left it.
    """
    if _venv_python(venv_dir).exists() or _venv_python(venv_dir).is_symlink():
        try:
            versions = probe_venv(venv_dir)
        except PeerUnavailable as exc:
            if not (venv_dir / INCOMPLETE_MARKER).exists():
                # e.g. a venv an older suite made without the ONNX packages.
                raise PeerUnavailable(f"{exc}\n(not replaced: it may be someone's; remove it to let the "
                                      f"suite install {INFINITY_REQUIREMENT} there)") from None
            log(f"infinity: {venv_dir} is an unfinished install; replacing it")
            shutil.rmtree(venv_dir)
        else:
            (venv_dir / INCOMPLETE_MARKER).unlink(missing_ok=True)
            return versions
    elif venv_dir.exists() and any(venv_dir.iterdir()):
        raise PeerUnavailable(f"{venv_dir} exists but holds no virtual environment (no bin/python); "
                              "remove it or pass another directory")
    if not install:
        raise PeerUnavailable(f"infinity-emb is not installed in {venv_dir} (installing was not allowed)")
    work_dir.mkdir(parents=True, exist_ok=True)
    _install(venv_dir, work_dir, log)
    versions = probe_venv(venv_dir)
    (venv_dir / INCOMPLETE_MARKER).unlink(missing_ok=True)
    return versions


def _server_env(work_dir: Path, base_env: Mapping[str, str] | None) -> dict[str, str]:
    # The child gets the caller's environment (this process's when None, as a
    # child would inherit it) minus INFINITY_* settings, which would silently
    # override the flags below (url prefix, batch size, ...).
    source = os.environ if base_env is None else base_env
    env = {k: v for k, v in source.items() if not k.startswith("INFINITY_")}
    env.update(INFINITY_ANONYMOUS_USAGE_STATS="0", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1",
               INFINITY_HOME=str(work_dir / "infinity-home"))
    return env


def _check_model_dir(path: Path, what: str) -> None:
    if not (path / "config.json").is_file():
        raise PeerUnavailable(f"infinity: {what} {path} is not a model directory (no config.json)")


@dataclass(frozen=True)
class InfinityConfig:
    """One configuration a user can pick from infinity's CLI."""

    engine: str = "torch"          # "torch" (sentence-transformers) or "optimum" (ONNX Runtime)
    # the torch engine's --dtype (int8: torch's quantize_dynamic of every Linear, on a CPU);
    # the optimum engine's graph: float32 or int8
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.engine not in ("torch", "optimum"):
            raise ValueError(f"engine must be 'torch' or 'optimum', not {self.engine!r}")
        if self.engine == "optimum" and self.dtype not in ("float32", "int8"):
            raise ValueError("the optimum engine runs the fp32 ONNX export or its int8 quantization; "
                             f"dtype must be float32 or int8, not {self.dtype!r}")

    @property
    def label(self) -> str:
        if self.engine == "optimum":
            return "ONNX Runtime" + (" int8" if self.dtype == "int8" else "")
        return "torch " + {"float32": "fp32", "bfloat16": "bf16"}.get(self.dtype, self.dtype)

    @property
    def reranks(self) -> bool:
        """Whether this configuration serves the reranker too (the ONNX export is the embedder's alone)."""
        return self.engine == "torch"


def infinity_command(venv_dir: Path, port: int, model_id: str, reranker_dir: Path | None,
                     config: InfinityConfig) -> list[str]:
    """The ``infinity_emb v2`` argv; each option given once applies to every ``--model-id``."""
    # --no-model-warmup: infinity's start-up warm-up only logs its own timings
    # (4 batches of 32 texts per model, ~45 s of 2-core CPU for two models);
    # the suite warms every system with its own requests instead.
    command = [str(venv_dir / "bin" / "infinity_emb"), "v2", "--host", "127.0.0.1", "--port", str(port),
               "--engine", config.engine, "--device", "cpu", "--no-model-warmup",
               "--model-id", model_id, "--served-model-name", "embed"]
    if config.engine == "torch":
        command += ["--dtype", config.dtype]
    else:
        command += ["--pooling-method", "mean"]        # its optimum engine's default is CLS
    if reranker_dir is not None:
        command += ["--model-id", str(reranker_dir), "--served-model-name", "rerank"]
    return command


@contextlib.contextmanager
def infinity_peer(model_dir: Path, reranker_dir: Path | None, work_dir: Path,
                  log: Callable[[str], None], *, config: InfinityConfig = InfinityConfig(),
                  venv_dir: Path | None = None, install: bool = True,
                  env: Mapping[str, str] | None = None) -> Iterator[HttpPeer]:
    """infinity-emb serving ``model_dir`` (and ``reranker_dir``) on 127.0.0.1 until the block exits.

    ``config`` picks the engine and dtype; the optimum engine serves the
    ONNX export of ``model_dir`` (made on first use) and no reranker.
    ``venv_dir`` defaults to ``work_dir/infinity-venv``; ``install`` False
    reports a missing install instead of installing; ``env`` is the server's
    environment before the telemetry/offline settings (None: this process's).
    """
    model_dir, work_dir = Path(model_dir).resolve(), Path(work_dir).resolve()
    _check_model_dir(model_dir, "model")
    if reranker_dir is not None and config.reranks:
        reranker_dir = Path(reranker_dir).resolve()
        _check_model_dir(reranker_dir, "reranker")
    else:
        reranker_dir = None
    venv_dir = Path(venv_dir).resolve() if venv_dir is not None else work_dir / "infinity-venv"
    versions = ensure_infinity_venv(venv_dir, work_dir, log, install)
    server_env = _server_env(work_dir, env)
    if config.engine == "torch":
        model_id, cwd = str(model_dir), None
    else:
        # infinity hands optimum the ONNX file's path as its glob found it, and optimum
        # 2.x wants a bare file name: so the model id is ".", run in the export directory.
        export = (ensure_onnx_int8 if config.dtype == "int8" else ensure_onnx_export)(model_dir, work_dir,
                                                                                   venv_dir, log)
        model_id, cwd = ".", export
        hub = str(infinity_cache_dir(export))
        server_env.update(HUGGINGFACE_HUB_CACHE=hub, HF_HUB_CACHE=hub)

    port = free_port()
    command = infinity_command(venv_dir, port, model_id, reranker_dir, config)
    base_url = f"http://127.0.0.1:{port}"
    name = f"infinity-emb {versions.get('infinity-emb', '?')} ({config.label}, cpu)"
    slug = config.label.lower().replace(" ", "-")
    if config.engine == "torch":
        note = (f"{config.dtype}, torch {versions.get('torch', '?')}, sentence-transformers "
                f"{versions.get('sentence-transformers', '?')}, transformers {versions.get('transformers', '?')}")
    else:
        isa = export.suffix.removeprefix(".int8-")      # ensure_onnx_int8's directory: <export>.int8-<isa>
        graph = ("fp32 `optimum-cli export onnx` graph" if config.dtype == "float32" else
                 f"`optimum-cli export onnx` graph quantized to int8 ({isa} dynamic per channel, ORTQuantizer)")
        note = (f"onnxruntime {versions.get('onnxruntime', '?')} (CPUExecutionProvider), optimum "
                f"{versions.get('optimum', '?')}; {graph} with infinity's ORT "
                "optimization (level 99, fused Attention/SkipLayerNorm/BiasGelu), --pooling-method mean; "
                "embeddings only")
    with running_server(command, name=name, health_url=f"{base_url}/health",
                        log_path=work_dir / f"infinity-{slug}-server.log", env=server_env,
                        ready_timeout_s=READY_TIMEOUT_S, log=log, cwd=cwd):
        yield HttpPeer(
            name=name, base_url=base_url, embeddings_path="/embeddings", model="embed",
            rerank_path="/rerank" if reranker_dir is not None else None,
            rerank_model="rerank" if reranker_dir is not None else None,
            note=note + "; no prefix added, always L2-normalized")
