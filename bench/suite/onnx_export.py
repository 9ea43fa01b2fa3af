"""The model as ONNX for infinity's ONNX Runtime engine: exported once by ``optimum-cli``, then reused.

Owns one directory per model under ``WORK_DIR/onnx``: ``optimum-cli export
onnx --task feature-extraction`` run with the infinity venv's own optimum
(the version infinity loads it with), written to a temporary directory and
renamed into place only when the export (and optimum's own check of the ONNX
outputs against PyTorch) succeeded, so a killed export is never reused. The
directory's name carries a fingerprint of the model directory's files
(names, sizes, modification times): a rebuilt model gets a fresh export.

infinity's optimum engine optimizes the graph when it loads a model
(ORTOptimizer: level 99, transformer fusions, CPU, fp32) and keeps the
result as ``$HUGGINGFACE_HUB_CACHE/infinity_onnx/CPUExecutionProvider/
<model id>/*_optimized.onnx``, loading that instead on later starts. With
the optimum that installs beside infinity 0.0.78 today (2.x) that step fails
(it passes ``optimize_with_onnxruntime_only``, which 2.x removed) and
infinity silently serves the unoptimized graph. So the same optimization
(2.x's spelling of the same settings) is run here once, into the hub cache
``infinity_cache_dir`` (one per export, so one export's graph is never taken
for another's), where infinity finds it and skips its own attempt: the
server runs the graph its authors meant it to.

infinity's int8 configuration is the same engine on a quantized graph: on a CPU it
prefers an ONNX file whose name holds "quantize" (``onnx/model_quantized.onnx`` in a
hub repository). ``ensure_onnx_int8`` makes one as ``optimum-cli onnxruntime quantize``
does (``ORTQuantizer``, dynamic int8 per channel, the configuration for this CPU's instructions:
AVX512-VNNI, AVX-512, AVX2 or ARM64), from the fp32 export into a directory of its own,
then runs the same level-99 optimization on it (its MatMulInteger pairs fused into
DynamicQuantizeMatMul), which infinity would run itself with a working optimum.
Quantizing the optimized graph instead fails: ONNX Runtime's quantizer cannot infer
the types around the fused contrib ops. Knows nothing about serving.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bench.suite.peer_process import PeerUnavailable, log_tail, run_logged_step
from embedserve.engine.dtype_choice import cpu_capabilities

EXPORT_TIMEOUT_S = 1200.0
ONNX_FILE = "model.onnx"
INT8_FILE = "model_quantized.onnx"          # the name ORTQuantizer writes, and infinity prefers on a CPU
PROVIDER = "CPUExecutionProvider"
# infinity_emb/transformer/utils_optimum.py's optimize_model for a CPU provider, with
# optimum 2.x's name for optimize_with_onnxruntime_only=False.
_OPTIMIZE = """
import sys
from optimum.onnxruntime import ORTModelForFeatureExtraction, ORTOptimizer
from optimum.onnxruntime.configuration import OptimizationConfig
model = ORTModelForFeatureExtraction.from_pretrained(sys.argv[1], file_name=sys.argv[4], provider=sys.argv[3])
config = OptimizationConfig(optimization_level=99, enable_transformers_specific_optimizations=True,
                            optimize_for_gpu=False, fp16=False)
ORTOptimizer.from_pretrained(model).optimize(optimization_config=config, save_dir=sys.argv[2],
                                             one_external_file=True)
"""
# optimum-cli onnxruntime quantize --<isa> --per_channel: dynamic (no calibration), a scale per
# output channel. One scale per tensor (optimum's default) read cosine 0.987 to
# sentence-transformers on the suite's probe, below the 0.99 every fp32 and int8 server is
# held to; per channel 0.995-0.996 (2026-12-07).
_QUANTIZE = """
import sys
from optimum.onnxruntime import ORTQuantizer
from optimum.onnxruntime.configuration import AutoQuantizationConfig
config = getattr(AutoQuantizationConfig, sys.argv[3])(is_static=False, per_channel=True)
ORTQuantizer.from_pretrained(sys.argv[1], file_name="model.onnx").quantize(quantization_config=config,
                                                                           save_dir=sys.argv[2])
"""


def quantization_isa(flags: Mapping[str, Any]) -> str:
    """optimum's ``AutoQuantizationConfig`` for a CPU with these feature flags (as
    ``dtype_choice.cpu_capabilities`` reads them), the best it has."""
    for isa in ("avx512_vnni", "avx512", "avx2"):
        if flags.get(isa if isa != "avx512" else "avx512f"):
            return isa
    return "arm64"


def model_fingerprint(model_dir: Path) -> str:
    """12 hex digits that change when any top-level file of ``model_dir`` changes."""
    digest = hashlib.sha256()
    for path in sorted(p for p in model_dir.iterdir() if p.is_file()):
        stat = path.stat()
        digest.update(f"{path.name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:12]


def export_dir(model_dir: Path, work_dir: Path) -> Path:
    """Where ``model_dir``'s export lives (whether or not it has been made)."""
    return work_dir / "onnx" / f"{model_dir.name}-{model_fingerprint(model_dir)}"


def infinity_cache_dir(export: Path) -> Path:
    """The Hugging Face hub cache infinity keeps ``export``'s optimized graph in."""
    return export.with_name(export.name + ".infinity-hub")


def export_command(optimum_cli: Path, model_dir: Path, out_dir: Path) -> list[str]:
    # feature-extraction with the transformers library: the encoder's last_hidden_state, what
    # infinity pools (left to infer, optimum sees modules.json and exports sentence-transformers'
    # token_embeddings/sentence_embedding outputs instead, which infinity does not read).
    return [str(optimum_cli), "export", "onnx", "--model", str(model_dir), "--task", "feature-extraction",
            "--library-name", "transformers", str(out_dir)]


def optimized_graph(export: Path, onnx_file: str = ONNX_FILE) -> Path:
    """Where infinity looks for the optimized graph of ``export``'s ``onnx_file`` (model id
    ".", run in ``export``): ORTOptimizer names it after the file."""
    return infinity_cache_dir(export) / "infinity_onnx" / PROVIDER / onnx_file.replace(".onnx", "_optimized.onnx")


def ensure_onnx_export(model_dir: Path, work_dir: Path, venv_dir: Path,
                       log: Callable[[str], None]) -> Path:
    """The export directory of ``model_dir``, made and optimized with ``venv_dir``'s optimum on first use."""
    target = export_dir(model_dir, work_dir)
    if (target / ONNX_FILE).is_file() and optimized_graph(target).is_file():
        return target
    optimum_cli = venv_dir / "bin" / "optimum-cli"
    if not optimum_cli.exists():
        raise PeerUnavailable(f"ONNX export: {optimum_cli} is missing (optimum is not installed in {venv_dir})")
    target.parent.mkdir(parents=True, exist_ok=True)
    log_path = target.with_name(target.name + ".log")
    started = time.monotonic()
    if not (target / ONNX_FILE).is_file():
        log(f"ONNX export: {model_dir.name} -> {target} (log: {log_path}); takes a minute or two")
        _made_whole(target, ONNX_FILE, lambda partial: export_command(optimum_cli, model_dir, partial), log_path,
                    f"ONNX export of {model_dir}")
    _optimize(target, ONNX_FILE, venv_dir, log_path, log)
    log(f"ONNX export: done in {time.monotonic() - started:.0f} s")
    return target


def ensure_onnx_int8(model_dir: Path, work_dir: Path, venv_dir: Path, log: Callable[[str], None],
                     isa: str | None = None) -> Path:
    """The directory of ``model_dir``'s int8 graph (``INT8_FILE``), quantized from the fp32
    export for ``isa`` (default: this CPU's, ``quantization_isa``) and optimized, on first use."""
    isa = isa or quantization_isa(cpu_capabilities())
    export = ensure_onnx_export(model_dir, work_dir, venv_dir, log)
    target = export.with_name(f"{export.name}.int8-{isa}")
    if (target / INT8_FILE).is_file() and optimized_graph(target, INT8_FILE).is_file():
        return target
    log_path = target.with_name(target.name + ".log")
    started = time.monotonic()
    if not (target / INT8_FILE).is_file():
        log(f"ONNX int8: quantizing {export} for {isa} (dynamic, per channel) -> {target} (log: {log_path})")
        _made_whole(target, INT8_FILE,
                    lambda partial: [str(venv_dir / "bin" / "python"), "-c", _QUANTIZE, str(export), str(partial), isa],
                    log_path, f"int8 quantization of {export}")
    _optimize(target, INT8_FILE, venv_dir, log_path, log)
    log(f"ONNX int8: done in {time.monotonic() - started:.0f} s")
    return target


def _made_whole(target: Path, expected: str, command: Callable[[Path], list[str]], log_path: Path,
                what: str) -> None:
    """Runs ``command(partial)``, which writes ``target``'s files into ``partial``, and puts
    them in place only once ``expected`` is among them: a killed step is never reused."""
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    run_logged_step(command(partial), log_path, what, EXPORT_TIMEOUT_S)
    if not (partial / expected).is_file():
        raise PeerUnavailable(f"{what} wrote no {expected}; log tail:\n{log_tail(log_path)}")
    partial.rename(target)


def _optimize(target: Path, onnx_file: str, venv_dir: Path, log_path: Path, log: Callable[[str], None]) -> None:
    """infinity's ORT optimization of ``target/onnx_file`` into its hub cache, made whole or not at all."""
    hub = infinity_cache_dir(target)
    partial_hub = hub.with_name(hub.name + ".partial")
    shutil.rmtree(partial_hub, ignore_errors=True)
    shutil.rmtree(hub, ignore_errors=True)
    log(f"ONNX export: optimizing {onnx_file} as infinity does (level 99, transformer fusions) into {hub}")
    save_dir = partial_hub / optimized_graph(target, onnx_file).parent.relative_to(hub)
    run_logged_step([str(venv_dir / "bin" / "python"), "-c", _OPTIMIZE, str(target), str(save_dir), PROVIDER,
                     onnx_file], log_path, f"ORT optimization of {target / onnx_file}", EXPORT_TIMEOUT_S)
    partial_hub.rename(hub)
    if not optimized_graph(target, onnx_file).is_file():
        raise PeerUnavailable(f"ORT optimization of {target} wrote no {optimized_graph(target, onnx_file)}")
