"""MPNet, DistilBERT, RoBERTa, DeBERTa-v2, NomicBERT and Gemma3 in the engine, against
transformers and sentence-transformers.

Tiny random checkpoints written here by transformers' own classes
(tests/family_models.py). The engine runs one packed batch of lengths 1 ... 100
(fused CPU layers where the family has them); the reference runs each sequence
alone. NomicBERT's reference is transformers' ``NomicBertModel`` (native since
transformers 5, which also reads and writes the hub checkpoints' weight names);
its hub-spelled ``config.json`` (remote code's ``n_embd`` ...) is checked to give
the very same model.
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
from embedserve.engine.modules import deberta_v2, mpnet
from embedserve.engine.modules.attention import ATTENTION_IMPLS
from embedserve.engine.modules.layout import build_layout
from embedserve.model.config import load_model_config
from embedserve.model.postprocess import postprocess_embeddings
from embedserve.tokenizer.load import load_tokenizer
from family_models import (
    CORPUS,
    FAMILIES,
    HIDDEN,
    QUERY_PROMPT,
    VOCAB_SIZE,
    build_embeddinggemma_dir,
    build_family_dir,
    model_class,
)
from native_attention import record_kernel_biases, require_native_attention

LENGTHS = [1, 3, 9, 17, 40, 100, 25]
TEXTS = CORPUS + ["x", "Ünïcödé café 🙂 and byte fallback", "word " * 24 + "a long one, past every window"]


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {family: build_family_dir(tmp_path_factory.mktemp(family.replace("-", "_")), family)
            for family in FAMILIES}


@pytest.fixture(scope="module")
def reranker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Like mxbai-rerank-base-v1: a one-label DebertaV2ForSequenceClassification."""
    return build_family_dir(tmp_path_factory.mktemp("deberta_reranker"), "deberta-v2", reranker=True, seed=1)


@pytest.fixture(scope="module")
def embeddinggemma_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_embeddinggemma_dir(tmp_path_factory.mktemp("embeddinggemma") / "model")


def _sequences(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    # ids from 5 up: never a special, never the padding id MPNet / RoBERTa count positions by
    return [rng.integers(5, VOCAB_SIZE, size=n).astype(np.int32) for n in LENGTHS]


def _reference_states(family: str, model_dir: Path, sequences: list[np.ndarray], **config) -> list[torch.Tensor]:
    model = model_class(family).from_pretrained(model_dir, attn_implementation="eager", **config).eval()
    with torch.no_grad():
        return [model(input_ids=torch.from_numpy(s.astype(np.int64))[None]).last_hidden_state[0]
                for s in sequences]


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _token_states(engine: Engine, batch: Batch, attention: str = "per_sequence") -> torch.Tensor:
    layout = build_layout(batch.cu_seqlens)
    with torch.inference_mode():
        return engine.model(torch.from_numpy(batch.token_ids.astype(np.int64)),
                            layout.offsets_tensor + engine.config.position_offset,
                            torch.zeros(batch.num_tokens, dtype=torch.int64), ATTENTION_IMPLS[attention](layout))


@pytest.mark.parametrize("family", FAMILIES)
def test_packed_batch_matches_transformers(family: str, family_dirs: dict[str, Path]) -> None:
    model_dir = family_dirs[family]
    sequences = _sequences()
    batch = Batch.from_sequences(sequences)
    expected = _reference_states(family, model_dir, sequences)
    with Engine.load(model_dir) as engine:
        assert engine.info.pooling == "mean" and engine.info.dimension == HIDDEN
        pooled = engine.step(batch).wait()
        states = _token_states(engine, batch)
    for i, (sequence, reference) in enumerate(zip(sequences, expected)):
        assert _cosine(pooled[i], reference.mean(0).numpy()) >= 0.99999, (i, len(sequence))
        start = int(batch.cu_seqlens[i])
        assert torch.allclose(states[start:start + len(sequence)], reference, atol=3e-5, rtol=1e-4), len(sequence)


def test_gemma3_windows_in_every_attention_layout(family_dirs: dict[str, Path]) -> None:
    """Gemma3's sliding layers ask the runner's attention for a window (``kind=``): every
    CPU layout gives transformers' token states."""
    sequences = _sequences(1)
    batch = Batch.from_sequences(sequences)
    expected = torch.cat(_reference_states("gemma3", family_dirs["gemma3"], sequences))
    with Engine.load(family_dirs["gemma3"]) as engine:
        for attention in sorted(ATTENTION_IMPLS):
            assert torch.allclose(_token_states(engine, batch, attention), expected, atol=3e-5, rtol=1e-4)


def test_the_references_can_tell_what_is_modelled(family_dirs: dict[str, Path]) -> None:
    """The parity above can fail: without MPNet's bias, with Gemma3's window ignored or
    with DeBERTa's position-to-content term dropped, token states differ by far more
    than its tolerance."""
    long = [_sequences()[LENGTHS.index(100)]]

    def states(family: str, **config) -> torch.Tensor:
        return _reference_states(family, family_dirs[family], long, **config)[0]

    assert (states("gemma3") - states("gemma3", sliding_window=1024)).abs().max() > 1e-2
    assert (states("deberta-v2") - states("deberta-v2", pos_att_type=["c2p"])).abs().max() > 1e-2
    model = model_class("mpnet").from_pretrained(family_dirs["mpnet"]).eval()
    ids = torch.from_numpy(long[0].astype(np.int64))[None]
    with torch.no_grad():
        with_bias = model(input_ids=ids).last_hidden_state[0]
        model.encoder.relative_attention_bias.weight.zero_()
        without = model(input_ids=ids).last_hidden_state[0]
    assert (with_bias - without).abs().max() > 1e-2


def test_mpnet_in_bf16_adds_its_bias_on_the_attention_kernel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On CPUs that run the native bf16 attention, MPNet's layers take it with the bias
    by distance (mpnet.per_sequence_native): as close to transformers (float32) as the
    SDPA path it replaced (per_sequence_biased, in bf16)."""
    require_native_attention()
    model_dir = build_family_dir(tmp_path / "mpnet", "mpnet", hidden_size=128, pooler_hidden_size=128)  # head size 32
    sequences = _sequences()
    batch = Batch.from_sequences(sequences)
    expected = np.stack([states.mean(0).numpy() for states in _reference_states("mpnet", model_dir, sequences)])
    biased_calls = record_kernel_biases(monkeypatch)
    with Engine.load(model_dir, dtype="bfloat16", small_steps=False) as engine:
        native = engine.step(batch).wait()
        assert biased_calls and all(biased_calls)
        engine.model.native_attention = False
        sdpa = engine.step(batch).wait()
        assert len(biased_calls) == 3             # one per layer, none in the second step
    off = np.array([1 - _cosine(a, b) for a, b in zip(native, expected)])
    bar = np.array([1 - _cosine(a, b) for a, b in zip(sdpa, expected)])
    assert off.max() <= 1e-4 and off.max() <= 2 * bar.max() + 1e-6, (off, bar)


def test_nomic_bert_hub_config_spelling_is_the_same_model(family_dirs: dict[str, Path], tmp_path: Path) -> None:
    """nomic-embed-text's config.json as the hub ships it (the remote code's GPT-2 style
    names) loads as the transformers-spelled one it was converted from."""
    source = family_dirs["nomic-bert"]
    raw = json.loads((source / "config.json").read_text())
    hub = {"architectures": ["NomicBertModel"], "model_type": "nomic_bert", "activation_function": "swiglu",
           "n_embd": raw["hidden_size"], "n_head": raw["num_attention_heads"], "n_inner": raw["intermediate_size"],
           "n_layer": raw["num_hidden_layers"], "n_positions": raw["max_position_embeddings"],
           "vocab_size": raw["vocab_size"], "type_vocab_size": raw["type_vocab_size"], "layer_norm_epsilon": 1e-12,
           "rotary_emb_base": raw["rope_parameters"]["rope_theta"], "rotary_emb_fraction": 1.0,
           "rotary_emb_interleaved": False, "rotary_scaling_factor": None, "prenorm": False,
           "qkv_proj_bias": False, "mlp_fc1_bias": False, "mlp_fc2_bias": False}
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((source / name).read_bytes())
    (tmp_path / "config.json").write_text(json.dumps(hub))
    batch = Batch.from_sequences(_sequences(2))
    with Engine.load(source) as a, Engine.load(tmp_path) as b:
        assert a.config == b.config
        np.testing.assert_array_equal(a.step(batch).wait(), b.step(batch).wait())


@pytest.mark.parametrize("family", FAMILIES)
def test_padded_bucket_forward_equals_unpadded(family: str, family_dirs: dict[str, Path]) -> None:
    """The CUDA-graph input layout (padding tokens at the first position, a dump row)
    on CPU: padding never leaks into a sequence, whatever brings the family's attention."""
    rng = np.random.default_rng(3)
    with Engine.load(family_dirs[family]) as engine:
        for lengths in ([1], [7, 40, 1, 1], [30] * 5):
            sequences = [rng.integers(5, VOCAB_SIZE, size=n).astype(np.int32) for n in lengths]
            batch = Batch.from_sequences(sequences)
            expected = engine.step(batch).wait()
            key = bucket_for(batch.num_tokens, batch.num_sequences)
            flat = torch.from_numpy(bucket_inputs(batch, key, engine.config.position_offset))
            with torch.inference_mode():
                got = bucket_forward(engine.model, flat, key, engine.info.pooling)[:len(lengths)]
            assert np.abs(got.numpy() - expected).max() <= 2e-5


def _bucket_offsets(lengths: list[int], padding: int) -> torch.Tensor:
    batch = Batch.from_sequences([np.zeros(n, np.int32) for n in lengths])
    key = bucket_for(batch.num_tokens + padding, batch.num_sequences)
    inputs = torch.from_numpy(bucket_inputs(batch, key, 0))
    return inputs[key.tokens:2 * key.tokens]          # position ids: the bucket's padding at 0


def test_static_shape_attention_of_mpnet_and_deberta_equals_per_sequence(family_dirs: dict[str, Path]) -> None:
    """The block-diagonal forms (what a CUDA graph captures: no host sync) against the
    per-sequence forms the CPU runs, padding tokens included."""
    torch.manual_seed(0)
    offsets = _bucket_offsets([7, 40, 1, 19], padding=5)
    tokens, heads, hd = offsets.shape[0], 4, 16
    q, k, v = (torch.randn(tokens, heads, hd) for _ in range(3))
    table = torch.randn(32, heads)
    np.testing.assert_allclose(mpnet.block_diagonal_biased(offsets, table)(q, k, v).numpy(),
                               mpnet.per_sequence_biased(offsets, table)(q, k, v).numpy(), atol=1e-5)
    config = load_model_config(family_dirs["deberta-v2"])
    pos_q, pos_k = torch.randn(2, 2 * config.attention_span, heads, hd)
    block = deberta_v2.block_diagonal_disentangled(offsets, config)(pos_q, pos_k)(q, k, v)
    per_sequence = deberta_v2.per_sequence_disentangled(offsets, config)(pos_q, pos_k)(q, k, v)
    np.testing.assert_allclose(block.numpy(), per_sequence.numpy(), atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_our_tokenizer_and_engine_match_sentence_transformers(family: str, family_dirs: dict[str, Path]) -> None:
    """Transformer + Pooling + Normalize loaded by sentence-transformers from the same
    directory; our side tokenizes with embedserve's own tokenizer of that directory:
    native for WordPiece and Unigram, the ``tokenizers`` library for byte-level BPE and
    byte-fallback BPE (ids checked against transformers' tokenizer first)."""
    import transformers
    from sentence_transformers import SentenceTransformer

    model_dir = family_dirs[family]
    tokenizer = load_tokenizer(model_dir)
    native = {"mpnet": "native-wordpiece", "distilbert": "native-wordpiece", "nomic-bert": "native-wordpiece",
              "deberta-v2": "native-unigram"}
    assert tokenizer.backend == native.get(family, "tokenizers")
    sequences = [tokenizer.encode(text).astype(np.int32) for text in TEXTS]
    reference_ids = transformers.AutoTokenizer.from_pretrained(model_dir)(TEXTS)["input_ids"]
    assert [s.tolist() for s in sequences] == reference_ids
    expected = SentenceTransformer(str(model_dir), device="cpu").encode(TEXTS, batch_size=4, convert_to_numpy=True)
    with Engine.load(model_dir) as engine:
        got = postprocess_embeddings(engine.step(Batch.from_sequences(sequences)).wait(),
                                     normalize=engine.info.normalize)
    assert ((got * expected).sum(1)).min() >= 0.99999
    assert np.abs(got - expected).max() < 1e-4


def test_embeddinggemma_dense_modules_and_prompts_match_sentence_transformers(embeddinggemma_dir: Path) -> None:
    """Two Dense modules (Identity 64 -> 128, Tanh with bias 128 -> 48) after mean pooling,
    then Normalize; ``prompt_name="query"`` as encode() prepends it."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(embeddinggemma_dir), device="cpu")
    tokenizer = load_tokenizer(embeddinggemma_dir)
    with Engine.load(embeddinggemma_dir) as engine:
        assert engine.info.dimension == 48 and engine.info.normalize
        for prompt_name in (None, "query"):
            prompt = engine.info.prompt(prompt_name, "prompt_name")
            assert prompt == ("" if prompt_name is None else QUERY_PROMPT)
            sequences = [tokenizer.encode(prompt + text).astype(np.int32) for text in TEXTS]
            got = postprocess_embeddings(engine.step(Batch.from_sequences(sequences)).wait(), normalize=True)
            expected = st.encode(TEXTS, prompt_name=prompt_name, convert_to_numpy=True)
            assert got.shape == (len(TEXTS), 48)
            assert ((got * expected).sum(1)).min() >= 0.99999, prompt_name
            assert np.abs(got - expected).max() < 1e-5


def test_deberta_reranker_probabilities_match_cross_encoder(reranker_dir: Path) -> None:
    """sigmoid(our logit) of each (query, document) pair against sentence-transformers'
    CrossEncoder.predict (sigmoid of transformers' logit for one label), within 1e-5."""
    from sentence_transformers import CrossEncoder

    query = "Where is the Eiffel tower?"
    pairs = [(query, doc) for doc in TEXTS]
    expected = CrossEncoder(str(reranker_dir), device="cpu").predict(pairs, batch_size=4)
    tokenizer = load_tokenizer(reranker_dir)
    sequences = [tokenizer.encode_pair(a, b).astype(np.int32) for a, b in pairs]
    with Engine.load(reranker_dir) as engine:
        assert engine.info.task == "score" and engine.info.pooling == "cls"
        logits = engine.step(Batch.from_sequences(sequences, "score")).wait()
    probabilities = 1 / (1 + np.exp(-logits.astype(np.float64)))
    assert np.abs(probabilities - expected).max() <= 1e-5
    # The logits too (a random head puts every probability near 0.03, where they move
    # slowly), and they differ between documents: a real ranking.
    expected_logits = np.log(expected / (1 - expected.astype(np.float64)))
    assert np.abs(logits - expected_logits).max() <= 1e-4
    assert np.ptp(logits) > 0.1, logits


REFUSED = [
    ("deberta-v2", {"conv_kernel_size": 3}, "conv_kernel_size"),
    ("deberta-v2", {"share_att_key": False}, "share_att_key"),
    ("nomic-bert", {"prenorm": True}, "prenorm"),
    ("nomic-bert", {"rotary_scaling_factor": 2.0}, "rotary_scaling_factor"),
    ("gemma3", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
]


@pytest.mark.parametrize("family, change, named", REFUSED)
def test_unsupported_variants_are_refused_at_load_with_the_field_named(
        family: str, change: dict, named: str, family_dirs: dict[str, Path], tmp_path: Path) -> None:
    from embedserve.errors import ModelLoadError

    raw = json.loads((family_dirs[family] / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, **change}))
    with pytest.raises(ModelLoadError, match=named):
        load_model_config(tmp_path)


def test_a_dense_module_with_an_unsupported_activation_is_refused(embeddinggemma_dir: Path,
                                                                   tmp_path: Path) -> None:
    import shutil

    from embedserve.errors import ModelLoadError
    from embedserve.model.info import read_model_info

    copy = tmp_path / "model"
    shutil.copytree(embeddinggemma_dir, copy)
    dense_config = copy / "3_Dense" / "config.json"
    raw = json.loads(dense_config.read_text())
    dense_config.write_text(json.dumps({**raw, "activation_function": "torch.nn.modules.activation.ReLU"}))
    with pytest.raises(ModelLoadError, match="activation_function"):
        read_model_info(copy)
