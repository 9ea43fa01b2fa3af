"""sentence-transformers' Dense modules as one torch module applied after pooling.

Owns building ``DenseProjection`` from model/dense_config.py's specs and loading
each module's weights from its own folder (``linear.weight`` / ``linear.bias`` in
``model.safetensors`` or ``pytorch_model.bin``, read by weights.py). The engine
attaches it to the model as ``model.projection``; modules/forward.py applies it to
pooled vectors (never to reranker logits). Knows nothing about pooling or batching.
"""

from __future__ import annotations

import torch
from torch import nn

from embedserve.engine.weights import read_checkpoint
from embedserve.errors import ModelLoadError
from embedserve.model.dense_config import DenseSpec


class DenseProjection(nn.Module):
    """x -> act_n(linear_n(... act_1(linear_1(x)))); float32 in and out, the
    linears in the model's dtype."""

    def __init__(self, specs: tuple[DenseSpec, ...]) -> None:
        super().__init__()
        self.linears = nn.ModuleList(nn.Linear(s.in_features, s.out_features, bias=s.bias) for s in specs)
        self.tanh = [spec.activation == "tanh" for spec in specs]

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        # pooled: float32 [R, in] -> float32 [R, out]
        first: nn.Linear = self.linears[0]  # type: ignore[assignment]
        x = pooled.to(first.weight.dtype)
        for linear, tanh in zip(self.linears, self.tanh):
            x = linear(x)
            if tanh:
                x = torch.tanh(x)
        return x.float()


def load_dense(specs: tuple[DenseSpec, ...]) -> DenseProjection:
    """The Dense modules with their weights, float32 on the CPU."""
    projection = DenseProjection(specs)
    for linear, spec in zip(projection.linears, specs):
        tensors = read_checkpoint(spec.path)
        state = {name.removeprefix("linear."): tensor for name, tensor in tensors.items()}
        expected = dict(linear.state_dict())
        for name, target in expected.items():
            if name not in state:
                raise ModelLoadError(f"{spec.path}: lacks linear.{name}")
            if tuple(state[name].shape) != tuple(target.shape):
                raise ModelLoadError(f"{spec.path}: linear.{name} has shape {tuple(state[name].shape)}, "
                                     f"its config implies {tuple(target.shape)}")
        linear.load_state_dict({name: state[name].float() for name in expected})
    return projection.eval().requires_grad_(False)
