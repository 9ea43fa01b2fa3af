"""``--dtype int8`` against float32 references: transformers on a tiny random BERT and on
the real all-MiniLM-L6-v2, the quantization pieces against their definitions, oneDNN's
int8 code without AMX/VNNI (the fallback other CPUs run), and the one-line refusal on CUDA.

The bar is a cosine to float32, not equality: int8 rounds each weight to 1/254 of its
row's range and each activation to 1/255 of its tensor's. Each int8 test also checks
that the answer is not float32's (the layers really ran in int8).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve import ragged
from embedserve.engine import Batch, Engine, int8_layers, int8_quantize
from embedserve.engine.dtype_choice import DtypeProbe
from embedserve.errors import ModelLoadError
from embedserve.scheduler.engine_loading import load_engine
from tests.test_engine_parity import LENGTHS, hf_model, random_sequences, reference

ROOT = Path(__file__).resolve().parents[1]
# Real English text the calibration sample does not hold.
SENTENCES = (
    "The lighthouse keeper climbed the spiral stairs every evening to light the lamp.",
    "How long should sourdough bread rise before it goes into the oven?",
    "Quantum computers use qubits, which can hold a superposition of zero and one.",
    "The committee postponed its vote on the new budget until after the holidays.",
    "what is the boiling point of water at high altitude",
    "Our team shipped the release on Friday after fixing the last flaky test.",
    "Penguins are flightless birds that live almost exclusively in the Southern Hemisphere, where "
    "they spend about half of their lives on land and the other half in the oceans hunting fish.",
)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def random_tokens(vocab: int, seed: int) -> ragged.RaggedBatch:
    return ragged.from_sequences(random_sequences([5, 40, 200, 512], vocab, seed))


def test_weights_round_per_output_channel() -> None:
    weight = torch.randn(48, 40, generator=torch.Generator().manual_seed(0))
    weight[3] *= 100                                   # one row's range must not coarsen the others
    quantized, scales = int8_layers.int8_per_channel(weight)
    assert quantized.dtype == torch.int8 and scales.shape == (48,)
    assert quantized.abs().amax(1).eq(127).all()       # each row's largest |w| is 127
    error = (quantized.float() * scales[:, None] - weight).abs()
    assert (error <= scales[:, None] / 2 + 1e-6).all()


def test_activations_keep_7_bits_without_vnni() -> None:
    assert int8_quantize.activation_max({"avx2": True, "avx512_bw": True}) == 127
    for feature in ("amx_int8", "avx512_vnni", "avx_vnni"):
        assert int8_quantize.activation_max({"avx2": True, feature: True}) == 255
    assert int8_quantize.affine_params(-1.0, 3.0, 127) == (4.0 / 127, 32)
    assert int8_quantize.affine_params(0.5, 2.0) == (2.0 / 255, 0)     # the range always holds 0


@pytest.mark.parametrize("qmax", [255, 127])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quantize_kernel_matches_its_definition(dtype: torch.dtype, qmax: int) -> None:
    if not int8_quantize.kernel_available():
        pytest.skip("the int8 quantize kernel is not built here or the CPU lacks AVX-512")
    rows = torch.randn(300, 512, generator=torch.Generator().manual_seed(1)).mul_(4).to(dtype)
    x = rows[:, :389]                                  # strided rows, a masked tail
    low, high = int8_quantize.value_range(x)
    assert (low, high) == (float(x.min()), float(x.max()))
    scale, zero_point = int8_quantize.affine_params(low, high, qmax)
    multiplier = torch.rand(389, generator=torch.Generator().manual_seed(2)).add_(0.5) / scale
    expected = torch.round(x.double() * multiplier.double()).add_(zero_point).clamp_(0, qmax)
    ours = int8_quantize.quantize(x, multiplier, zero_point, qmax)
    assert ours.dtype == torch.uint8 and ours.is_contiguous()
    # float32 products may land on the other side of a .5 than float64's
    assert (ours.double() - expected).abs().max() <= 1
    assert (ours.double() != expected).float().mean() < 1e-3


def test_tiny_bert_int8_is_close_to_transformers(tiny_bert_dir: Path) -> None:
    with Engine.load(tiny_bert_dir, dtype="float32") as probe_engine:
        vocab, pooling = probe_engine.info.vocab_size, probe_engine.info.pooling
    sequences = random_sequences(LENGTHS, vocab, seed=7)
    expected = reference(hf_model(tiny_bert_dir), sequences, pooling)
    calibration = DtypeProbe(lambda: random_tokens(vocab, 8), calibration=lambda: random_tokens(vocab, 9))
    for probe, activations in ((calibration, "static"), (None, "dynamic")):
        with Engine.load(tiny_bert_dir, dtype="int8", probe=probe) as engine:
            assert engine.info.dtype == "int8" and activations in engine.info.dtype_reason
            assert all(isinstance(layer, int8_layers.Int8Layer) for layer in engine.model.encoder.layers)
            ours = engine.step(Batch.from_sequences(sequences)).wait()
        assert ours.shape == expected.shape
        assert cosines(ours, expected).min() >= 0.99, (activations, cosines(ours, expected))
        assert np.abs(ours - expected).max() > 1e-3      # not float32's answer


def test_minilm_int8_is_close_to_transformers(minilm_dir: Path) -> None:
    import tokenizers

    tokenizer = tokenizers.Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tokenizer.no_padding()
    sequences = [np.array(encoding.ids, dtype=np.int32) for encoding in tokenizer.encode_batch(list(SENTENCES))]
    expected = reference(hf_model(minilm_dir), sequences, "mean")
    with load_engine(minilm_dir, "cpu", "int8") as engine:      # calibrated as a replica is
        assert engine.info.dtype == "int8" and "static" in engine.info.dtype_reason
        ours = engine.step(Batch.from_sequences(sequences)).wait()
    assert cosines(ours, expected).min() >= 0.99, cosines(ours, expected)
    assert np.abs(ours - expected).max() > 1e-3


def test_int8_without_amx_or_vnni_matches_too(tiny_bert_dir: Path) -> None:
    """oneDNN capped at AVX2 (what an AVX2-only CPU runs, with its 7-bit activations) and
    torch's quantize ops in place of the native kernel: the same bar against transformers."""
    script = f"""
import numpy as np
from embedserve.engine import Batch, Engine, int8_quantize
from tests.test_engine_parity import LENGTHS, hf_model, random_sequences, reference
int8_quantize.kernel_available = lambda: False
vnni_free = int8_quantize.activation_max({{"avx2": True}})
int8_quantize.activation_max = lambda capabilities=None: vnni_free
with Engine.load({str(tiny_bert_dir)!r}, dtype="int8") as engine:
    sequences = random_sequences(LENGTHS[:5], engine.info.vocab_size, seed=7)
    ours = engine.step(Batch.from_sequences(sequences)).wait()
expected = reference(hf_model({str(tiny_bert_dir)!r}), sequences, engine.info.pooling)
cos = (ours * expected).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(expected, axis=1)
print(cos.min(), np.abs(ours - expected).max())
"""
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2", ONEDNN_VERBOSE="1", PYTHONPATH=str(ROOT),
               OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    matmuls = [line for line in done.stdout.splitlines() if ",exec," in line and "src:u8" in line]
    assert matmuls and not any("amx" in line or "vnni" in line for line in matmuls), matmuls[:3]
    worst, largest_difference = map(float, done.stdout.splitlines()[-1].split())
    assert worst >= 0.99 and largest_difference > 1e-3


def test_int8_on_cuda_is_refused_in_one_line(tiny_bert_dir: Path) -> None:
    with pytest.raises(ModelLoadError) as refused:
        Engine.load(tiny_bert_dir, device="cuda", dtype="int8")
    message = str(refused.value)
    assert "int8 runs on CPU only" in message and "\n" not in message


def test_serve_int8_reports_it_and_stays_close_to_transformers(tiny_bert_dir: Path) -> None:
    import httpx
    import tokenizers

    from tests.serve_harness import served

    texts = list(SENTENCES[:3])
    tokenizer = tokenizers.Tokenizer.from_file(str(tiny_bert_dir / "tokenizer.json"))
    tokenizer.no_padding()
    sequences = [np.array(encoding.ids, dtype=np.int32) for encoding in tokenizer.encode_batch(texts)]
    expected = reference(hf_model(tiny_bert_dir), sequences, "mean")
    with served("--model", str(tiny_bert_dir), "--dtype", "int8") as url:
        info = httpx.get(url + "/info", timeout=10).json()
        assert info["model_dtype"] == "int8" and "static" in info["dtype_reason"], info
        reply = httpx.post(url + "/v1/embeddings", json={"input": texts}, timeout=60)
    assert reply.status_code == 200, reply.text
    vectors = np.array([item["embedding"] for item in reply.json()["data"]])
    assert cosines(vectors, expected).min() >= 0.99
    assert np.abs(vectors - expected / np.linalg.norm(expected, axis=1, keepdims=True)).max() > 1e-3


@pytest.mark.parametrize("variant", ["qwen3", "llama"])
def test_decoder_int8_is_close_to_transformers(variant: str, tmp_path: Path) -> None:
    """A decoder embedder (tiny random Qwen3: GQA, q/k norms; Llama: every bias, one kv head)
    under ``--dtype int8``: QKV, attention output and gate/up on int8, ``down`` not; short
    steps (the few-row kernel) and long ones (oneDNN), static and dynamic activations,
    against transformers in float32."""
    from decoder_models import VOCAB_SIZE, build_decoder_dir
    from tests.test_engine_decoders import reference as decoder_reference

    model_dir = build_decoder_dir(tmp_path / variant, variant, "lasttoken")
    short = random_sequences([6, 20], VOCAB_SIZE, seed=3)
    long = random_sequences([300, 40, 512], VOCAB_SIZE, seed=4)
    calibration = DtypeProbe(lambda: random_tokens(VOCAB_SIZE, 8), calibration=lambda: random_tokens(VOCAB_SIZE, 9))
    for probe, activations in ((calibration, "static"), (None, "dynamic")):
        with Engine.load(model_dir, dtype="int8", probe=probe) as engine:
            assert engine.info.dtype == "int8" and activations in engine.info.dtype_reason, engine.info.dtype_reason
            layer = engine.model.layers[0]
            assert all(isinstance(getattr(layer, name), int8_layers.Int8Linear)
                       for name in int8_layers.DECODER_INT8_LINEARS)
            assert isinstance(layer.down, torch.nn.Linear)
            for sequences in (short, long):
                ours = engine.step(Batch.from_sequences(sequences)).wait()
                expected = decoder_reference(model_dir, sequences, "lasttoken")
                assert cosines(ours, expected).min() >= 0.99, (activations, cosines(ours, expected))
                assert np.abs(ours - expected).max() > 1e-3      # not float32's answer
