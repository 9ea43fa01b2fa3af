"""The oneDNN fused layers compute what encoder.Layer computes.

Fast path vs slow path on the same random weights: ``FusedLayer`` (packed
weights, GELU / ReLU in the matmul epilogue, residual added in place) against
the plain ``Layer`` it replaced, for every activation the encoder family
uses, in float32 (tight) and bfloat16 (cosine). The engine parity tests
(test_engine_parity.py, test_engine_default_model.py) run the fused path too,
against transformers and sentence-transformers; this file pins down that the
path they ran is the fused one.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from embedserve.engine import Batch, Engine
from embedserve.engine.modules.attention import per_sequence
from embedserve.engine.modules.bert import EncoderModel
from embedserve.engine.modules.layout import build_layout
from embedserve.engine.onednn import FusedLayer, fuse_layers, supported
from embedserve.model.config import EncoderConfig

pytestmark = pytest.mark.skipif(not supported(torch.float32), reason="torch built without oneDNN")


def random_model(hidden_act: str, seed: int = 0) -> EncoderModel:
    config = EncoderConfig(architecture="BertModel", family="bert", task="embed", vocab_size=300,
                           hidden_size=64, num_layers=2, num_heads=4, intermediate_size=256,
                           max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12,
                           hidden_act=hidden_act, position_offset=0)
    torch.manual_seed(seed)
    model = EncoderModel(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.2)     # large enough that every activation's shape matters
    return model.eval().requires_grad_(False)


def hidden_states(model: EncoderModel, lengths: list[int]) -> torch.Tensor:
    cu_seqlens = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    layout = build_layout(cu_seqlens)
    ids = torch.from_numpy(np.random.default_rng(1).integers(0, 300, int(cu_seqlens[-1])))
    positions = torch.from_numpy(layout.offsets)
    with torch.inference_mode():
        return model(ids, positions, torch.zeros_like(ids), per_sequence(layout)).float()


@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_new", "relu"])
def test_fused_layers_match_plain_layers_in_float32(hidden_act: str) -> None:
    plain = random_model(hidden_act)
    fused = copy.deepcopy(plain)
    assert fuse_layers(fused)
    assert all(isinstance(layer, FusedLayer) for layer in fused.encoder.layers)
    lengths = [1, 7, 130, 300]
    expected, ours = hidden_states(plain, lengths), hidden_states(fused, lengths)
    assert expected.abs().max() > 0.5
    assert (ours - expected).abs().max() <= 1e-5


@pytest.mark.skipif(not supported(torch.bfloat16), reason="no oneDNN bfloat16 on this CPU")
def test_fused_layers_match_plain_layers_in_bfloat16() -> None:
    plain = random_model("gelu").to(torch.bfloat16)
    fused = copy.deepcopy(plain)
    assert fuse_layers(fused)
    expected, ours = hidden_states(plain, [5, 64, 200]), hidden_states(fused, [5, 64, 200])
    cosine = torch.nn.functional.cosine_similarity(ours, expected, dim=1)
    assert cosine.min() >= 0.999, cosine.min()


def test_engine_uses_fused_layers_on_cpu_unless_told_not_to(tiny_bert_dir) -> None:
    sequences = [np.arange(4, 4 + n, dtype=np.int32) for n in (3, 40, 200)]
    with Engine.load(tiny_bert_dir) as fused, Engine.load(tiny_bert_dir, fused_layers=False) as plain:
        assert all(isinstance(layer, FusedLayer) for layer in fused.model.encoder.layers)
        assert not any(isinstance(layer, FusedLayer) for layer in plain.model.encoder.layers)
        ours = fused.step(Batch.from_sequences(sequences)).wait()
        expected = plain.step(Batch.from_sequences(sequences)).wait()
    assert np.abs(ours - expected).max() <= 1e-5


def test_unsupported_dtype_is_left_unchanged() -> None:
    model = random_model("gelu").to(torch.float16)
    layers = list(model.encoder.layers)
    assert not supported(torch.float16)
    assert not fuse_layers(model)
    assert list(model.encoder.layers) == layers
