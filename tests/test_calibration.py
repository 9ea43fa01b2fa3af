"""embedserve.calibration: one calibration per model and dtype, written once, read everywhere.

The sample is checked against sentence-transformers encoding the same texts
with the same tiny model; ranges against quantize_embeddings' own
calibration path; storage for first-writer-wins and for never recomputing
what a file already holds.
"""

from __future__ import annotations

import shutil
import threading

import numpy as np
import pytest
from sentence_transformers.util.quantization import quantize_embeddings

from embedserve import calibration
from embedserve.engine import Engine
from embedserve.engine.batch import Batch
from embedserve.model.calibration_texts import CALIBRATION_TEXTS, TEXTS_ID
from embedserve.model.info import read_model_info
from embedserve.model.postprocess import postprocess_embeddings
from embedserve.model.quantize import quantize


@pytest.fixture(scope="module")
def xlmr_engine(tiny_xlmr_dir):
    with Engine.load(tiny_xlmr_dir) as engine:
        yield engine


def _embed_with(engine):
    return lambda tokens: engine.step(Batch.of(tokens)).wait()


def test_sample_is_the_models_pooled_vectors_of_the_fixed_texts(tmp_path, tiny_xlmr_dir, xlmr_engine):
    from sentence_transformers import SentenceTransformer

    directory = calibration.calibration_dir(tmp_path, tiny_xlmr_dir, "float32")
    found = calibration.load_or_calibrate(directory, tiny_xlmr_dir, xlmr_engine.info,
                                          _embed_with(xlmr_engine), max_tokens=256, max_sequences=16)
    # No prompts on this model: each text once, in order.
    assert found.sample.shape == (len(CALIBRATION_TEXTS), 32)
    reference = SentenceTransformer(str(tiny_xlmr_dir), device="cpu").encode(
        list(CALIBRATION_TEXTS), convert_to_numpy=True, batch_size=64)
    cos = (found.sample * reference).sum(1) / (np.linalg.norm(found.sample, axis=1)
                                               * np.linalg.norm(reference, axis=1))
    assert np.median(cos) > 0.99999 and (cos > 0.999).mean() > 0.95
    assert found.sample_size == len(CALIBRATION_TEXTS) and len(found.calibration_id) == 16


def test_prompted_model_embeds_each_text_under_each_prompt(tiny_bert_dir):
    info = read_model_info(tiny_bert_dir)
    batches = calibration.calibration_batches(tiny_bert_dir, info, max_tokens=128, max_sequences=8)
    assert sum(b.num_sequences for b in batches) == 2 * len(CALIBRATION_TEXTS)
    assert all(b.num_tokens <= 128 and b.num_sequences <= 8 for b in batches)


@pytest.mark.parametrize("dimensions, normalize", [(None, True), (None, False), (7, True), (20, False)])
def test_ranges_quantize_as_sentence_transformers_calibration(tmp_path, dimensions, normalize):
    rng = np.random.default_rng(1)
    sample = rng.standard_normal((50, 24)).astype(np.float32)
    stored = calibration.store_calibration(tmp_path / "c", sample, tmp_path, read_info_stub())
    processed = postprocess_embeddings(sample, normalize, dimensions)
    queries = postprocess_embeddings(rng.standard_normal((9, 24)).astype(np.float32), normalize, dimensions)
    ranges = stored.ranges(dimensions, normalize)
    for precision in ("int8", "uint8"):
        expected = quantize_embeddings(queries, precision, calibration_embeddings=processed)
        assert quantize(queries, precision, ranges).tobytes() == expected.tobytes()


def test_first_writer_wins_and_files_are_never_rewritten(tmp_path):
    directory = tmp_path / "c"
    first = np.ones((3, 4), dtype=np.float32)
    a = calibration.store_calibration(directory, first, tmp_path, read_info_stub())
    b = calibration.store_calibration(directory, first * 2, tmp_path, read_info_stub())
    assert np.array_equal(b.sample, first) and a.calibration_id == b.calibration_id
    # A stored ranges file wins over recomputation, in a fresh process's view too.
    sentinel = np.array([[-9.0] * 4, [9.0] * 4], dtype=np.float32)
    np.save(directory / "ranges-4-raw.npy", sentinel)
    assert np.array_equal(calibration.load_calibration(directory).ranges(None, False), sentinel)
    assert sorted(p.name for p in directory.iterdir() if p.suffix == ".tmp") == []


def test_concurrent_calibrations_agree_on_one_file(tmp_path):
    directory = tmp_path / "c"
    results = {}

    def store(k: int) -> None:
        sample = np.full((4, 8), float(k), dtype=np.float32)
        results[k] = calibration.store_calibration(directory, sample, tmp_path, read_info_stub())

    threads = [threading.Thread(target=store, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stored = np.load(directory / calibration.SAMPLE_FILE)
    assert all(np.array_equal(r.sample, stored) for r in results.values())


def test_stored_calibration_is_read_not_recomputed(tmp_path, tiny_xlmr_dir, xlmr_engine):
    directory = calibration.calibration_dir(tmp_path, tiny_xlmr_dir, "float32")
    made = calibration.load_or_calibrate(directory, tiny_xlmr_dir, xlmr_engine.info,
                                         _embed_with(xlmr_engine))

    def refuse(tokens):
        raise AssertionError("recomputed a stored calibration")

    again = calibration.load_or_calibrate(directory, tiny_xlmr_dir, xlmr_engine.info, refuse)
    assert again.sample.tobytes() == made.sample.tobytes()


def test_directory_is_keyed_by_weights_dtype_and_texts(tmp_path, tiny_xlmr_dir):
    copy = shutil.copytree(tiny_xlmr_dir, tmp_path / tiny_xlmr_dir.name)
    same = calibration.calibration_dir(tmp_path, copy, "float32")
    assert same == calibration.calibration_dir(tmp_path, tiny_xlmr_dir, "float32")  # moved, same model
    assert same.name.endswith(f"-float32-{TEXTS_ID}")
    assert same != calibration.calibration_dir(tmp_path, tiny_xlmr_dir, "bfloat16")
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1   # one bit of one weight
    weights.write_bytes(bytes(data))
    assert calibration.calibration_dir(tmp_path, copy, "float32") != same


def read_info_stub():
    from embedserve.model.info import ModelInfo

    return ModelInfo(model_id="stub", architecture="BertModel", task="embed", dimension=24,
                     max_positions=512, vocab_size=10, pooling="mean", normalize=True)
