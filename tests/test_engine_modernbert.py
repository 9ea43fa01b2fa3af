"""ModernBERT in the engine against transformers and sentence-transformers.

Tiny random checkpoints (tests/modernbert_model.py): hidden 64, 4 layers,
local window 8, global every 3 (mean pooling, like modernbert-embed) or every
2 (CLS pooling, like gte-modernbert). The engine runs one packed batch of
lengths 1 ... 40; the reference runs each sequence alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from embedserve.engine.batch import Batch
from embedserve.engine.engine import Engine
from embedserve.engine.graphs.buckets import bucket_forward, bucket_inputs
from embedserve.engine.graphs.shapes import bucket_for
from embedserve.engine.modules.attention import ATTENTION_IMPLS
from embedserve.engine.modules.layout import build_layout
from embedserve.errors import ModelLoadError
from embedserve.model.config import load_encoder_config
from embedserve.model.info import read_model_info
from engine_imports import slow_imports_after_load
from modernbert_model import CORPUS, VOCAB_SIZE, build_tiny_modernbert, modernbert_config
from native_attention import record_kernel_biases, require_native_attention

LENGTHS = [1, 2, 5, 9, 17, 40, 33, 3, 12, 25, 8, 4]


@pytest.fixture(scope="module")
def embed_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Like modernbert-embed: global every 3 layers, mean pooling + Normalize."""
    return build_tiny_modernbert(tmp_path_factory.mktemp("modernbert_mean"), "mean", True, 3, seed=0)


@pytest.fixture(scope="module")
def gte_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Like gte-modernbert: global every 2 layers, CLS pooling + Normalize."""
    return build_tiny_modernbert(tmp_path_factory.mktemp("modernbert_cls"), "cls", True, 2, seed=1)


def _sequences(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB_SIZE, size=n).astype(np.int32) for n in LENGTHS]


def _reference_states(model_dir: Path, sequences: list[np.ndarray], implementation: str = "sdpa",
                      **config_overrides) -> list[torch.Tensor]:
    """transformers' last_hidden_state, one sequence at a time."""
    import transformers

    model = transformers.ModernBertModel.from_pretrained(
        model_dir, attn_implementation=implementation, **config_overrides).eval()
    with torch.no_grad():
        return [model(input_ids=torch.from_numpy(s.astype(np.int64))[None]).last_hidden_state[0]
                for s in sequences]


def _pool(states: torch.Tensor, pooling: str) -> np.ndarray:
    return (states[0] if pooling == "cls" else states.mean(0)).numpy()


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("attention", sorted(ATTENTION_IMPLS))
@pytest.mark.parametrize("fixture", ["embed_dir", "gte_dir"])
def test_packed_batch_matches_transformers_per_sequence(fixture: str, attention: str,
                                                        request: pytest.FixtureRequest) -> None:
    model_dir: Path = request.getfixturevalue(fixture)
    sequences = _sequences()
    with Engine.load(model_dir, attention=attention) as engine:
        pooling = engine.info.pooling
        pooled = engine.step(Batch.from_sequences(sequences)).wait()
        # Every token's final state too, not only the pooled summary.
        batch = Batch.from_sequences(sequences)
        layout = build_layout(batch.cu_seqlens)
        with torch.inference_mode():
            states = engine.model(torch.from_numpy(batch.token_ids.astype(np.int64)),
                                  layout.offsets_tensor, torch.zeros(batch.num_tokens, dtype=torch.int64),
                                  ATTENTION_IMPLS[attention](layout))
    assert pooling == ("mean" if fixture == "embed_dir" else "cls")
    for implementation in ("sdpa", "eager"):
        expected = _reference_states(model_dir, sequences, implementation)
        for i, (sequence, reference) in enumerate(zip(sequences, expected)):
            assert _cosine(pooled[i], _pool(reference, pooling)) >= 0.99999, (i, len(sequence))
            start = int(batch.cu_seqlens[i])
            token_states = states[start:start + len(sequence)]
            assert torch.allclose(token_states, reference, atol=2e-5, rtol=1e-4), len(sequence)


def test_the_window_and_rope_bases_change_the_reference(embed_dir: Path) -> None:
    """The parity above can fail: a model that ignored the local window, or used
    the global RoPE base in local layers, differs from the reference by far more
    than the tolerance on a sequence longer than the window."""
    long_sequence = _sequences()[LENGTHS.index(40)]
    expected = _pool(_reference_states(embed_dir, [long_sequence])[0], "mean")
    no_window = _pool(_reference_states(embed_dir, [long_sequence], local_attention=1024)[0], "mean")
    one_base = _pool(_reference_states(embed_dir, [long_sequence], rope_parameters={
        "full_attention": {"rope_type": "default", "rope_theta": 160_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 160_000.0}})[0], "mean")
    assert _cosine(expected, no_window) < 0.9999
    assert _cosine(expected, one_base) < 0.9999


@pytest.mark.parametrize("fixture", ["embed_dir", "gte_dir"])
def test_padded_bucket_forward_equals_unpadded(fixture: str, request: pytest.FixtureRequest) -> None:
    """The CUDA-graph input layout (padding tokens at position 0, a dump row) on
    CPU: padding never leaks into a sliding window."""
    model_dir: Path = request.getfixturevalue(fixture)
    rng = np.random.default_rng(3)
    with Engine.load(model_dir) as engine:
        for lengths in (LENGTHS, [40], [1], [7, 40, 1, 1], [30] * 5):
            sequences = [rng.integers(0, VOCAB_SIZE, size=n).astype(np.int32) for n in lengths]
            batch = Batch.from_sequences(sequences)
            expected = engine.step(batch).wait()
            key = bucket_for(batch.num_tokens, batch.num_sequences)
            flat = torch.from_numpy(bucket_inputs(batch, key, engine.config.position_offset))
            with torch.inference_mode():
                got = bucket_forward(engine.model, flat, key, engine.info.pooling)[:len(lengths)]
            assert np.abs(got.numpy() - expected).max() <= 1e-5


@pytest.mark.parametrize("fixture", ["embed_dir", "gte_dir"])
def test_matches_sentence_transformers(fixture: str, request: pytest.FixtureRequest) -> None:
    """Transformer + Pooling + Normalize loaded by sentence-transformers from the same
    directory; our side tokenizes with transformers' tokenizer of that directory."""
    sentence_transformers = pytest.importorskip("sentence_transformers")
    import transformers

    model_dir: Path = request.getfixturevalue(fixture)
    texts = CORPUS + ["short", "a " * 30 + "long one, past the window"]
    st_model = sentence_transformers.SentenceTransformer(str(model_dir), device="cpu")
    expected = st_model.encode(texts, convert_to_numpy=True, batch_size=3)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    sequences = [np.asarray(ids, dtype=np.int32) for ids in tokenizer(texts)["input_ids"]]
    assert max(len(s) for s in sequences) > 8
    with Engine.load(model_dir) as engine:
        assert engine.info.normalize
        got = engine.step(Batch.from_sequences(sequences)).wait()
    got = got / np.linalg.norm(got, axis=1, keepdims=True)
    for i, text in enumerate(texts):
        assert _cosine(got[i], expected[i]) >= 0.99999, text
    assert np.abs(got - expected).max() < 1e-4


def test_model_info(embed_dir: Path, gte_dir: Path) -> None:
    embed, gte = read_model_info(embed_dir), read_model_info(gte_dir)
    assert (embed.architecture, embed.task, embed.dimension, embed.pooling, embed.normalize) == (
        "ModernBertModel", "embed", 64, "mean", True)
    assert (gte.pooling, gte.max_positions, gte.vocab_size, gte.type_vocab_size) == ("cls", 128, VOCAB_SIZE, 1)


def _hub_spelling(saved: dict) -> dict:
    """The saved config as the hub's ModernBERT configs spell it (transformers 4.48)."""
    hub = {k: v for k, v in saved.items() if k not in ("layer_types", "rope_parameters")}
    hub.update(global_rope_theta=saved["rope_parameters"]["full_attention"]["rope_theta"],
               local_rope_theta=saved["rope_parameters"]["sliding_attention"]["rope_theta"])
    return hub


@pytest.mark.parametrize("global_every", [1, 2, 3, 5])
def test_config_spellings_agree_with_transformers(global_every: int, tmp_path: Path) -> None:
    """Hub spelling (global_attn_every_n_layers, *_rope_theta) and transformers 5's
    (layer_types, rope_parameters) parse to the layer pattern transformers builds."""
    import transformers

    reference = modernbert_config(global_every, num_hidden_layers=7, local_rope_theta=20_000.0)
    reference.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    parsed = load_encoder_config(tmp_path)
    hub_dir = tmp_path / "hub"
    hub_dir.mkdir()
    (hub_dir / "config.json").write_text(json.dumps(_hub_spelling(saved)))
    from_hub = load_encoder_config(hub_dir)
    from_hub_reference = transformers.ModernBertConfig.from_pretrained(hub_dir)
    assert parsed == from_hub
    assert list(parsed.layer_types) == list(reference.layer_types) == list(from_hub_reference.layer_types)
    assert parsed.global_rope_theta == 160_000.0 and parsed.local_rope_theta == 20_000.0
    assert parsed.local_window == 8 and parsed.family == "modernbert"


def test_null_local_rope_theta_means_the_global_one(tmp_path: Path) -> None:
    modernbert_config().save_pretrained(tmp_path)
    hub = _hub_spelling(json.loads((tmp_path / "config.json").read_text()))
    hub["local_rope_theta"] = None
    (tmp_path / "config.json").write_text(json.dumps(hub))
    assert load_encoder_config(tmp_path).local_rope_theta == 160_000.0


@pytest.mark.parametrize("change, words", [
    ({"hidden_activation": "swish"}, "unsupported hidden_activation"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling"),
    ({"layer_types": ["full_attention", "chunked"]}, "bad layer_types"),
    ({"num_attention_heads": 5}, "even integer"),
])
def test_unsupported_configs_are_refused_at_load(change: dict, words: str, tmp_path: Path) -> None:
    modernbert_config().save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    raw.update(change)
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelLoadError, match=words):
        load_encoder_config(tmp_path)


@pytest.mark.parametrize("window", [0, 1, 2, 8, 33, 128, 1000])
def test_banded_sliding_window_equals_the_dense_mask(window: int) -> None:
    """The blocked, banded computation against one SDPA with HF's dense rule
    (same sequence and |i - j| <= window // 2), on packed batches with a CUDA
    bucket's padding tokens (position 0 each) at the end."""
    from embedserve.engine.modules.modernbert import sliding_window_from_positions

    rng = np.random.default_rng(window)
    for lengths, padding in (([1], 0), ([5, 40, 1, 17], 0), ([200, 3, 90], 11), ([7] * 9, 3)):
        cu = np.concatenate([[0], np.cumsum(lengths)])
        seq_ids = np.concatenate([np.repeat(np.arange(len(lengths)), lengths),
                                  len(lengths) + np.arange(padding)])       # padding: alone each
        positions = np.concatenate([np.arange(n) for n in lengths] + [np.zeros(padding, dtype=int)])
        tokens = len(positions)
        q, k, v = (torch.from_numpy(rng.standard_normal((tokens, 2, 8)).astype(np.float32))
                   for _ in range(3))
        index = np.arange(tokens)
        dense = ((seq_ids[:, None] == seq_ids[None, :])
                 & (np.abs(index[:, None] - index[None, :]) <= window // 2))
        expected = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
            attn_mask=torch.from_numpy(dense)[None]).transpose(0, 1)
        got = sliding_window_from_positions(torch.from_numpy(positions), window)(q, k, v)
        assert got.shape == expected.shape and cu[-1] + padding == tokens
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_bfloat16_stays_close_to_float32_transformers(embed_dir: Path) -> None:
    """bf16 weights and activations (RoPE rotated in float32, as transformers does)."""
    sequences = _sequences(seed=2)
    with Engine.load(embed_dir, dtype="bfloat16") as engine:
        assert engine.info.dtype == "bfloat16"
        pooled = engine.step(Batch.from_sequences(sequences)).wait()
    for i, reference in enumerate(_reference_states(embed_dir, sequences)):
        assert _cosine(pooled[i], _pool(reference, "mean")) >= 0.999, len(sequences[i])


@pytest.mark.parametrize("window", [2, 8, 33])
def test_local_attention_on_the_kernel_equals_the_banded_window(window: int) -> None:
    """bf16 local layers on the native kernel (the window as a bias by distance) against
    the banded SDPA in float32 on the same bf16 rows: off by no more than torch's own bf16
    SDPA is, and far from attention without the window."""
    from embedserve.engine.modules.modernbert import local_attention, sliding_window_from_positions

    require_native_attention()
    rng = np.random.default_rng(window)
    lengths = [1, 40, 17, 64]
    positions = torch.from_numpy(np.concatenate([np.arange(n) for n in lengths]))
    q, k, v = (torch.from_numpy(rng.standard_normal((len(positions), 4, 32)) * 2).bfloat16() for _ in range(3))
    expected = sliding_window_from_positions(positions, window)(q.float(), k.float(), v.float())
    torch_bf16 = sliding_window_from_positions(positions, window)(q, k, v).float()
    got = local_attention(positions, window)(q, k, v).float()
    assert (got - expected).abs().max() <= 1.25 * (torch_bf16 - expected).abs().max() + 1e-6
    unwindowed = sliding_window_from_positions(positions, 1000)(q.float(), k.float(), v.float())
    assert (unwindowed - expected).abs().max() > 100 * (got - expected).abs().max()


def test_bfloat16_local_layers_take_the_attention_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Head size 32 (the kernel's): every layer's attention in a bf16 step goes to the
    kernel, the local ones with their window as a bias, and the step stays as close to
    transformers (float32) as bf16 allows."""
    require_native_attention()
    model_dir = build_tiny_modernbert(tmp_path / "model", "mean", True, 3, seed=4, hidden=128)
    biases = record_kernel_biases(monkeypatch)
    sequences = _sequences(seed=5)
    with Engine.load(model_dir, dtype="bfloat16") as engine:
        pooled = engine.step(Batch.from_sequences(sequences)).wait()
    assert biases == [False, True, True, False]      # global every 3rd layer: 0 and 3
    for i, reference in enumerate(_reference_states(model_dir, sequences)):
        assert _cosine(pooled[i], _pool(reference, "mean")) >= 0.999, len(sequences[i])


def test_loading_imports_neither_dynamo_nor_sympy(embed_dir: Path) -> None:
    assert slow_imports_after_load(embed_dir) == set()   # as for BERT (test_engine_loading.py)
