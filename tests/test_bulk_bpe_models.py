"""``embedserve embed`` on models whose tokenizer.json no native encoder runs (byte-level
BPE: a Qwen3-Embedding-shaped decoder, a ModernBERT).

The bulk job loads the tokenizer as the gateway does (``load_tokenizer``: here the
``tokenizers`` backend), so every model ``serve`` serves can be bulk-embedded; its
vectors equal sentence-transformers loading the same directory. int8's calibration
(computed in-process on first use) tokenizes the same way: its ranges equal the
per-dimension extremes of sentence-transformers' vectors of the calibration texts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bulk_corpus import documents, write_jsonl
from decoder_models import build_decoder_dir
from embedserve.cli import main
from embedserve.local.columns import embedding_matrix
from modernbert_model import build_tiny_modernbert

MIN_COSINE = 0.99999


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bpe_models")
    return {"qwen3": build_decoder_dir(root / "qwen3", "qwen3", "lasttoken", tokenizer=True),
            "modernbert": build_tiny_modernbert(root / "modernbert")}


@pytest.fixture(scope="module")
def texts() -> list[str]:
    # Up to 40 words; a few still pass the tiny ModernBERT's 128 positions (its small BPE
    # vocabulary spends many tokens a word), and both sides cut those at 128.
    return [" ".join(text.split()[:40]) for text in documents(30)]


def embed(source: Path, out: Path, model_dir: Path, precision: str = "float32", *extra: str) -> np.ndarray:
    import pyarrow.parquet as pq

    assert main(["embed", str(source), "-o", str(out), "--model", str(model_dir), "--part-size", "8",
                 "--dtype", "float32", "--long-inputs", "truncate", "--precision", precision,
                 "--no-progress", *extra]) == 0
    assert (out.parent / (out.name + ".errors.jsonl")).read_text() == ""
    return embedding_matrix(pq.read_table(out).column("embedding"), precision)


@pytest.mark.parametrize("family", ["qwen3", "modernbert"])
def test_vectors_equal_sentence_transformers(tmp_path, model_dirs, texts, family):
    from sentence_transformers import SentenceTransformer

    model_dir = model_dirs[family]
    source = write_jsonl(tmp_path / "in.jsonl", texts)
    vectors = embed(source, tmp_path / "out.parquet", model_dir)
    reference = SentenceTransformer(str(model_dir), device="cpu")
    if family == "modernbert":
        assert max(reference.tokenize(texts)["attention_mask"].sum(1)) == 128   # some were cut
    reference = reference.encode(texts)
    assert vectors.shape == reference.shape
    cosines = (vectors * reference).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosines.min() >= MIN_COSINE


def test_int8_calibration_tokenizes_like_the_reference(tmp_path, model_dirs, texts):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util.quantization import quantize_embeddings

    from embedserve.calibration import calibration_dir, load_calibration
    from embedserve.model.calibration_texts import CALIBRATION_TEXTS

    model_dir, cache = model_dirs["qwen3"], tmp_path / "cache"
    source = write_jsonl(tmp_path / "in.jsonl", texts)
    stored = embed(source, tmp_path / "int8.parquet", model_dir, "int8", "--cache-dir", str(cache))
    reference = SentenceTransformer(str(model_dir), device="cpu")
    ranges = load_calibration(calibration_dir(cache, model_dir, "float32")).ranges(None, True)
    # The model's prompts, in the calibration's order: "document" (empty), then "query".
    sample = np.concatenate([reference.encode(list(CALIBRATION_TEXTS), prompt=reference.prompts[name])
                             for name in sorted(reference.prompts)])
    np.testing.assert_allclose(ranges, np.stack([sample.min(0), sample.max(0)]), atol=1e-5)
    floats = reference.encode(texts)
    assert np.mean(stored == quantize_embeddings(floats, "int8", ranges=ranges)) > 0.99   # ties at bucket edges
