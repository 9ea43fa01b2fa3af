"""The attention kernel's int8 products (csrc/attention_int8.h, --dtype int8's layers).

References: the quantization the kernel documents, written here in torch from its
definition (a query row int8 at its own scale; the keys centred on their mean per dim,
then int8 at one scale; probabilities round(255 exp(score - max)); V int8 at one scale
per dim; P V divided by the sum of the rounded probabilities), and float32 SDPA, the exact
result it approximates. Then the engine: an int8 model's layers ask for it and a bf16
model's never do (the flat loop of short steps against the general path, int8 products in
both: tests/test_engine_small_steps.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from embedserve.engine.modules import bf16_attention
from tests.test_engine_bf16_attention import LENGTHS, bounds, packed_qkv, sdpa_per_sequence

HEADS = 12


@pytest.fixture
def int8_products() -> None:
    if not bf16_attention.int8_products_available():
        pytest.skip("no int8 attention products here: the kernel is not built, runs on AMX tiles, or the CPU "
                    "lacks AVX512-VNNI")


def int8_output(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    starts, lengths_tensor = bounds(lengths)
    return bf16_attention.attend_sequences(q, k, v, starts, lengths_tensor, quantized=True)


def by_definition(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """The documented quantization, per sequence and head, in float64 where it is not integer."""
    out = torch.empty(q.shape, dtype=torch.float64)
    start = 0
    for length in lengths:
        rows = slice(start, start + length)
        qs, ks, vs = (t[rows].float().transpose(0, 1) for t in (q, k, v))          # [heads, L, hd]
        q_top = qs.abs().amax(-1, keepdim=True)
        q8 = torch.round(qs * torch.where(q_top > 0, 127 / q_top, 0))
        centred = ks - ks.mean(1, keepdim=True)
        k_top = centred.abs().amax((1, 2), keepdim=True)
        k8 = torch.round(centred * torch.where(k_top > 0, 127 / k_top, 0))
        scores = (q8.double() @ k8.double().transpose(1, 2)) * (q_top.double() / 127) * (k_top.double() / 127)
        scores = scores * q.shape[-1] ** -0.5
        p = torch.round(255 * torch.exp(scores - scores.amax(-1, keepdim=True)))
        v_top = vs.abs().amax(1, keepdim=True)
        v8 = torch.round(vs * torch.where(v_top > 0, 127 / v_top, 0))
        context = (p @ v8.double()) * (v_top.double() / 127) / p.sum(-1, keepdim=True)
        out[rows] = context.transpose(0, 1)
        start += length
    return out


@pytest.mark.parametrize("head_dim", [32, 64])
@pytest.mark.parametrize("lengths", LENGTHS, ids=lambda lengths: "-".join(map(str, lengths)))
def test_int8_products_compute_their_definition(int8_products: None, head_dim: int, lengths: list[int]) -> None:
    """Sequences of quantize_min_length() tokens or more: the definition; shorter ones in the
    same call: the bf16 products' bits."""
    q, k, v = packed_qkv(lengths, head_dim)
    got = int8_output(q, k, v, lengths).double()
    starts, lengths_tensor = bounds(lengths)
    plain = bf16_attention.attend_sequences(q, k, v, starts, lengths_tensor).double()
    expected = by_definition(q, k, v, lengths)
    exact = sdpa_per_sequence(q, k, v, lengths, torch.float32).double()
    scale = v.float().abs().amax().item()
    shortest = bf16_attention.quantize_min_length()
    for start, length in zip(starts.tolist(), lengths):
        rows = slice(start, start + length)
        if length < shortest:
            assert torch.equal(got[rows], plain[rows]), length
            continue
        # left: the output's bf16 rounding, a probability whose 255 x lands on .5 rounded
        # the other way (the kernel's 2^x is a polynomial), a key's mean summed in another order
        error = (got[rows] - expected[rows]).abs()
        assert error.max().item() <= 0.01 * scale, (length, error.max().item())
        assert error.mean().item() <= 0.001 * scale, (length, error.mean().item())
        # and int8's answer, not the exact one: its own error against float32 is larger
        assert (got[rows] - exact[rows]).abs().max().item() > 4 * error.max().item() > 0, length


@pytest.mark.parametrize("head_dim", [32, 64])
def test_int8_products_stay_close_to_float32_attention(int8_products: None, head_dim: int) -> None:
    """On scores of the spread a trained model's have (a softmax over some keys, not one):
    every output row within cosine 0.999 of float32 SDPA's."""
    lengths = [512, 77, 200]
    generator = torch.Generator().manual_seed(1)
    qkv = torch.randn(sum(lengths), 3, HEADS, head_dim, generator=generator)
    qkv[:, 1] += 3 * torch.randn(head_dim, generator=generator)     # K's shared offset, which centring takes out
    q, k, v = (t.to(torch.bfloat16) for t in (qkv[:, 0], qkv[:, 1], qkv[:, 2]))
    got = int8_output(q, k, v, lengths).float()
    exact = sdpa_per_sequence(q, k, v, lengths, torch.float32)
    cosine = F.cosine_similarity(got.reshape(-1, head_dim), exact.reshape(-1, head_dim), dim=-1)
    assert cosine.min().item() >= 0.999, cosine.min().item()


def test_keys_all_alike_attend_evenly_and_zero_queries_too(int8_products: None) -> None:
    """Keys that centring leaves at zero (a zero scale) and query rows of zeros: every
    probability is the largest, the output V's mean."""
    length, head_dim = 70, 32
    q, k, v = packed_qkv([length], head_dim, seed=3)
    k = k[:1].expand(length, HEADS, head_dim).clone()
    q = q.clone()
    q[::2] = 0
    got = int8_output(q, k, v, [length]).float()
    mean = v.float().mean(0, keepdim=True).expand(length, HEADS, head_dim)
    v_step = v.float().abs().amax(0) / 127                  # one int8 step of each dim
    assert ((got - mean).abs() <= v_step / 2 + mean.abs() / 128).all()


def test_results_do_not_depend_on_the_thread_count(int8_products: None) -> None:
    lengths = [300, 5, 64, 129]
    q, k, v = packed_qkv(lengths, 64)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = int8_output(q, k, v, lengths)
        torch.set_num_threads(max(2, before))
        several = int8_output(q, k, v, lengths)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, several)


def test_int8_products_with_a_bias_are_refused(int8_products: None) -> None:
    q, k, v = packed_qkv([8], 32)
    starts, lengths = bounds([8])
    bias = torch.zeros(HEADS, 15)
    with pytest.raises(ValueError, match="no bias"):
        bf16_attention.attend_sequences(q, k, v, starts, lengths, bias=bias, quantized=True)
    with pytest.raises(ValueError, match="no bias"):
        bf16_attention._native.attend(q.data_ptr(), k.data_ptr(), v.data_ptr(), q.data_ptr(), q.stride(0),
                                      k.stride(0), v.stride(0), q.stride(0), HEADS, 32, starts.data_ptr(),
                                      lengths.data_ptr(), 1, 0.1, 1, False, bias.data_ptr(), 7, True)


def test_int8_layers_ask_for_int8_products_and_bf16_layers_do_not(int8_products: None, minilm_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the engine: every attention call of an int8 model's step asks for int8 products
    (and the answer moves when they are turned off); a bf16 model's never does."""
    from embedserve.engine import Batch
    from embedserve.scheduler.engine_loading import load_engine

    calls: list[bool] = []
    real = bf16_attention.attend_sequences

    def recording(*args: object, quantized: bool = False, **kwargs: object) -> torch.Tensor:
        calls.append(quantized)
        return real(*args, quantized=quantized, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(bf16_attention, "attend_sequences", recording)
    rows = [np.arange(101, 101 + n, dtype=np.int32) for n in (40, 90, 7)]   # over the flat loop's tokens
    batch = Batch.from_sequences(rows)
    with load_engine(minilm_dir, "cpu", "int8") as engine:
        assert "attention's products int8" in engine.info.dtype_reason, engine.info.dtype_reason
        layers = engine.model.encoder.layers
        with_int8 = engine.step(batch).wait()
        assert calls == [True] * len(layers)
        for layer in layers:
            layer.int8_attention = False
        calls.clear()
        without = engine.step(batch).wait()
        assert calls == [False] * len(layers)
    assert 0 < np.abs(with_int8 - without).max()
    calls.clear()
    with load_engine(minilm_dir, "cpu", "bfloat16") as engine:
        assert "int8" not in engine.info.dtype_reason
        engine.step(batch).wait()
    assert calls and not any(calls)
