"""Engine: load a model directory, run packed batches, hand back LazyTensors.

Owns the model's lifetime and the non-blocking ``step`` contract. On CPU a
single worker thread runs steps in submission order (several may be queued);
on CUDA the CudaRunner enqueues work on a stream and replays CUDA graphs.
Errors inside a step (bad ids, a failing kernel) resolve that step's
LazyTensor with the exception; the engine keeps serving later steps.

    eng = Engine.load(model_dir, device="cpu")
    out = eng.step(Batch.from_sequences([[0, 35378, 2]])).wait()   # float32 [1, dim]
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from embedserve.engine import heap, int8_layers
from embedserve.engine.batch import Batch
from embedserve.engine.dense import load_dense
from embedserve.engine.dtype_choice import AUTO, DtypeChoice, DtypeProbe, auto_candidate, cuda_half_dtype, probe_verdict
from embedserve.engine.families import FAMILIES
from embedserve.engine.gemma3_fused import pack_gemma3_linears
from embedserve.engine.lazy import LazyTensor
from embedserve.engine.modules.bert import EncoderModel
from embedserve.engine.modules.forward import Model
from embedserve.engine.modules.gemma3 import Gemma3Model
from embedserve.engine.modules.nomic_bert import NomicBertModel
from embedserve.engine.nomic_bert_fused import fuse_nomic_layers
from embedserve.engine.onednn import fuse_layers
from embedserve.engine.runners.cpu import CpuRunner
from embedserve.engine.weights import load_state, read_checkpoint
from embedserve.errors import ModelLoadError, Unavailable
from embedserve.model.config import ModelConfig, load_model_config, load_sentence_transformer_meta
from embedserve.model.cuda_options import CudaOptions
from embedserve.model.info import ModelInfo, read_model_info

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# int8 linears over a bf16 or float32 model (int8_layers.py): CPU only.
INT8 = "int8"


def build_model(model_dir: Path, dtype: torch.dtype = torch.float32) -> Model:
    """Config + weights -> its family's model in eval mode on the CPU."""
    config = load_model_config(model_dir)
    family = FAMILIES[config.family]
    tensors = read_checkpoint(model_dir)
    with torch.device("meta"):
        model = family.model(config)
    mapped = family.map_names(tensors)
    if family.complete is not None:
        mapped = family.complete(config, tensors, mapped)
    load_state(model, mapped)  # the meta tensors become copies of the checkpoint's
    dense = load_sentence_transformer_meta(model_dir, config).dense
    if dense:
        model.projection = load_dense(dense)      # sentence-transformers' Dense modules, after pooling
    return model.to(dtype).eval().requires_grad_(False)  # type: ignore[return-value]  # the same model


def cuda_capability(device: str) -> tuple[int, int] | None:
    """``device``'s compute capability, or None on the CPU."""
    if not device.startswith("cuda"):
        return None
    return tuple(torch.cuda.get_device_capability(torch.device(device)))  # type: ignore[return-value]


def resolve_dtype(dtype: str | None, device: str,
                  capability: tuple[int, int] | None = None) -> str:
    """An explicit dtype as it is, checked; None: the device's static default (float32 on
    CPU; on CUDA bfloat16, or float16 on a device of ``capability`` before 8.0).
    ``auto`` is resolved by ``Engine.load`` (it may probe)."""
    if dtype is None:
        if not device.startswith("cuda"):
            return "float32"
        return cuda_half_dtype(capability) if capability is not None else "bfloat16"
    if dtype == INT8:
        check_int8(device)
        return dtype
    if dtype not in DTYPES:
        raise ModelLoadError(f"unsupported dtype {dtype!r}; choose one of {AUTO}, {', '.join(DTYPES)}, {INT8}")
    return dtype


def check_int8(device: str) -> None:
    """Raise a one-line ModelLoadError where ``--dtype int8`` cannot run."""
    if device.startswith("cuda"):
        raise ModelLoadError("--dtype int8 runs on CPU only (oneDNN's int8 matmuls); "
                             "on CUDA use bfloat16 or float16")
    if not int8_layers.supported():
        raise ModelLoadError("--dtype int8 needs a torch build with oneDNN's quantized linear "
                             "(torch.ops.onednn.qlinear_pointwise)")


class Engine:
    """A loaded model and the machinery that runs its steps."""

    def __init__(self, model: Model, info: ModelInfo, runner: Any) -> None:
        self.model = model
        self.info = info
        self._runner = runner
        self._closed = False

    @classmethod
    def load(cls, model_dir: str | Path, device: str = "cpu", dtype: str | None = None,
             attention: str | None = None, model_id: str | None = None,
             cuda_graphs: bool = True, cuda: CudaOptions | None = None,
             fused_layers: bool = True, token_buckets: bool = True, native_linears: bool = True,
             probe: DtypeProbe | None = None, small_steps: bool = True,
             cpu_lanes: int | None = None, cpu_lane_nice: int = 0,
             small_step_threads: int | None = None, small_step_helper: bool = True) -> Engine:
        """Load a Hugging Face model directory.

        dtype: "auto" | "float32" | "bfloat16" | "float16" | "int8" | None (float32 on CPU,
        bfloat16 on CUDA). "int8" (CPU only): int8_layers.py, calibrated on
        ``probe.calibration`` where given (else dynamic activations); auto never picks it.
        "auto" picks by hardware (dtype_choice.py) and, when
        that is a reduced precision and ``probe`` is given, keeps it only if its
        outputs on the probe's tokens agree with float32's; ``info.dtype`` and
        ``info.dtype_reason`` say what was chosen and why. attention (CPU only):
        "per_sequence" | "per_sequence_sdpa" | "padded" | "block_diagonal". cuda_graphs:
        the CUDA graph switch; cuda: the CUDA runner's other options (ignored on CPU). fused_layers (CPU
        only): run the encoder layers on oneDNN-packed weights with fused
        epilogues (onednn.py) where the CPU and dtype allow; False keeps the
        plain modules (benchmarks A/B). token_buckets (CPU only): round each
        step's token count up to a bucket (cpu_shapes.py) so that memory stays
        bounded under mixed shapes (steps of up to 64 tokens run exact counts
        where every linear runs on a native kernel); False runs exact counts
        (tests and benchmarks A/B). native_linears (CPU only): the fused layers'
        linears run on a native kernel where one covers them (float32 on CPUs without
        AVX-512: avx2_linear.py; bf16 on AVX512-BF16 CPUs without AMX: bf16_linear.py);
        False keeps oneDNN (benchmarks A/B). small_steps (CPU only): steps of few tokens
        on the fused bf16 encoder run as one flat loop over the kernels (small_steps.py);
        False runs them through the modules (benchmarks A/B). cpu_lanes (CPU only): how
        many steps are computed side by side, sharing the cores (runners/thread_share.py);
        None: 2 where torch has 2 threads or more, else 1. cpu_lane_nice (CPU only): the
        lanes' threads run this much nicer than the process (a replica's: batch steps).
        small_step_threads (CPU only): the threads the flat loop's steps run on (None:
        the step's share of the cores, as every step's). small_step_helper (CPU only): with
        ``small_step_threads=1``, a step alone on two or more cores runs bf16_linear's
        linears on its thread and the kernel's helper thread (csrc/helper_team.h); False
        keeps them on the one thread (benchmarks A/B).
        """
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise ModelLoadError(f"model directory not found: {model_dir}")
        if device != "cpu" and not device.startswith("cuda"):
            raise ModelLoadError(f"unsupported device {device!r}; use 'cpu' or 'cuda[:N]'")
        if dtype == INT8:
            check_int8(device)      # before anything asks CUDA about the device
        info = replace(read_model_info(model_dir, model_id), device=device)
        if info.task == "multivector":
            if device != "cpu":
                raise ModelLoadError("a multi-vector (ColBERT) model runs on the CPU only so far; "
                                     "serve it with --device cpu")
            if dtype == AUTO:
                dtype = None   # the probe compares pooled rows; token rows are not probed yet
        runner_options: dict[str, Any] = {"attention": attention,
                          "cuda_graphs": cuda_graphs, "cuda": cuda or CudaOptions(), "fused_layers": fused_layers,
                          "token_buckets": token_buckets, "native_linears": native_linears,
                          "small_steps": small_steps, "cpu_lanes": cpu_lanes,
                          "cpu_lane_nice": cpu_lane_nice, "small_step_threads": small_step_threads,
                          "small_step_helper": small_step_helper}
        capability = cuda_capability(device)
        if dtype == AUTO:
            choice = auto_candidate(device, cuda_capability=capability)
            if choice.dtype != "float32" and probe is not None:
                return cls._load_probed(model_dir, info, choice, probe, runner_options)
            if choice.dtype != "float32":
                choice = DtypeChoice(choice.dtype, f"{choice.reason}; not probed")
        else:
            name = resolve_dtype(dtype, device, capability)
            choice = DtypeChoice(name, "explicit" if dtype is not None else "device default")
        if choice.dtype == INT8:
            return cls._load_int8(model_dir, info, choice, probe, runner_options)
        log.info("dtype %s (%s)", choice.dtype, choice.reason)
        model = build_model(model_dir, DTYPES[choice.dtype])
        return cls._start(model, _chosen(info, choice), **runner_options)

    @classmethod
    def _load_int8(cls, model_dir: Path, info: ModelInfo, choice: DtypeChoice, probe: DtypeProbe | None,
                   runner_options: dict[str, Any]) -> Engine:
        """``int8``: the encoder's or decoder's layers' linears on int8 weights
        (int8_layers.py), the rest in bf16 where the CPU runs it natively, else float32.
        Static activation ranges are measured on ``probe.calibration`` (float32, plain
        modules) where it is given; without them activations are quantized per call
        (dynamic). A model family with no int8 layers runs in the base dtype, and
        the reason says so."""
        base = int8_layers.base_dtype()
        base_name = "bfloat16" if base == torch.bfloat16 else "float32"
        model = build_model(model_dir, torch.float32)
        if int8_layers.quantizable_layers(model) is None:
            choice = DtypeChoice(base_name, f"{choice.reason} int8, but this model family has no int8 "
                                            f"layers: {base_name}")
            log.warning("dtype %s (%s)", choice.dtype, choice.reason)
            return cls._start(model.to(base), _chosen(info, choice), **runner_options)
        ranges = None
        calibration = probe.calibration if probe is not None else None
        if calibration is not None:
            plain = {**runner_options, "cuda_graphs": False, "fused_layers": False}
            with cls._start(model, _chosen(info, DtypeChoice("float32", "calibration")), **plain) as ref:
                batch = Batch.of(calibration(), info.task)  # type: ignore[arg-type]  # task: checked at load
                ranges = int8_layers.observe_ranges(model, lambda: ref.step(batch).wait())
        if isinstance(model, EncoderModel):
            int8_layers.quantize_layers(model.to(base), ranges)
        else:
            int8_layers.quantize_decoder_layers(model.to(base), ranges)
        activations = "dynamic" if ranges is None else f"static, {batch.num_sequences} calibration texts"
        if any(getattr(module, "per_row", False) for module in model.modules()):
            activations += "; the second feed-forward linear's per row"
        if int8_layers.int8_attention_runs(model.modules()):
            activations += "; attention's products int8"
        choice = DtypeChoice(INT8, f"{choice.reason}: int8 weights per channel, uint8 activations "
                                   f"({activations}), {base_name} elsewhere")
        log.info("dtype %s (%s)", choice.dtype, choice.reason)
        heap.return_freed_heap()
        return cls._start(model, _chosen(info, choice), **{**runner_options, "fused_layers": False})

    @classmethod
    def _load_probed(cls, model_dir: Path, info: ModelInfo, candidate: DtypeChoice,
                     probe: DtypeProbe, runner_options: dict[str, Any]) -> Engine:
        """``auto`` with a reduced-precision candidate: float32's outputs on the probe's
        tokens (plain modules), then the same weights cast in place to the candidate and
        started as they will serve; kept if the two agree, else reloaded in float32. Only
        one copy of the weights is resident at a time (the cast frees each float32
        tensor as it goes). A probe that cannot run (no usable tokenizer) or fails in
        the candidate dtype also means float32, with the error as the reason."""
        model = build_model(model_dir, torch.float32)
        plain = {**runner_options, "cuda_graphs": False, "fused_layers": False}
        try:
            batch = Batch.of(probe.tokens(), info.task)  # type: ignore[arg-type]  # a Task: checked at load
            with cls._start(model, _chosen(info, DtypeChoice("float32", "probe")), **plain) as ref:
                reference = ref.step(batch).wait()
        except Exception as error:
            choice = DtypeChoice("float32", f"{candidate.reason}, but the probe could not run "
                                            f"({error}): float32")
            log.warning("dtype %s (%s)", choice.dtype, choice.reason)
            return cls._start(model, _chosen(info, choice), **runner_options)
        model = model.to(DTYPES[candidate.dtype])
        engine = cls._start(model, _chosen(info, candidate), **runner_options)
        try:
            choice = probe_verdict(candidate, reference, engine.step(batch).wait(), probe.min_cosine)
        except Exception as error:
            choice = DtypeChoice("float32", f"{candidate.reason}, but {candidate.dtype} failed "
                                            f"the probe ({error}): float32")
        if choice.dtype == candidate.dtype:
            log.info("dtype %s (%s)", choice.dtype, choice.reason)
            engine.info = _chosen(info, choice)
        else:
            log.warning("dtype %s (%s)", choice.dtype, choice.reason)
            engine.close()
            del engine, model
            engine = cls._start(build_model(model_dir, torch.float32), _chosen(info, choice),
                                **runner_options)
        heap.return_freed_heap()
        return engine

    @classmethod
    def _start(cls, model: Model, info: ModelInfo, attention: str | None, cuda_graphs: bool,
               cuda: CudaOptions, fused_layers: bool, token_buckets: bool,
               native_linears: bool, small_steps: bool = True, cpu_lanes: int | None = None,
               cpu_lane_nice: int = 0, small_step_threads: int | None = None,
               small_step_helper: bool = True) -> Engine:
        """A built model (on the CPU, in its dtype) started on ``info.device``'s runner."""
        device = info.device or "cpu"
        if device.startswith("cuda"):
            from embedserve.engine.runners.cuda import CudaRunner
            runner: Any = CudaRunner(model.to(device), info, cuda, use_graphs=cuda_graphs)
        else:
            if fused_layers and isinstance(model, EncoderModel):
                fuse_layers(model, native_linears)   # the BERT family's fast path (MPNet, DeBERTa ... too)
            elif fused_layers and isinstance(model, NomicBertModel):
                fuse_nomic_layers(model, native_linears)
            elif fused_layers and isinstance(model, Gemma3Model):
                pack_gemma3_linears(model, native_linears)   # the others run plain modules
            runner = CpuRunner(model, info, attention, token_buckets=token_buckets, small_steps=small_steps,
                               lanes=cpu_lanes, lane_nice=cpu_lane_nice, small_step_threads=small_step_threads,
                               small_step_helper=small_step_helper)
        return cls(model, info, runner)

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    @property
    def preempts_steps(self) -> bool:
        """Whether ``step(batch, preempt=True)`` runs ``batch`` at the next layer boundary
        of the step being computed (CPU: runners/preemption.py), not after it (CUDA)."""
        return bool(self._runner.preempts_steps)

    def step(self, batch: Batch, inline: bool = False, preempt: bool = False) -> LazyTensor:
        """Start one forward pass; returns at once. ``inline`` (CPU): compute it on the
        calling thread, after the steps already queued, and return it finished
        (runners/cpu.py says when that is faster); ignored on CUDA, whose steps are
        asynchronous anyway. ``preempt``: an urgent step, run between two layers of the
        step being computed, which then resumes (where ``preempts_steps``; else ignored).

        The result is float32 [B, dim] raw pooled vectors (un-normalized) for
        ``task="embed"`` and float32 [B] raw logits for ``task="score"``.
        Invalid batches fail through the returned LazyTensor like any other
        step error; only a closed engine raises here (Unavailable).
        """
        if self._closed:
            raise Unavailable("the engine is closed")
        return self._runner.submit(batch, inline, preempt)

    def stats(self) -> dict[str, float]:
        """Counters for metrics: steps, failed_steps, tokens, eager_runs, captures,
        replays, evictions, capture_failures, capture_time_s, graphs, padding_waste
        (the graph counters stay 0 on CPU)."""
        return self._runner.stats()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._runner.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _chosen(info: ModelInfo, choice: DtypeChoice) -> ModelInfo:
    return replace(info, dtype=choice.dtype, dtype_reason=choice.reason)
