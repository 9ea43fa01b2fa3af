"""Small steps' flat loop (engine/small_steps.py) against transformers.

References: sentence-transformers (float32) on the default model's real queries, and
transformers' BertModel (float32) on a random BERT with CLS pooling and token types.
The bar is the general bf16 path's own distance to the same reference: the flat loop
runs the same kernels in the same order, so it may be no further off (in fact it gives
the same bits). Also which models and steps take it. Runs where the native bf16
attention and add + LayerNorm kernels run (AVX512-BF16 CPUs); elsewhere there is no
flat loop to test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import build_tiny_model
from embedserve.engine import Batch, Engine
from embedserve.engine.modules import bf16_attention
from embedserve.engine.residual_norm import kernel_available as norm_kernel_available
from embedserve.engine.small_steps import SMALL_STEP_TOKENS, SmallStepForward
from family_models import VOCAB_SIZE, build_family_dir, model_class
from st_metadata import write_st_metadata

QUERIES = ["how do I bake bread?", "¿Dónde está la estación de tren más cercana?", "東京の天気は？",
           "Boiling point of water at altitude?",
           "Как сбросить пароль?", "query"]


@pytest.fixture(autouse=True)
def kernels() -> None:
    if not (bf16_attention.kernel_available() and norm_kernel_available()):
        pytest.skip("the native bf16 attention / add + LayerNorm kernels do not run here")


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def default_engines(default_model_dir: Path):
    with (Engine.load(default_model_dir, dtype="bfloat16") as flat,
          Engine.load(default_model_dir, dtype="bfloat16", small_steps=False) as general):
        yield flat, general


def test_default_model_queries_match_sentence_transformers(default_engines, default_model_dir: Path) -> None:
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    flat, general = default_engines
    assert flat._runner._small is not None and general._runner._small is None
    tokenizer = Tokenizer.from_file(str(default_model_dir / "tokenizer.json"))
    texts = ["query: " + text for text in QUERIES]
    ids = [np.array(encoding.ids, dtype=np.int32) for encoding in tokenizer.encode_batch(texts)]
    reference = SentenceTransformer(str(default_model_dir), device="cpu").encode(
        texts, normalize_embeddings=False, convert_to_numpy=True)
    one_at_a_time = np.concatenate([flat.step(Batch.from_sequences([row])).wait() for row in ids])
    assert sum(len(row) for row in ids[:4]) <= SMALL_STEP_TOKENS
    together = np.concatenate([flat.step(Batch.from_sequences(ids[:4])).wait(),   # several in one step
                               one_at_a_time[4:]])
    bar = cosines(np.concatenate([general.step(Batch.from_sequences([row])).wait() for row in ids]), reference)
    assert bar.min() >= 0.999
    for ours in (one_at_a_time, together):
        assert (cosines(ours, reference) >= bar - 1e-6).all(), (cosines(ours, reference), bar)


def test_steps_over_the_limit_take_the_general_path(default_engines) -> None:
    flat, _ = default_engines
    small = flat._runner._small
    assert small.covers(Batch.from_sequences([np.arange(5, 5 + SMALL_STEP_TOKENS, dtype=np.int32)]))
    assert not small.covers(Batch.from_sequences([np.arange(5, 6 + SMALL_STEP_TOKENS, dtype=np.int32)]))


@pytest.fixture(scope="module")
def cls_bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random BERT with head size 32 (the attention kernel's), two token types, CLS pooling."""
    directory = build_tiny_model(tmp_path_factory.mktemp("cls_bert"), "BertModel", None, seed=3,
                                 hidden_size=64, num_attention_heads=2, intermediate_size=128,
                                 max_position_embeddings=128)
    write_st_metadata(directory, 64, "cls", False)
    return directory


def test_cls_pooling_and_token_types_match_transformers(cls_bert_dir: Path) -> None:
    import transformers

    rng = np.random.default_rng(7)
    lengths = [6, 1, 13, 9]
    ids = [rng.integers(5, 250_000, n).astype(np.int32) for n in lengths]
    types = [rng.integers(0, 2, n).astype(np.int32) for n in lengths]
    model = transformers.BertModel.from_pretrained(cls_bert_dir).eval()
    with torch.inference_mode():
        reference = np.concatenate([
            model(input_ids=torch.from_numpy(row.astype(np.int64))[None],
                  token_type_ids=torch.from_numpy(kind.astype(np.int64))[None]).last_hidden_state[:, 0].numpy()
            for row, kind in zip(ids, types)])
    batch = Batch(np.concatenate(ids), np.r_[0, np.cumsum(lengths)].astype(np.int32), np.concatenate(types))
    with (Engine.load(cls_bert_dir, dtype="bfloat16") as flat,
          Engine.load(cls_bert_dir, dtype="bfloat16", small_steps=False) as general):
        assert isinstance(flat._runner._small, SmallStepForward)
        ours, bar = flat.step(batch).wait(), general.step(batch).wait()
    assert cosines(bar, reference).min() >= 0.99
    assert (cosines(ours, reference) >= cosines(bar, reference) - 1e-6).all()


def test_other_models_and_dtypes_keep_the_general_path(cls_bert_dir: Path, tiny_reranker_dir: Path,
                                                      tmp_path: Path) -> None:
    with Engine.load(cls_bert_dir, dtype="float32") as fp32, Engine.load(tiny_reranker_dir, dtype="bfloat16") as head:
        assert fp32._runner._small is None      # float32: no native attention kernel
        assert head._runner._small is None      # a scoring head
    # A family whose forward adds to BERT's (DeBERTa's disentangled attention) would lose
    # it in the flat loop. hidden 128 over 4 heads: a head size the native attention kernel takes.
    with Engine.load(build_family_dir(tmp_path / "deberta", "deberta-v2", hidden_size=128, pooler_hidden_size=128),
                     dtype="bfloat16") as engine:
        assert engine._runner._small is None


def test_mpnet_takes_the_flat_loop_with_its_relative_bias(tmp_path: Path) -> None:
    """MPNet's bias in every layer's scores, on the attention kernel: the flat loop gives
    the general path's bits, as close to transformers (float32) as bf16 allows, and
    closer than the same model without its bias would be."""
    directory = build_family_dir(tmp_path / "mpnet", "mpnet", hidden_size=128, pooler_hidden_size=128)
    rng = np.random.default_rng(11)
    lengths = [6, 1, 20, 30]            # buckets go logarithmic past 8 tokens
    ids = [rng.integers(5, VOCAB_SIZE, n).astype(np.int32) for n in lengths]
    model = model_class("mpnet").from_pretrained(directory, attn_implementation="eager").eval()

    def reference() -> np.ndarray:
        with torch.no_grad():
            return np.stack([model(input_ids=torch.from_numpy(row.astype(np.int64))[None]).last_hidden_state[0]
                             .mean(0).numpy() for row in ids])

    with_bias = reference()
    model.encoder.relative_attention_bias.weight.data.zero_()
    without_bias = reference()
    batch = Batch.from_sequences(ids)
    with (Engine.load(directory, dtype="bfloat16") as flat,
          Engine.load(directory, dtype="bfloat16", small_steps=False) as general):
        assert isinstance(flat._runner._small, SmallStepForward) and general._runner._small is None
        ours = flat.step(batch).wait()
        np.testing.assert_array_equal(ours, general.step(batch).wait())
        one_at_a_time = np.concatenate([flat.step(Batch.from_sequences([row])).wait() for row in ids])
    longer = np.array(lengths) > 1      # one token: its one score's bias cannot move a softmax
    for got in (ours, one_at_a_time):
        assert cosines(got, with_bias).min() >= 0.9999
        off, off_without_bias = 1 - cosines(got, with_bias), 1 - cosines(got, without_bias)
        assert (off_without_bias[longer] > 10 * off[longer]).all(), (off, off_without_bias)


def test_int8_queries_take_the_flat_loop_and_stay_close_to_transformers(minilm_dir: Path) -> None:
    """``--dtype int8`` (calibrated as a replica is) on the real all-MiniLM-L6-v2: short
    queries, one per step, through the flat loop (the int8 linears on their few-row kernel
    where it runs), against transformers in float32 (the issue's bar for int8: cosine >=
    0.99) and against the same int8 model's general path (the same calls, the same bits)."""
    import tokenizers

    from embedserve.engine import int8_linear
    from embedserve.scheduler.engine_loading import load_engine
    from tests.test_engine_parity import hf_model, reference

    tokenizer = tokenizers.Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tokenizer.no_padding()
    ids = [np.array(encoding.ids, dtype=np.int32) for encoding in tokenizer.encode_batch(QUERIES)]
    expected = reference(hf_model(minilm_dir), ids, "mean")
    with load_engine(minilm_dir, "cpu", "int8") as engine:
        small = engine._runner._small
        assert isinstance(small, SmallStepForward) and engine.info.dtype == "int8"
        assert (small._pointers is not None) == int8_linear.kernel_available()
        ours = np.concatenate([engine.step(Batch.from_sequences([row])).wait() for row in ids])
        engine._runner._small = None                 # the general path, on the same weights
        general = np.concatenate([engine.step(Batch.from_sequences([row])).wait() for row in ids])
    assert cosines(ours, expected).min() >= 0.99, cosines(ours, expected)
    assert np.abs(ours - expected).max() > 1e-3      # int8's answer, not float32's
    assert cosines(ours, general).min() >= 0.99999, cosines(ours, general)


def test_the_avx512_bf16_kernel_takes_the_pointer_loop_too(default_model_dir: Path, default_engines,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the bf16 linears run on bf16_linear.c (AVX512-BF16 without AMX: AMD Zen 4)
    the flat loop calls them on data pointers as it does the AMX kernel. Made to happen on
    an AMX CPU by hiding the AMX kernel at load; the vectors must be the general path's
    (AMX, oneDNN) within bf16's rounding."""
    from embedserve.engine import amx_linear, bf16_linear

    if not bf16_linear.kernel_runs_here():
        pytest.skip("the AVX512-BF16 linear cannot run here")
    monkeypatch.setattr(bf16_linear, "kernel_available", lambda: True)
    monkeypatch.setattr(amx_linear, "kernel_available", lambda: False)
    rng = np.random.default_rng(3)
    sequences = [rng.integers(5, 200_000, n).astype(np.int32) for n in (6, 20, 64)]
    _, general = default_engines
    with Engine.load(default_model_dir, dtype="bfloat16") as engine:
        small = engine._runner._small
        assert isinstance(small, SmallStepForward) and small._pointers is not None
        assert small._layers[0].qkv.kernel is bf16_linear
        for row in sequences:
            batch = Batch.from_sequences([row])
            ours, bar = engine.step(batch).wait(), general.step(batch).wait()
            assert cosines(ours, bar).min() >= 0.9999


ONE_THREAD_STEPS = r"""
import json, os, sys, threading
import numpy as np, torch
torch.set_num_threads(2)
from embedserve.engine import Batch, Engine, bf16_linear

def native_not_python() -> set[int]:
    python = {t.native_id for t in threading.enumerate()}
    return {int(tid) for tid in os.listdir("/proc/self/task")} - python

def named(tids: set[int]) -> list[str]:
    return sorted(open(f"/proc/self/task/{tid}/comm").read().strip() for tid in tids)

batch = Batch.from_sequences([[0, 3642, 47, 2, 6], [0, 1300, 19, 4, 5, 77, 2]])

def on_a_new_thread(engine: Engine) -> tuple[list, list[str]]:
    # A thread that has run no OpenMP region: a region of two threads starts its worker.
    out: list = []
    def step() -> None:
        before = native_not_python()
        rows = engine.step(batch, inline=True).wait(60)
        # threads that appeared (one that ended meanwhile does not offset one that started)
        out.append((rows.tolist(), named(native_not_python() - before)))
    thread = threading.Thread(target=step)
    thread.start()
    thread.join(60)
    return out[0]

with (Engine.load(sys.argv[1], dtype="bfloat16", small_step_threads=1) as one,
      Engine.load(sys.argv[1], dtype="bfloat16") as shared):
    assert one._runner._small is not None and shared._runner._small is not None
    rows_one, workers_one = on_a_new_thread(one)
    rows_shared, workers_shared = on_a_new_thread(shared)
    print(json.dumps({"same_rows": rows_one == rows_shared, "workers_one": workers_one,
                      "workers_shared": workers_shared,
                      "helper": bf16_linear.kernel_available()}))
"""


def test_small_steps_on_one_thread_start_no_openmp_worker_and_give_the_same_rows(default_model_dir: Path) -> None:
    """What a replica runs (scheduler/settings.py, REPLICA_SMALL_STEP_THREADS): the flat
    loop's kernels on one thread start no OpenMP worker, where the same step on the
    thread's two starts one; on the AVX512-BF16 kernel the linears take its helper thread
    instead. The rows are the same bits (the kernels split rows and columns between
    threads, never a sum)."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="2")
    done = subprocess.run([sys.executable, "-c", ONE_THREAD_STEPS, str(default_model_dir)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    # One thread's step starts no OpenMP worker; where bf16_linear's kernel runs the
    # linears, its helper thread (csrc/helper_team.h) takes a share of each, once started.
    helper = ["embedserve-help"] if found["helper"] else []
    assert found["same_rows"] and found["workers_one"] == helper, found
    assert len(found["workers_shared"]) == 1 and found["workers_shared"] != ["embedserve-help"], found
