"""Decoder embedders (Qwen3, Qwen2, Llama, Mistral) vs transformers, packed, fp32.

The reference runs each sequence alone through transformers' base model
(eager attention, no padding), so a leak between packed sequences, a wrong
rotary position, a GQA head mix-up or a causal-mask error shows up as a diff.
Pass criterion: cosine >= 0.99999 per sequence and a small absolute error.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from decoder_models import VARIANTS, VOCAB_SIZE, build_decoder_dir, hf_reference_model
from embedserve.engine import Batch, Engine
from embedserve.engine.modules.attention import ATTENTION_IMPLS
from embedserve.errors import ModelLoadError
from embedserve.model.info import read_model_info
from engine_imports import slow_imports_after_load

LENGTHS = [1, 2, 7, 33, 17, 128, 300, 512, 3]
MIN_COSINE = 0.99999


def random_sequences(lengths: list[int], vocab: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, size=n).astype(np.int32) for n in lengths]


def reference(model_dir: Path, sequences: list[np.ndarray], pooling: str) -> np.ndarray:
    model = hf_reference_model(model_dir)
    rows = []
    with torch.no_grad():
        for ids in sequences:
            hidden = model(input_ids=torch.from_numpy(ids.astype(np.int64))[None]).last_hidden_state[0]
            rows.append((hidden[-1] if pooling == "lasttoken" else hidden.mean(0)).numpy())
    return np.stack(rows)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def assert_close(ours: np.ndarray, expected: np.ndarray) -> None:
    assert ours.shape == expected.shape and ours.dtype == np.float32
    assert cosines(ours, expected).min() >= MIN_COSINE, cosines(ours, expected)
    assert np.abs(ours - expected).max() <= 1e-4


@pytest.fixture(scope="module")
def decoder_dirs(tmp_path_factory: pytest.TempPathFactory):
    """variant, pooling, causal -> a tiny model directory (built once per module)."""
    built: dict[tuple[str, str, bool], Path] = {}

    def get(variant: str, pooling: str = "lasttoken", causal: bool = True) -> Path:
        key = (variant, pooling, causal)
        if key not in built:
            directory = tmp_path_factory.mktemp(f"{variant}_{pooling}_{'causal' if causal else 'bidi'}")
            built[key] = build_decoder_dir(directory, variant, pooling, causal=causal)
        return built[key]

    return get


@pytest.mark.parametrize("pooling", ["lasttoken", "mean"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_packed_batch_matches_transformers_one_at_a_time(variant: str, pooling: str, decoder_dirs) -> None:
    model_dir = decoder_dirs(variant, pooling)
    sequences = random_sequences(LENGTHS, VOCAB_SIZE, seed=len(variant))
    with Engine.load(model_dir) as engine:
        assert (engine.info.pooling, engine.info.normalize) == (pooling, True)
        ours = engine.step(Batch.from_sequences(sequences)).wait()
    assert_close(ours, reference(model_dir, sequences, pooling))


@pytest.mark.parametrize("variant", ["qwen3", "qwen2"])
@pytest.mark.parametrize("pooling", ["lasttoken", "mean"])
def test_is_causal_false_runs_bidirectional_like_transformers(variant: str, pooling: str,
                                                               decoder_dirs) -> None:
    """``"is_causal": false`` in config.json: every token sees its whole sequence."""
    model_dir = decoder_dirs(variant, pooling, causal=False)
    assert json.loads((model_dir / "config.json").read_text())["is_causal"] is False
    sequences = random_sequences(LENGTHS, VOCAB_SIZE, seed=7)
    with Engine.load(model_dir) as engine:
        assert engine.model.attention_kind.causal is False
        ours = engine.step(Batch.from_sequences(sequences)).wait()
    expected = reference(model_dir, sequences, pooling)
    assert_close(ours, expected)
    # The same weights run causally differ: the reference really is bidirectional.
    causal = reference(decoder_dirs(variant, pooling), sequences, pooling)
    assert cosines(causal[1:], expected[1:]).max() < 0.999


@pytest.mark.parametrize("attention", sorted(ATTENTION_IMPLS))
@pytest.mark.parametrize("variant", ["mistral", "qwen3"])
def test_every_attention_layout_keeps_causality_and_window(variant: str, attention: str,
                                                            decoder_dirs) -> None:
    model_dir = decoder_dirs(variant, "mean")
    sequences = random_sequences([40, 1, 17, 64, 5], VOCAB_SIZE, seed=3)
    with Engine.load(model_dir, attention=attention) as engine:
        ours = engine.step(Batch.from_sequences(sequences)).wait()
    assert_close(ours, reference(model_dir, sequences, "mean"))


def test_sliding_window_is_read_from_mistral_config(decoder_dirs) -> None:
    with Engine.load(decoder_dirs("mistral")) as engine:
        kind = engine.model.attention_kind
    assert (kind.causal, kind.window) == (True, 15)     # keys at distance < sliding_window = 16


def test_decoder_model_info(decoder_dirs) -> None:
    info = read_model_info(decoder_dirs("qwen3_causal_lm"))
    assert (info.architecture, info.task, info.dimension, info.max_positions) == (
        "Qwen3ForCausalLM", "embed", 64, 512)
    assert (info.pooling, info.normalize, info.type_vocab_size) == ("lasttoken", True, 1)
    assert info.prompt("query", "prompt_name").startswith("Instruct: ")
    assert info.prompt("query", "prompt_name").endswith("\nQuery:")


@pytest.mark.parametrize("field, value, message", [
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}, "unsupported rope type"),
    ("hidden_act", "gelu", "unsupported hidden_act"),
    ("num_key_value_heads", 3, "multiple of num_key_value_heads"),
    ("use_sliding_window", True, "use_sliding_window"),
])
def test_unsupported_decoder_configs_are_refused(field: str, value, message: str, decoder_dirs,
                                                 tmp_path: Path) -> None:
    import shutil

    model_dir = shutil.copytree(decoder_dirs("qwen2"), tmp_path / "m")
    config = json.loads((model_dir / "config.json").read_text())
    config[field] = value
    (model_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=message):
        Engine.load(model_dir)


def test_checkpoint_missing_a_projection_is_refused(decoder_dirs, tmp_path: Path) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    model_dir = shutil.copytree(decoder_dirs("qwen3"), tmp_path / "m")
    tensors = load_file(str(model_dir / "model.safetensors"))
    del tensors["layers.1.self_attn.k_proj.weight"]
    save_file(tensors, str(model_dir / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="k_proj"):
        Engine.load(model_dir)


@pytest.mark.parametrize("variant, pooling", [("qwen3", "lasttoken"), ("mistral", "mean"),
                                              ("qwen2", "lasttoken")])
def test_cuda_graph_bucket_forward_equals_unpadded(variant: str, pooling: str, decoder_dirs) -> None:
    """The static-shape forward CUDA graphs capture, run on CPU: padding changes nothing."""
    from embedserve.engine.graphs.buckets import bucket_forward, bucket_inputs
    from embedserve.engine.graphs.shapes import bucket_for

    with Engine.load(decoder_dirs(variant, pooling)) as engine:
        # [512, 512, 3] (bucket 1280 x 4) takes the padded-rows layout, the rest block-diagonal
        for lengths in ([3, 50, 7], [300, 5, 1, 1, 12], [1], [512, 512, 3], [40] * 9):
            batch = Batch.from_sequences(random_sequences(lengths, VOCAB_SIZE, seed=len(lengths)))
            expected = engine.step(batch).wait()
            key = bucket_for(batch.num_tokens, batch.num_sequences)
            flat = torch.from_numpy(bucket_inputs(batch, key, engine.config.position_offset))
            with torch.inference_mode():
                got = bucket_forward(engine.model, flat, key, engine.info.pooling)
            assert got.shape[0] == key.sequences + 1
            assert np.abs(got[:len(lengths)].numpy() - expected).max() <= 1e-5
            assert not got[len(lengths):key.sequences].any()        # padding rows pool to zeros


def test_config_without_architectures_falls_back_on_model_type(decoder_dirs, tmp_path: Path) -> None:
    import shutil

    model_dir = shutil.copytree(decoder_dirs("qwen2"), tmp_path / "m")
    config = json.loads((model_dir / "config.json").read_text())
    del config["architectures"]
    (model_dir / "config.json").write_text(json.dumps(config))
    assert read_model_info(model_dir).architecture == "Qwen2Model"


def test_two_pooling_modes_at_once_are_refused(decoder_dirs, tmp_path: Path) -> None:
    import shutil

    model_dir = shutil.copytree(decoder_dirs("qwen3"), tmp_path / "m")
    pooling = model_dir / "1_Pooling" / "config.json"
    pooling.write_text(json.dumps({"pooling_mode_lasttoken": True, "pooling_mode_mean_tokens": True}))
    with pytest.raises(ModelLoadError, match="unsupported pooling"):
        read_model_info(model_dir)


# config.json fields as the hub's checkpoints spell them (rope_theta / rope_scaling at the
# top level, null where unused), at their real sizes; parsed only, no weights.
HUB_CONFIGS = {
    "Qwen3-Embedding-0.6B": dict(
        architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=1024, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, intermediate_size=3072, num_hidden_layers=28,
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000, rope_scaling=None,
        sliding_window=None, use_sliding_window=False, max_window_layers=28, tie_word_embeddings=True,
        attention_bias=False, hidden_act="silu", vocab_size=151669),
    "gte-Qwen2-1.5B-instruct": dict(
        architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=1536, num_attention_heads=12,
        num_key_value_heads=2, intermediate_size=8960, num_hidden_layers=28, max_position_embeddings=131072,
        rms_norm_eps=1e-6, rope_theta=1000000.0, sliding_window=131072, use_sliding_window=False,
        max_window_layers=21, hidden_act="silu", vocab_size=151646),
    "e5-mistral-7b-instruct": dict(
        architectures=["MistralModel"], model_type="mistral", hidden_size=4096, num_attention_heads=32,
        num_key_value_heads=8, intermediate_size=14336, num_hidden_layers=32, max_position_embeddings=32768,
        rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=4096, hidden_act="silu", vocab_size=32000),
}


@pytest.mark.parametrize("name, expected", [
    ("Qwen3-Embedding-0.6B", dict(family="qwen3", head_dim=128, num_kv_heads=8, qk_norm=True, qkv_bias=False,
                                  rope_theta=1e6, causal=True, attention_window=None)),
    ("gte-Qwen2-1.5B-instruct", dict(family="qwen2", head_dim=128, num_kv_heads=2, qk_norm=False, qkv_bias=True,
                                     out_bias=False, causal=True, attention_window=None)),
    ("e5-mistral-7b-instruct", dict(family="mistral", head_dim=128, qkv_bias=False, causal=True,
                                    attention_window=4095)),
])
def test_hub_shaped_configs_parse(name: str, expected: dict, tmp_path: Path) -> None:
    from embedserve.model.config import load_model_config

    (tmp_path / "config.json").write_text(json.dumps(HUB_CONFIGS[name]))
    config = load_model_config(tmp_path)
    assert {key: getattr(config, key) for key in expected} == expected


def test_loading_imports_neither_dynamo_nor_sympy(decoder_dirs) -> None:
    dirs = [decoder_dirs(variant) for variant in VARIANTS]
    assert slow_imports_after_load(*dirs) == set()   # as for BERT (test_engine_loading.py)
