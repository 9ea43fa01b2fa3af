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

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from embedserve.engine.batch import Batch
from embedserve.model.config import ModelConfig, load_model_config
from embedserve.model.info import ModelInfo, read_model_info
from embedserve.engine.families import FAMILIES
from embedserve.engine.modules.bert import EncoderModel
from embedserve.engine.modules.forward import Model
from embedserve.engine.lazy import LazyTensor
from embedserve.engine.onednn import fuse_layers
from embedserve.engine.weights import load_state, read_checkpoint
from embedserve.engine.runners.cpu import CpuRunner
from embedserve.errors import ModelLoadError, Unavailable

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_model(model_dir: Path, dtype: torch.dtype = torch.float32) -> Model:
    """Config + weights -> its family's model in eval mode on the CPU."""
    config = load_model_config(model_dir)
    family = FAMILIES[config.family]
    tensors = read_checkpoint(model_dir)
    with torch.device("meta"):
        model = family.model(config)
    model = model.to_empty(device="cpu")
    load_state(model, family.map_names(tensors))
    return model.to(dtype).eval().requires_grad_(False)


def resolve_dtype(dtype: str | None, device: str) -> str:
    if dtype is None:
        return "bfloat16" if device.startswith("cuda") else "float32"
    if dtype not in DTYPES:
        raise ModelLoadError(f"unsupported dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return dtype


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
             max_graphs: int = 64, cuda_graphs: bool = True,
             fused_layers: bool = True, token_buckets: bool = True) -> "Engine":
        """Load a Hugging Face model directory.

        dtype: "float32" | "bfloat16" | "float16" | None (float32 on CPU, bfloat16
        on CUDA). attention (CPU only): "per_sequence" | "padded" |
        "block_diagonal". max_graphs / cuda_graphs: the CUDA graph cache bound
        and switch (ignored on CPU). fused_layers (CPU only): run the encoder
        layers on oneDNN-packed weights with fused epilogues (onednn.py) where
        the CPU and dtype allow; False keeps the plain modules (benchmarks A/B).
        token_buckets (CPU only): round each step's token count up to a bucket
        (cpu_shapes.py) so that memory stays bounded under mixed shapes; False runs
        exact counts (tests and benchmarks A/B).
        """
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise ModelLoadError(f"model directory not found: {model_dir}")
        dtype_name = resolve_dtype(dtype, device)
        model = build_model(model_dir, DTYPES[dtype_name])
        info = replace(read_model_info(model_dir, model_id), device=device, dtype=dtype_name)
        if device.startswith("cuda"):
            from embedserve.engine.runners.cuda import CudaRunner
            runner: Any = CudaRunner(model.to(device), info, max_graphs=max_graphs,
                                     use_graphs=cuda_graphs)
        elif device == "cpu":
            if fused_layers and isinstance(model, EncoderModel):
                fuse_layers(model)          # the BERT family's oneDNN path; the others run plain modules
            runner = CpuRunner(model, info, attention, token_buckets=token_buckets)
        else:
            raise ModelLoadError(f"unsupported device {device!r}; use 'cpu' or 'cuda[:N]'")
        return cls(model, info, runner)

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    def step(self, batch: Batch) -> LazyTensor:
        """Start one forward pass; returns at once.

        The result is float32 [B, dim] raw pooled vectors (un-normalized) for
        ``task="embed"`` and float32 [B] raw logits for ``task="score"``.
        Invalid batches fail through the returned LazyTensor like any other
        step error; only a closed engine raises here (Unavailable).
        """
        if self._closed:
            raise Unavailable("the engine is closed")
        return self._runner.submit(batch)

    def stats(self) -> dict[str, float]:
        """Counters for metrics: steps, failed_steps, tokens, eager_runs, captures,
        replays, evictions, capture_failures, capture_time_s, graphs, padding_waste
        (the graph counters stay 0 on CPU)."""
        return self._runner.stats()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._runner.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
