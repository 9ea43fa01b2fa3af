"""The varlen attention layout on CPU, against a reference of the kernel's contract.

PyTorch's varlen kernel runs on CUDA only (tests/gpu/ checks it there). Here a
reference written from its documented contract (FlashAttention's varlen
interface: sequences at ``cu_seqlens``, key j visible to query i iff
i - left <= j <= i + right, -1 unlimited) stands in for it, which checks
everything of ours around the kernel: the kind -> window_size mapping, the
cu_seqlens derived from a bucket's lengths row (empty padding rows and the
dump row included) and the padded forward of every model family.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from embedserve import ragged
from embedserve.engine import Batch, Engine
from embedserve.engine.graphs.buckets import bucket_forward, bucket_inputs
from embedserve.engine.graphs.shapes import bucket_for
from embedserve.engine.modules import varlen_attention
from embedserve.engine.modules.attention import AttentionKind, per_sequence_sdpa
from embedserve.engine.modules.layout import build_layout


def reference_varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, window_size=(-1, -1),
                     enable_gqa=False):
    """FlashAttention's varlen contract, one sequence at a time, in float64."""
    left, right = window_size
    if key.shape[1] != query.shape[1]:
        assert enable_gqa and query.shape[1] % key.shape[1] == 0, "grouped k/v without enable_gqa"
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    out = torch.zeros_like(query)
    bounds = cu_seq_q.tolist()
    assert bounds == cu_seq_k.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        n = end - start
        assert n <= max_q and n <= max_k, "a sequence is longer than the max length passed"
        if n == 0:
            continue
        i = torch.arange(n)[:, None]
        j = torch.arange(n)[None, :]
        visible = torch.ones(n, n, dtype=torch.bool)
        if left >= 0:
            visible &= j >= i - left
        if right >= 0:
            visible &= j <= i + right
        q, k, v = (t[start:end].transpose(0, 1).double() for t in (query, key, value))
        scores = (q @ k.transpose(1, 2)) / q.shape[-1] ** 0.5
        scores = scores.masked_fill(~visible, float("-inf"))
        out[start:end] = (scores.softmax(-1) @ v).transpose(0, 1).to(out.dtype)
    return out


def legacy_varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False):
    """PyTorch 2.10's signature: causal or not, no window, no grouped heads."""
    return reference_varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k,
                            window_size=(-1, 0) if is_causal else (-1, -1))


KINDS = [AttentionKind(), AttentionKind(causal=True), AttentionKind(window=3),
         AttentionKind(causal=True, window=3), AttentionKind(window=0)]


@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_each_kind_matches_per_sequence_attention(kind: AttentionKind) -> None:
    lengths = [5, 1, 12, 7]
    rng = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(sum(lengths), 2, 8, generator=rng) for _ in range(3))
    layout = build_layout(ragged.cu_seqlens_from_lengths(np.array(lengths)).astype(np.int32))
    expected = per_sequence_sdpa(layout, kind.causal, kind.window)(q, k, v)
    attend = varlen_attention.varlen_from_lengths(torch.tensor(lengths), max(lengths), kind.causal,
                                                  kind.window, kernel=reference_varlen)
    torch.testing.assert_close(attend(q, k, v), expected, atol=1e-5, rtol=1e-5)


def test_a_layer_may_ask_for_another_kind() -> None:
    lengths = torch.tensor([9, 6])
    rng = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(15, 2, 4, generator=rng) for _ in range(3))
    attend = varlen_attention.varlen_from_lengths(lengths, 9, kernel=reference_varlen)
    local = AttentionKind(window=2)
    expected = varlen_attention.varlen_from_lengths(lengths, 9, window=2, kernel=reference_varlen)(q, k, v)
    torch.testing.assert_close(attend(q, k, v, kind=local), expected)
    assert not torch.allclose(attend(q, k, v), expected)


@pytest.mark.parametrize("kind, window", [(AttentionKind(), (-1, -1)), (AttentionKind(causal=True), (-1, 0)),
                                          (AttentionKind(window=4), (4, 4)),
                                          (AttentionKind(causal=True, window=4), (4, 0))], ids=str)
def test_window_size_of_each_kind(kind: AttentionKind, window: tuple[int, int]) -> None:
    assert varlen_attention.window_size(kind) == window
    assert varlen_attention.kind_arguments(reference_varlen, kind) == {"window_size": window}


def test_a_kernel_with_only_is_causal_runs_full_and_causal_but_no_window() -> None:
    assert varlen_attention.kind_arguments(legacy_varlen, AttentionKind(causal=True)) == {"is_causal": True}
    assert varlen_attention.kind_arguments(legacy_varlen, AttentionKind()) == {"is_causal": False}
    with pytest.raises(ValueError, match="cannot run"):
        varlen_attention.kind_arguments(legacy_varlen, AttentionKind(window=2))


def test_cu_seqlens_of_a_bucket_row_with_empty_rows() -> None:
    cu = varlen_attention.cu_seqlens_from_lengths(torch.tensor([3, 5, 0, 0, 56]))
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 8, 8, 8, 64]


def test_the_kernel_covers_half_precision_on_cuda_only() -> None:
    assert not varlen_attention.covers(torch.bfloat16, "cpu")
    assert not varlen_attention.covers(torch.float32, "cuda")
    assert varlen_attention.covers(torch.bfloat16, "cuda") == (varlen_attention.torch_kernel() is not None)


class RecordingKernel:
    """The reference, remembering what each call was given (head counts, max length, window)."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, window_size=(-1, -1),
                 enable_gqa=False):
        self.calls.append({"q_heads": query.shape[1], "kv_heads": key.shape[1], "max_q": max_q,
                           "window_size": window_size})
        return reference_varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k,
                                window_size=window_size, enable_gqa=enable_gqa)


@pytest.fixture
def reference_kernel(monkeypatch: pytest.MonkeyPatch) -> RecordingKernel:
    """The padded forward's varlen layout calls the reference instead of PyTorch's kernel."""
    kernel = RecordingKernel()
    monkeypatch.setattr(varlen_attention, "torch_kernel", lambda: kernel)
    return kernel


def _bucket_matches_engine(model_dir: Path, lengths_list: list[list[int]], vocab: int) -> None:
    rng = np.random.default_rng(3)
    with Engine.load(model_dir, fused_layers=False) as engine:
        task = engine.info.task
        for lengths in lengths_list:
            batch = Batch.from_sequences([rng.integers(4, vocab, size=n).astype(np.int32)
                                          for n in lengths], task=task)
            expected = engine.step(batch).wait()
            key = bucket_for(batch.num_tokens, batch.num_sequences)
            flat = torch.from_numpy(bucket_inputs(batch, key, engine.config.position_offset))
            with torch.inference_mode():
                got = bucket_forward(engine.model, flat, key, engine.info.pooling, varlen=True)
            np.testing.assert_allclose(got[:len(lengths)].numpy(), expected, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("fixture", ["tiny_bert_dir", "tiny_xlmr_dir", "tiny_reranker_dir"])
def test_varlen_bucket_forward_equals_the_unpadded_engine(fixture: str, reference_kernel: None,
                                                          request: pytest.FixtureRequest) -> None:
    _bucket_matches_engine(request.getfixturevalue(fixture),
                           [[3, 50, 7], [300, 5, 1, 1, 12], [64], [1], [40] * 9], 250002)


def test_varlen_bucket_forward_of_a_causal_sliding_window_decoder(tmp_path: Path,
                                                                  reference_kernel: RecordingKernel) -> None:
    from decoder_models import build_decoder_dir

    model_dir = build_decoder_dir(tmp_path / "mistral", "mistral")   # sliding window 16
    _bucket_matches_engine(model_dir, [[40, 3, 17], [70], [5] * 7], 200)


@pytest.mark.parametrize("variant", ["qwen3", "llama"])
def test_grouped_query_decoders_hand_the_kernel_their_kv_heads(variant: str, tmp_path: Path,
                                                               reference_kernel: RecordingKernel) -> None:
    """k/v travel with their own (fewer) heads and enable_gqa, not repeated per query head."""
    from decoder_models import build_decoder_dir

    model_dir = build_decoder_dir(tmp_path / variant, variant)
    _bucket_matches_engine(model_dir, [[40, 3, 17], [5] * 7], 200)
    assert reference_kernel.calls
    assert all(call["kv_heads"] < call["q_heads"] for call in reference_kernel.calls)


def test_varlen_bucket_forward_of_modernbert_local_and_global_layers(tmp_path: Path,
                                                                     reference_kernel: RecordingKernel) -> None:
    from embedserve.model.config import load_model_config
    from modernbert_model import build_tiny_modernbert

    model_dir = build_tiny_modernbert(tmp_path / "modernbert")
    _bucket_matches_engine(model_dir, [[30, 4, 19], [60], [9] * 5], 320)
    # The local layers ask the kernel for their window instead of a banded mask.
    half = load_model_config(model_dir).local_window // 2
    windows = {call["window_size"] for call in reference_kernel.calls}
    assert windows == {(-1, -1), (half, half)}


def test_the_kernel_is_told_at_most_the_model_positions(tmp_path: Path,
                                                        reference_kernel: RecordingKernel) -> None:
    """A bucket's max length is the longest a row can be, not its token count: the
    kernel launches blocks for that many queries per row."""
    from conftest import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "short", "BertModel", None, max_position_embeddings=64)
    _bucket_matches_engine(model_dir, [[60, 60, 60, 60], [3, 50, 7]], 250002)
    assert {call["max_q"] for call in reference_kernel.calls} == {64}


def _probe_model(tmp_path: Path, variant: str):
    from decoder_models import build_decoder_dir
    from embedserve.engine.engine import build_model

    return build_model(build_decoder_dir(tmp_path / variant, variant))


def test_the_load_probe_passes_a_kernel_that_runs_every_kind(tmp_path: Path) -> None:
    from embedserve.engine.runners.cuda import _varlen_failure

    model = _probe_model(tmp_path, "mistral")           # causal with a window, grouped heads
    assert _varlen_failure(model, torch.float32, torch.device("cpu"), RecordingKernel()) is None


def test_the_load_probe_refuses_a_kernel_without_windows_for_a_windowed_model(tmp_path: Path) -> None:
    """PyTorch 2.10's kernel has no window_size: Mistral's steps must fall back to the padded
    layouts at load, not fail at every step."""
    from embedserve.engine.runners.cuda import _varlen_failure

    failure = _varlen_failure(_probe_model(tmp_path, "mistral"), torch.float32, torch.device("cpu"),
                              legacy_varlen)
    assert failure is not None and "window" in failure


def test_the_load_probe_catches_any_exception_from_the_kernel(tmp_path: Path) -> None:
    from embedserve.engine.runners.cuda import _varlen_failure

    def broken(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, window_size=(-1, -1)):
        raise TypeError("varlen_attn() got an unexpected keyword argument 'enable_gqa'")

    failure = _varlen_failure(_probe_model(tmp_path, "qwen3"), torch.float32, torch.device("cpu"), broken)
    assert failure is not None and "unexpected keyword" in failure


def test_reference_matches_sdpa_on_one_sequence() -> None:
    """The reference itself, against PyTorch's SDPA (a check of the check)."""
    rng = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(10, 2, 4, generator=rng) for _ in range(3))
    cu = torch.tensor([0, 10], dtype=torch.int32)
    expected = F.scaled_dot_product_attention(*(t.transpose(0, 1) for t in (q, k, v)), is_causal=True)
    torch.testing.assert_close(reference_varlen(q, k, v, cu, cu, 10, 10, window_size=(-1, 0)),
                               expected.transpose(0, 1), atol=1e-5, rtol=1e-5)
