"""The model tier: packed, padding-free encoders returning LazyTensors.

Public surface: ``Engine`` (load a Hugging Face model directory, ``step`` a
packed ``Batch``), ``LazyTensor`` (the result handle), ``ModelInfo``, and the
per-request post-processing in ``embedserve.model.postprocess``.
"""

from embedserve.engine.batch import Batch
from embedserve.engine.engine import Engine
from embedserve.engine.lazy import LazyTensor
from embedserve.engine.mkl_sums import keep_mkl_sums_reproducible
from embedserve.model.info import ModelInfo

# Before the process's first float32 matmul where it can (mkl_sums.py says why).
keep_mkl_sums_reproducible()

__all__ = ["Batch", "Engine", "LazyTensor", "ModelInfo"]
