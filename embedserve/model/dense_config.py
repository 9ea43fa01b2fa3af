"""The sentence-transformers ``Dense`` modules of a model directory (2_Dense, 3_Dense ...).

Owns reading, from ``modules.json``, each ``sentence_transformers.models.Dense`` entry
in pipeline order with its ``config.json`` (in / out features, bias, activation) into
frozen ``DenseSpec`` records. A Dense module maps the pooled vector, before any
Normalize: ``activation(linear(x))`` (EmbeddingGemma has two, 768 -> 3072 -> 768,
without activation). Knows nothing about weights or execution: engine/dense.py
builds and loads them. Activations other than Identity and Tanh are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from embedserve.errors import ModelLoadError

# sentence-transformers' activation_function strings -> ours
ACTIVATIONS = {"torch.nn.modules.linear.Identity": "identity", "torch.nn.modules.activation.Tanh": "tanh"}
_DEFAULT_ACTIVATION = "torch.nn.modules.activation.Tanh"      # Dense's own default


@dataclass(frozen=True)
class DenseSpec:
    path: Path                        # the module's folder (its weights are read from there)
    in_features: int
    out_features: int
    bias: bool
    activation: str                   # "identity" or "tanh"


def read_dense_modules(model_dir: Path, modules: list[dict[str, Any]], read_json: Any) -> tuple[DenseSpec, ...]:
    """The Dense entries of an already-read ``modules.json``, in order, each checked to
    take the previous one's width."""
    specs: list[DenseSpec] = []
    for module in modules:
        if not str(module.get("type", "")).endswith("Dense"):
            continue
        folder = model_dir / str(module.get("path", ""))
        raw = read_json(folder / "config.json")
        if raw.get("use_residual"):
            raise ModelLoadError(f"{folder}/config.json: a PyLate Dense with use_residual is not supported")
        activation = str(raw.get("activation_function") or _DEFAULT_ACTIVATION)
        if activation not in ACTIVATIONS:
            raise ModelLoadError(f"{folder}/config.json: unsupported activation_function {activation!r}; "
                                 f"supported: {', '.join(ACTIVATIONS)}")
        try:
            spec = DenseSpec(folder, int(raw["in_features"]), int(raw["out_features"]),
                             bool(raw.get("bias", True)), ACTIVATIONS[activation])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{folder}/config.json: bad or missing field {exc}") from None
        if specs and spec.in_features != specs[-1].out_features:
            raise ModelLoadError(f"{folder}: takes {spec.in_features} features but the module before "
                                 f"it gives {specs[-1].out_features}")
        specs.append(spec)
    return tuple(specs)
