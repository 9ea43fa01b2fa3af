"""The model tier: packed, padding-free encoders returning LazyTensors.

Public surface: ``Engine`` (load a Hugging Face model directory, ``step`` a
packed ``Batch``), ``LazyTensor`` (the result handle), ``ModelInfo``, and the
per-request post-processing in ``embedserve.model.postprocess``.
"""

from embedserve.engine.batch import Batch
from embedserve.engine.engine import Engine
from embedserve.engine.lazy import LazyTensor
from embedserve.model.info import ModelInfo

__all__ = ["Batch", "Engine", "LazyTensor", "ModelInfo"]
