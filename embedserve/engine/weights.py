"""Reading checkpoint files and mapping Hugging Face weight names onto ours.

Owns: finding the weights in a model directory (``model.safetensors``, a
sharded safetensors index, or ``pytorch_model.bin`` through
``torch.load(weights_only=True)`` only), translating HF names
(``bert.encoder.layer.3.attention.self.query.weight``) into modules/bert.py's
(``encoder.layers.3.qkv.weight``, Q/K/V fused) and ModernBERT's
(``layers.3.attn.Wqkv.weight`` -> modules/modernbert.py's ``layers.3.qkv.weight``),
and checking every shape against the config (``load_state``, for every family;
the decoders' names are mapped by decoder_names.py). Every failure is a
ModelLoadError naming the file or key.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from embedserve.errors import ModelLoadError

_LAYER = re.compile(r"^encoder\.layer\.(\d+)\.(.+)$")
# HF layer-relative name -> ours (Q/K/V are fused separately)
_LAYER_NAMES = {
    "attention.output.dense": "attn_out",
    "attention.output.LayerNorm": "attn_norm",
    "intermediate.dense": "ffn_in",
    "output.dense": "ffn_out",
    "output.LayerNorm": "ffn_norm",
}
_EMBEDDING_NAMES = {
    "embeddings.word_embeddings": "encoder.embeddings.word",
    "embeddings.position_embeddings": "encoder.embeddings.position",
    "embeddings.token_type_embeddings": "encoder.embeddings.token_type",
    "embeddings.LayerNorm": "encoder.embeddings.norm",
}
_HEAD_NAMES = {
    "bert": {"pooler.dense": "head.dense", "classifier": "head.out_proj",
             # BertForMaskedLM's head (SPLADE): modules/bert.py's MaskedLMHead
             "cls.predictions.transform.dense": "mlm.dense",
             "cls.predictions.transform.LayerNorm": "mlm.norm",
             "cls.predictions.decoder": "mlm.decoder"},
    "xlm-roberta": {"classifier.dense": "head.dense", "classifier.out_proj": "head.out_proj"},
}

_MODERNBERT_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_MODERNBERT_LAYER_NAMES = {
    "attn_norm": "attn_norm",        # absent in layer 0 (an Identity there)
    "attn.Wqkv": "qkv",
    "attn.Wo": "attn_out",
    "mlp_norm": "mlp_norm",
    "mlp.Wi": "mlp_in",
    "mlp.Wo": "mlp_out",
}
_MODERNBERT_NAMES = {
    "embeddings.tok_embeddings": "embeddings.word",
    "embeddings.norm": "embeddings.norm",
    "final_norm": "final_norm",
}


def read_checkpoint(model_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of a model directory, by their file names."""
    single = model_dir / "model.safetensors"
    index = model_dir / "model.safetensors.index.json"
    legacy = model_dir / "pytorch_model.bin"
    try:
        if single.exists():
            return load_file(str(single))
        if index.exists():
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            tensors: dict[str, torch.Tensor] = {}
            for shard in sorted(set(weight_map.values())):
                tensors.update(load_file(str(model_dir / shard)))
            return tensors
        if legacy.exists():
            # weights_only refuses pickled code: a checkpoint cannot run anything on load.
            return torch.load(str(legacy), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        reason = str(exc).splitlines()[-1].strip() if str(exc) else "unpickling failed"
        raise ModelLoadError(f"cannot read weights in {model_dir}: pytorch_model.bin holds more "
                             f"than tensors ({reason})") from None
    except (OSError, ValueError, KeyError, SafetensorError, RuntimeError) as exc:
        raise ModelLoadError(f"cannot read weights in {model_dir}: {exc}") from None
    raise ModelLoadError(f"no weights in {model_dir}: expected model.safetensors, "
                         "model.safetensors.index.json or pytorch_model.bin")


def _strip_prefix(name: str) -> str:
    for prefix in ("bert.", "roberta.", "model."):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def _rename_param(name: str) -> str:
    # Old TF-converted checkpoints call LayerNorm parameters gamma / beta.
    return name.replace(".gamma", ".weight").replace(".beta", ".bias")


def map_modernbert_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF ModernBertModel names -> ModernBertModel state-dict names (unknown keys,
    e.g. a masked-LM head, dropped)."""
    mapped: dict[str, torch.Tensor] = {}
    for raw_name, tensor in tensors.items():
        stem, _, param = _strip_prefix(raw_name).rpartition(".")
        layer = _MODERNBERT_LAYER.match(stem)
        if layer and layer.group(2) in _MODERNBERT_LAYER_NAMES:
            mapped[f"layers.{layer.group(1)}.{_MODERNBERT_LAYER_NAMES[layer.group(2)]}.{param}"] = tensor
        elif stem in _MODERNBERT_NAMES:
            mapped[f"{_MODERNBERT_NAMES[stem]}.{param}"] = tensor
    return mapped


def map_hf_names(tensors: dict[str, torch.Tensor], family: str) -> dict[str, torch.Tensor]:
    """HF checkpoint names -> EncoderModel state-dict names (unknown keys dropped)."""
    if family == "modernbert":
        return map_modernbert_names(tensors)
    mapped: dict[str, torch.Tensor] = {}
    qkv_parts: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    head_names = _HEAD_NAMES[family]
    for raw_name, tensor in tensors.items():
        name = _rename_param(_strip_prefix(raw_name))
        stem, _, param = name.rpartition(".")
        layer = _LAYER.match(stem)
        if layer:
            index, rest = int(layer.group(1)), layer.group(2)
            if rest.startswith("attention.self."):
                qkv_parts.setdefault((index, param), {})[rest.rsplit(".", 1)[1]] = tensor
            elif rest in _LAYER_NAMES:
                mapped[f"encoder.layers.{index}.{_LAYER_NAMES[rest]}.{param}"] = tensor
        elif stem in _EMBEDDING_NAMES:
            mapped[f"{_EMBEDDING_NAMES[stem]}.{param}"] = tensor
        elif stem in head_names:
            mapped[f"{head_names[stem]}.{param}"] = tensor
    if "cls.predictions.bias" in tensors:
        # The decoder's bias is stored once, as cls.predictions.bias; its weight is tied
        # to the word embeddings and stored only under their name.
        mapped["mlm.decoder.bias"] = tensors["cls.predictions.bias"]
        if "mlm.decoder.weight" not in mapped and "encoder.embeddings.word.weight" in mapped:
            mapped["mlm.decoder.weight"] = mapped["encoder.embeddings.word.weight"]
    for (index, param), parts in qkv_parts.items():
        missing = {"query", "key", "value"} - parts.keys()
        if missing:
            raise ModelLoadError(f"layer {index} lacks attention {param} for {sorted(missing)}")
        mapped[f"encoder.layers.{index}.qkv.{param}"] = torch.cat(
            [parts["query"], parts["key"], parts["value"]], dim=0)
    return mapped


def load_state(model: nn.Module, mapped: dict[str, torch.Tensor]) -> None:
    """Give ``model`` (built on the meta device) the tensors already named as its own;
    every parameter must be present and fit.

    Each parameter is a float32 copy in this process's own memory, made directly
    (``assign``): the meta parameters are never materialized first, whose ``to_empty``
    imports sympy on its first call (~0.6 s of every replica's start), and nothing is
    allocated and filled twice. Copied, not assigned as they come: safetensors' ``load_file``
    returns views of a private mapping of the file, so a model file rewritten in place
    would change the weights under a running replica, or, truncated, crash it (SIGBUS).
    """
    expected = model.state_dict()
    missing = sorted(set(expected) - set(mapped))
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ModelLoadError(f"checkpoint lacks {len(missing)} weights: {shown}")
    for name, target in expected.items():
        source = mapped[name]
        if tuple(source.shape) != tuple(target.shape):
            raise ModelLoadError(f"weight {name} has shape {tuple(source.shape)}, "
                                 f"the config implies {tuple(target.shape)}")
    model.load_state_dict({name: torch.empty(mapped[name].shape, dtype=torch.float32).copy_(mapped[name])
                           for name in expected}, assign=True)
