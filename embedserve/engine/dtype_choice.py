"""``--dtype auto``: which compute dtype a model runs in, checked by an accuracy probe.

Owns three things and nothing else:

- the hardware rule: on CUDA, bfloat16 where the device computes in it (compute
  capability 8.0 and later: Ampere, Hopper), else float16; on a CPU, bfloat16 where it has native
  bf16 arithmetic (AMX-BF16 or AVX512-BF16; ``torch.cpu.get_capabilities()``,
  else the ``/proc/cpuinfo`` flags), float32 elsewhere. Without native bf16
  oneDNN emulates it on AVX-512 and it is slower than float32, so auto never
  picks it there; ARM's BF16 extensions are not considered (not measured);
- the probe verdict: the candidate's outputs on a fixed token batch against
  float32's. Embeddings: the smallest cosine over the rows must reach
  ``min_cosine`` (0.9999 by default). Scores (cross-encoders): the largest
  ``|sigmoid(candidate) - sigmoid(float32)|`` must stay within
  ``sqrt(2 * (1 - min_cosine))`` (0.0141 at 0.9999): two unit vectors at that
  cosine are that far apart, so a score may move on the [0, 1] relevance scale
  as far as an embedding may move on the unit sphere, and one setting governs
  both (``min_cosine = 1`` demands identical outputs, i.e. float32);
- the reason string ``/info`` and the log carry (``DtypeChoice.reason``).

How the two models are built and run is ``engine.py``'s; this module sees arrays.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from embedserve.model.probe_texts import DEFAULT_PROBE_MIN_COSINE
from embedserve.ragged import RaggedBatch

AUTO = "auto"
# The CPU features that give bf16 matmuls native speed, best first.
NATIVE_BF16_FEATURES = ("amx_bf16", "avx512_bf16")
_CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype a model runs in and why (``/info``'s ``dtype`` and ``dtype_reason``)."""

    dtype: str
    reason: str


@dataclass(frozen=True)
class DtypeProbe:
    """What ``auto`` checks a reduced precision with.

    ``tokens`` is called only when a probe runs (so a float32 choice never
    loads a tokenizer); ``min_cosine`` in [0, 1] is the bar described above.
    ``calibration``: the calibration texts' tokens, which ``int8`` measures its
    static activation ranges on (called only for int8; None: dynamic activations).
    """

    tokens: Callable[[], RaggedBatch]
    min_cosine: float = DEFAULT_PROBE_MIN_COSINE
    calibration: Callable[[], RaggedBatch] | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_cosine <= 1.0:
            raise ValueError(f"the probe's min cosine must be in [0, 1], got {self.min_cosine}")


def cpu_capabilities() -> Mapping[str, Any]:
    """The CPU's feature flags: torch's reading (``torch.cpu.get_capabilities``, in recent
    releases), else /proc/cpuinfo's."""
    read = getattr(torch.cpu, "get_capabilities", None)
    if read is not None:
        return read()
    try:
        return cpuinfo_capabilities(_CPUINFO.read_text())
    except OSError:
        return {}


def cpuinfo_capabilities(cpuinfo: str) -> Mapping[str, bool]:
    """The first processor's flags in /proc/cpuinfo's text (x86 ``flags``, ARM ``Features``),
    under the names torch uses for the bf16 ones (``amx_bf16``, ``avx512_bf16``)."""
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                  if line.startswith(("flags", "Features"))), [])
    return {flag: True for flag in flags}


def native_bf16_feature(capabilities: Mapping[str, Any]) -> str | None:
    """The first of ``NATIVE_BF16_FEATURES`` the CPU has, or None."""
    return next((name for name in NATIVE_BF16_FEATURES if capabilities.get(name)), None)


def cuda_half_dtype(capability: tuple[int, int]) -> str:
    """The 16-bit dtype a CUDA device of compute ``capability`` runs natively: bfloat16
    from 8.0 (Ampere) on; before that torch emulates bf16 matmuls or refuses them, and
    float16 has tensor cores since 7.0."""
    return "bfloat16" if capability >= (8, 0) else "float16"


def auto_candidate(device: str, capabilities: Mapping[str, Any] | None = None,
                   cuda_capability: tuple[int, int] | None = None) -> DtypeChoice:
    """What ``auto`` tries on ``device`` before the probe, with the hardware reason.
    ``cuda_capability``: the device's compute capability (None: bfloat16, as on
    every GPU this project targets)."""
    if device.startswith("cuda"):
        if cuda_capability is None:
            return DtypeChoice("bfloat16", "auto: cuda")
        name = cuda_half_dtype(cuda_capability)
        major, minor = cuda_capability
        return DtypeChoice(name, f"auto: cuda compute capability {major}.{minor}")
    feature = native_bf16_feature(cpu_capabilities() if capabilities is None else capabilities)
    if feature is None:
        return DtypeChoice("float32", f"auto: cpu has no native bf16 "
                                      f"({' or '.join(NATIVE_BF16_FEATURES)})")
    return DtypeChoice("bfloat16", f"auto: cpu has {feature}")


def score_bound(min_cosine: float) -> float:
    """The largest |Δ sigmoid| a cross-encoder's probe allows at ``min_cosine`` (see above)."""
    return math.sqrt(2.0 * (1.0 - min_cosine))


def probe_verdict(candidate: DtypeChoice, reference: np.ndarray, outputs: np.ndarray,
                  min_cosine: float) -> DtypeChoice:
    """``candidate`` kept when ``outputs`` (its dtype) agree with ``reference`` (float32),
    else float32; either way the reason says what the probe measured.

    ``reference``/``outputs``: float32 [B, dim] pooled vectors or [B] logits.
    """
    reference = np.asarray(reference, dtype=np.float64)
    outputs = np.asarray(outputs, dtype=np.float64)
    if reference.ndim == 1:
        worst = float(np.max(np.abs(_sigmoid(outputs) - _sigmoid(reference))))
        bound = score_bound(min_cosine)
        kept = worst <= bound
        measured = (f"probe max |d sigmoid| {worst:.5f} {'<=' if kept else '>'} {bound:.5f} "
                    f"(min cosine {min_cosine:g})")
    else:
        worst = float(np.min(_row_cosines(reference, outputs)))
        kept = worst >= min_cosine
        measured = f"probe min cosine {_floor(worst)} {'>=' if kept else '<'} {min_cosine:g}"
    if kept:
        return DtypeChoice(candidate.dtype, f"{candidate.reason}; {measured}")
    return DtypeChoice("float32", f"{candidate.reason}, but {candidate.dtype} {measured}: float32")


def _row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.sum(a * b, axis=1) / np.maximum(norms, 1e-30)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _floor(value: float, digits: int = 6) -> str:
    # Rounded down, so a cosine just below the bar never prints as the bar itself.
    return f"{math.floor(value * 10 ** digits) / 10 ** digits:.{digits}f}"
