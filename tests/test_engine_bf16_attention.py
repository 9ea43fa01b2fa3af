"""The native bf16 attention kernel (AMX tiles and VDPBF16PS) against torch's attention.

References: torch's SDPA in float32 on the same bf16 inputs (the exact result
up to float32 rounding), and torch's own bf16 SDPA (its flash kernel), whose
error against that reference is the bar: the kernel rounds the same things to bf16 (the
probabilities before the second product, the output), so its error must be of
the same size, not merely "small". Each instruction path the CPU can run is
checked (an AMX host runs both). Then the engine: per_sequence attention in
bf16 goes through the kernel and matches the SDPA loop it replaces.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from embedserve.engine import Batch, Engine
from embedserve.engine.modules import bf16_attention
from embedserve.engine.modules.attention import per_sequence, per_sequence_sdpa
from embedserve.engine.modules.layout import build_layout
from tests.native_build import require_compiler_for

HEADS = 12


@pytest.fixture
def kernel() -> None:
    if not bf16_attention.kernel_available():
        pytest.skip("no native bf16 attention here: the kernel is not built or the CPU lacks AVX512-BF16")


@pytest.fixture(params=[bf16_attention.AMX, bf16_attention.AVX512_BF16])
def path(request: pytest.FixtureRequest) -> str:
    if request.param not in bf16_attention.available_paths():
        pytest.skip(f"the kernel's {request.param} path cannot run here (not built, or the CPU lacks it)")
    return request.param


def packed_qkv(lengths: list[int], head_dim: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """q, k, v as the engine has them: views of one fused [T, 3, heads, head_dim] bf16 tensor."""
    generator = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(sum(lengths), 3, HEADS, head_dim, generator=generator) * 2).to(torch.bfloat16)
    return qkv[:, 0], qkv[:, 1], qkv[:, 2]


def bounds(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    starts = np.r_[0, np.cumsum(lengths)[:-1]].astype(np.int64)
    return torch.from_numpy(starts), torch.tensor(lengths, dtype=torch.int64)


def sdpa_per_sequence(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int],
                      dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(q.shape, dtype=dtype)
    start = 0
    for length in lengths:
        rows = slice(start, start + length)
        # [1, heads, L, hd]: in bf16 the flash kernel, the one per_sequence ran before the native kernel
        qs, ks, vs = (t[rows].to(dtype).transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        out[rows] = F.scaled_dot_product_attention(qs, ks, vs)[0].transpose(0, 1)
        start += length
    return out


def kernel_output(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int],
                  path: str | None = None) -> torch.Tensor:
    starts, lengths_tensor = bounds(lengths)
    assert bf16_attention.covers(q, k, v)
    return bf16_attention.attend_sequences(q, k, v, starts, lengths_tensor, path)


LENGTHS = [
    [1],
    [2, 15, 16, 17],
    [31, 32, 33, 63, 64, 65],
    [512, 100, 3, 250],
    [1000],
]


@pytest.mark.parametrize("head_dim", [32, 64])
@pytest.mark.parametrize("lengths", LENGTHS, ids=lambda lengths: "-".join(map(str, lengths)))
def test_kernel_matches_float32_attention_as_closely_as_torch_bf16(
        path: str, head_dim: int, lengths: list[int]) -> None:
    q, k, v = packed_qkv(lengths, head_dim)
    reference = sdpa_per_sequence(q, k, v, lengths, torch.float32)
    torch_error = (sdpa_per_sequence(q, k, v, lengths, torch.bfloat16).float() - reference).abs()
    error = (kernel_output(q, k, v, lengths, path).float() - reference).abs()
    # Both round the output to bf16 (half an ulp: 2^-9 relative), which dominates.
    assert error.max() <= 1.25 * torch_error.max() + 1e-6
    assert error.mean() <= 1.1 * torch_error.mean() + 1e-7


def sdpa_biased(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int], rows: torch.Tensor,
                dtype: torch.dtype) -> torch.Tensor:
    """Per sequence, SDPA with the additive mask bias[h, i, j] = rows[h, j - i + reach]
    (MPNet's relative position bias, as modules/mpnet.py's SDPA path adds it)."""
    reach = rows.shape[1] // 2
    out = torch.empty(q.shape, dtype=dtype)
    start = 0
    for length in lengths:
        index = torch.arange(length)
        mask = rows[:, index[None, :] - index[:, None] + reach].to(dtype)[None]         # [1, heads, L, L]
        qs, ks, vs = (t[start:start + length].to(dtype).transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        out[start:start + length] = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask)[0].transpose(0, 1)
        start += length
    return out


@pytest.mark.parametrize("head_dim", [32, 64])
@pytest.mark.parametrize("lengths", [[1, 17, 64], [300, 5, 129]], ids=lambda lengths: "-".join(map(str, lengths)))
def test_a_relative_bias_is_added_as_sdpa_adds_its_mask(path: str, head_dim: int, lengths: list[int]) -> None:
    q, k, v = packed_qkv(lengths, head_dim, seed=4)
    reach = max(lengths) + 3                        # any reach at least the longest - 1
    # bf16 values, as MPNet's table has them; large enough to move the softmax
    rows = (torch.randn(HEADS, 2 * reach + 1, generator=torch.Generator().manual_seed(5)) * 3).bfloat16().float()
    reference = sdpa_biased(q, k, v, lengths, rows, torch.float32)
    torch_error = (sdpa_biased(q, k, v, lengths, rows, torch.bfloat16).float() - reference).abs()
    starts, lengths_tensor = bounds(lengths)
    out = bf16_attention.attend_sequences(q, k, v, starts, lengths_tensor, path, bias=rows).float()
    error = (out - reference).abs()
    assert error.max() <= 1.25 * torch_error.max() + 1e-6
    assert error.mean() <= 1.1 * torch_error.mean() + 1e-7
    # the bias moved the result: without it the kernel is far from this reference
    unbiased = bf16_attention.attend_sequences(q, k, v, starts, lengths_tensor, path).float()
    assert (unbiased - reference).abs().max() > 100 * error.max()


def test_a_bias_too_short_for_the_longest_sequence_is_refused(kernel: None) -> None:
    q, k, v = packed_qkv([10, 40], 32)
    starts, lengths_tensor = bounds([10, 40])
    with pytest.raises(ValueError, match="too short"):
        bf16_attention.attend_sequences(q, k, v, starts, lengths_tensor, bias=torch.zeros(HEADS, 2 * 38 + 1))
    with pytest.raises(ValueError, match="float32"):
        bf16_attention.attend_sequences(q, k, v, starts, lengths_tensor, bias=torch.zeros(HEADS, 80))


def test_rows_whose_scores_are_all_negative(path: str) -> None:
    # Keys padded to a multiple of 64 score 0 against any query: a row max taken over
    # them instead of the real keys would shift every exponential below float range.
    lengths = [5, 70]
    q, k, v = packed_qkv(lengths, 32, seed=6)
    q = (q.float().abs() + 4).to(torch.bfloat16)
    k = -(k.float().abs() + 4).to(torch.bfloat16)           # every q . k / sqrt(32) < -90
    reference = sdpa_per_sequence(q, k, v, lengths, torch.float32)
    out = kernel_output(q, k, v, lengths, path).float()
    assert torch.isfinite(out).all()
    assert (out - reference).abs().max() < 0.05


def test_q_k_and_v_may_each_have_their_own_row_stride(path: str) -> None:
    # As in ModernBERT: q and k are new tensors (after RoPE), v a view of the fused QKV.
    lengths = [40, 7, 130]
    q, k, v = packed_qkv(lengths, 64, seed=3)
    q = q.contiguous()
    k = torch.cat([k, k], dim=1)[:, HEADS:]          # rows 2 x heads x head_dim apart
    reference = sdpa_per_sequence(q, k, v, lengths, torch.float32)
    torch_error = (sdpa_per_sequence(q, k, v, lengths, torch.bfloat16).float() - reference).abs()
    assert len({t.stride(0) for t in (q, k, v)}) == 3
    assert (kernel_output(q, k, v, lengths, path).float() - reference).abs().max() <= 1.25 * torch_error.max()


def test_results_do_not_depend_on_the_thread_count(path: str) -> None:
    # Each (sequence, head) is computed whole by one thread: the same bits whatever the split.
    lengths = [300, 17, 512, 64, 5, 128, 200, 33]
    q, k, v = packed_qkv(lengths, 64, seed=5)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = kernel_output(q, k, v, lengths, path)
        torch.set_num_threads(4)
        split = kernel_output(q, k, v, lengths, path)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone, split)


def test_concurrent_callers_each_get_their_own_answer(path: str) -> None:
    problems = [([200, 31, 90], 32, seed) for seed in range(4)] + [([128, 512], 64, 9)]
    expected = [kernel_output(*packed_qkv(lengths, hd, seed), lengths, path) for lengths, hd, seed in problems]
    results: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(problems))}

    def call(index: int) -> None:
        lengths, hd, seed = problems[index]
        q, k, v = packed_qkv(lengths, hd, seed)
        for _ in range(5):
            results[index].append(kernel_output(q, k, v, lengths, path))

    callers = [threading.Thread(target=call, args=(i,)) for i in range(len(problems))]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(timeout=60)
    assert not any(caller.is_alive() for caller in callers)
    for index, outputs in results.items():
        assert len(outputs) == 5
        assert all(torch.equal(output, expected[index]) for output in outputs)


def test_the_kernel_runs_on_torchs_openmp_runtime(kernel: None) -> None:
    # One libgomp in a process that imports torch and runs the kernel: the kernel's
    # threads are torch's team, not a second pool competing with it for the same cores.
    # (A fresh process: other packages the suite imports bring copies of their own.)
    script = (
        "import json\n"
        "import torch\n"
        "from pathlib import Path\n"
        "from embedserve.engine.modules import bf16_attention\n"
        "qkv = torch.randn(64, 3, 12, 32).to(torch.bfloat16)\n"
        "q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]\n"
        "assert bf16_attention.covers(q, k, v)\n"
        "bf16_attention.attend_sequences(q, k, v, torch.tensor([0]), torch.tensor([64]))\n"
        "maps = Path('/proc/self/maps').read_text().splitlines()\n"
        "print(json.dumps(sorted({line.split()[-1] for line in maps if 'libgomp' in line})))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    runtimes = json.loads(result.stdout)
    assert len(runtimes) == 1 and Path(runtimes[0]).parent == Path(torch.__file__).parent / "lib", runtimes


def test_calls_the_kernel_does_not_cover_are_refused(kernel: None) -> None:
    q, k, v = packed_qkv([20], 32)
    assert not bf16_attention.covers(q.float(), k.float(), v.float())
    q48, k48, v48 = packed_qkv([20], 48)
    assert not bf16_attention.covers(q48, k48, v48)
    # heads not contiguous in a row (a transposed view)
    assert not bf16_attention.covers(*(t.transpose(0, 1).contiguous().transpose(0, 1) for t in (q, k, v)))
    assert not bf16_attention.covers(q, k[:-1], v[:-1])
    # rows further apart than the kernel's 32-bit gather offsets reach (one row: any stride is valid)
    far = torch.zeros(1, HEADS * 32, dtype=torch.bfloat16).as_strided((1, HEADS, 32), (2 ** 27, 32, 1))
    assert not bf16_attention.covers(far, far, far)


@pytest.mark.parametrize("causal,window", [(True, None), (False, 4)])
def test_per_sequence_keeps_sdpa_for_masked_kinds(kernel: None, causal: bool, window: int | None) -> None:
    lengths = [30, 9]
    q, k, v = packed_qkv(lengths, 32, seed=2)
    layout = build_layout(np.r_[0, np.cumsum(lengths)].astype(np.int32))
    native, plain = (build(layout, causal=causal, window=window) for build in (per_sequence, per_sequence_sdpa))
    assert torch.equal(native(q, k, v), plain(q, k, v))


def test_bf16_engine_steps_match_the_sdpa_loop(kernel: None, default_model_dir: Path) -> None:
    from embedserve.engine.runners.cpu import CpuRunner

    rng = np.random.default_rng(4)
    sequences = [rng.integers(5, 200_000, size=n).astype(np.int32) for n in (1, 9, 64, 200, 512, 77)]
    batch = Batch.from_sequences(sequences)
    with Engine.load(default_model_dir, dtype="bfloat16") as engine:
        native, sdpa = (CpuRunner(engine.model, engine.info, name).submit(batch).wait()
                        for name in ("per_sequence", "per_sequence_sdpa"))
    cosine = (native * sdpa).sum(1) / np.linalg.norm(native, axis=1) / np.linalg.norm(sdpa, axis=1)
    assert cosine.min() >= 0.9999


def test_modernbert_global_layers_in_bf16_match_the_sdpa_loop(kernel: None, tmp_path: Path) -> None:
    from embedserve.engine.runners.cpu import CpuRunner
    from tests.modernbert_model import build_tiny_modernbert

    # hidden 128 over 4 heads: head_dim 32, so the global layers' attention is the kernel's;
    # the local (windowed) layers stay on SDPA in both runners.
    model_dir = build_tiny_modernbert(tmp_path / "modernbert", hidden=128)
    rng = np.random.default_rng(8)
    batch = Batch.from_sequences([rng.integers(5, 300, size=n).astype(np.int32) for n in (3, 40, 128, 17)])
    with Engine.load(model_dir, dtype="bfloat16") as engine:
        native, sdpa = (CpuRunner(engine.model, engine.info, name).submit(batch).wait()
                        for name in ("per_sequence", "per_sequence_sdpa"))
    cosine = (native * sdpa).sum(1) / np.linalg.norm(native, axis=1) / np.linalg.norm(sdpa, axis=1)
    assert not np.array_equal(native, sdpa)        # the kernel did run
    assert cosine.min() >= 0.9999


def test_the_kernel_is_built_where_the_compiler_can_target_amx(tmp_path: Path) -> None:
    # The build is optional (a compiler without AMX skips it); where one can, a missing
    # kernel means the install broke silently and bf16 attention fell back to SDPA.
    require_compiler_for(tmp_path, ["-mamx-tile", "-mamx-bf16"],
                         "#include <immintrin.h>\nvoid f(void) { _tile_release(); }\n")
    assert bf16_attention._native is not None, f"{sys.executable}: embedserve.engine._bf16_attention missing"
