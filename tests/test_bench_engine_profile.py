"""bench/engine_profile.py's FLOP model agrees with torch's own FLOP counter.

The profile reports GFLOP/s and fraction of peak per kind of work, so its
FLOP count per step must be right: dense layers against
``torch.utils.flop_counter.FlopCounterMode`` running the plain encoder on a
mixed batch, attention against torch's SDPA formula per sequence (the counter
does not see the CPU flash kernel).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from bench.engine_profile import KINDS, flops
from embedserve.engine.modules.attention import per_sequence
from embedserve.engine.modules.bert import EncoderModel
from embedserve.engine.modules.layout import build_layout
from embedserve.model.config import EncoderConfig


def tiny_encoder() -> EncoderModel:
    config = EncoderConfig(architecture="BertModel", family="bert", task="embed", vocab_size=300,
                           hidden_size=64, num_layers=2, num_heads=4, intermediate_size=256,
                           max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12,
                           hidden_act="gelu", position_offset=0)
    torch.manual_seed(0)
    return EncoderModel(config).eval().requires_grad_(False)


def test_flop_model_matches_torch_flop_counter() -> None:
    model = tiny_encoder()
    config = model.config
    lengths = [5, 17, 40, 1]
    cu_seqlens = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    layout = build_layout(cu_seqlens)
    tokens = int(cu_seqlens[-1])
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        model(torch.randint(0, 300, (tokens,)), torch.from_numpy(layout.offsets),
              torch.zeros(tokens, dtype=torch.long), per_sequence(layout))
    dense_reference = counter.get_total_flops()
    heads, head_dim = config.num_heads, config.head_dim
    attention_reference = config.num_layers * sum(
        sdpa_flop_count((1, heads, n, head_dim), (1, heads, n, head_dim), (1, heads, n, head_dim))
        for n in lengths)

    ours = flops(config, lengths)
    assert ours["dense matmuls"] == dense_reference
    assert ours["attention"] == attention_reference
    assert set(ours) <= set(KINDS.values())        # each rated kind is one the profile sums
