"""CPU steps rounded up to token-count buckets (engine/cpu_shapes.py).

- the bucket table and the padding a batch gets (sequences no longer than the model allows,
  segment ids padded too, the real sequences untouched);
- all-MiniLM-L6-v2 through a bucketed engine equals sentence-transformers (cosine >= 0.99999)
  and the same engine unbucketed (float32 rounding only), for batches whose token counts
  fall between buckets;
- padding never leaks into real rows under every attention implementation, with segment ids
  (a tiny random BERT, bucketed vs exact counts);
- the padding shows in ``stats()["padding_waste"]``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embedserve.engine import Batch, Engine
from embedserve.engine.cpu_shapes import cpu_token_bucket, pad_to_bucket
from embedserve.engine.modules.attention import ATTENTION_IMPLS

TEXTS = ["Hello, World!", "Crème brûlée is a French dessert.", "中文 and English, mixed.",
         "The QUICK brown fox's \"jumps\" — over 3.14 lazy dogs?!", "naïve café résumé Ångström",
         "Short.", "A longer passage about embeddings, which map text to vectors. " * 8,
         "Memory stays bounded when the step shapes are few. " * 5]


@pytest.mark.parametrize("tokens, bucket", [
    (1, 1), (2, 2), (3, 4), (5, 8), (8, 8), (9, 16), (17, 24), (20, 24), (33, 40), (64, 64),
    (65, 80), (100, 112), (128, 128), (129, 192), (511, 512), (512, 512), (513, 576), (1000, 1024),
    (1025, 1280)])
def test_bucket_table(tokens: int, bucket: int) -> None:
    assert cpu_token_bucket(tokens) == bucket


def test_few_buckets_cover_a_cpu_budget() -> None:
    # The point of bucketing: a 512-token budget runs in 21 shapes (1..8: 4, 16..64: 7,
    # 80..128: 4, then 192..512: 6), not 512.
    assert len({cpu_token_bucket(t) for t in range(1, 513)}) == 21


def test_padding_sequences_fit_the_model_and_follow_the_real_ones() -> None:
    real = Batch.from_sequences([[5, 6, 7], list(range(1, 100))])           # 102 tokens -> 112
    with_types = Batch(real.token_ids, real.cu_seqlens, np.ones(102, np.int32), task="score")
    padded = pad_to_bucket(with_types, max_length=4)
    assert padded.num_tokens == 112
    assert padded.task == "score"
    assert padded.lengths.tolist() == [3, 99, 4, 4, 2]                        # 10 = 4 + 4 + 2
    assert np.array_equal(padded.token_ids[:102], real.token_ids)
    assert np.array_equal(padded.cu_seqlens[:3], real.cu_seqlens)
    assert padded.token_type_ids is not None
    assert padded.token_type_ids.tolist() == [1] * 102 + [0] * 10
    on_bucket = Batch.from_sequences([list(range(1, 65))])
    assert pad_to_bucket(on_bucket, max_length=512) is on_bucket


def _ids(minilm_dir: Path, texts: list[str]) -> list[np.ndarray]:
    import tokenizers

    tokenizer = tokenizers.Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tokenizer.no_padding()  # the file pads to 128
    tokenizer.no_truncation()
    return [np.array(e.ids, dtype=np.int32) for e in tokenizer.encode_batch(texts)]


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_bucketed_minilm_equals_sentence_transformers_and_exact_counts(minilm_dir: Path) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(minilm_dir), device="cpu").encode(TEXTS, normalize_embeddings=True)
    ids = _ids(minilm_dir, TEXTS)
    with Engine.load(minilm_dir) as bucketed, Engine.load(minilm_dir, token_buckets=False) as exact:
        # Several compositions, so the token counts land between buckets (and one on a bucket).
        for group in (slice(0, 1), slice(0, 3), slice(2, 7), slice(0, 8)):
            batch = Batch.from_sequences(ids[group])
            ours = bucketed.step(batch).wait()
            plain = exact.step(batch).wait()
            assert ours.shape == plain.shape == (len(ids[group]), 384)
            np.testing.assert_allclose(ours, plain, rtol=0, atol=2e-6)
            cosine = (_unit(ours) * reference[group]).sum(1)
            assert cosine.min() >= 0.99999, (group, cosine)
        assert bucketed.stats()["padding_waste"] > 0
        assert exact.stats()["padding_waste"] == 0


@pytest.mark.parametrize("attention", sorted(ATTENTION_IMPLS))
def test_padding_never_reaches_real_rows(tiny_bert_dir: Path, attention: str) -> None:
    rng = np.random.default_rng(0)
    lengths = [7, 30, 3, 11]                                                  # 51 tokens -> 56
    sequences = [rng.integers(3, 200, n).astype(np.int32) for n in lengths]
    base = Batch.from_sequences(sequences)
    batch = Batch(base.token_ids, base.cu_seqlens, rng.integers(0, 2, 51).astype(np.int32))
    with (Engine.load(tiny_bert_dir, attention=attention) as bucketed,
          Engine.load(tiny_bert_dir, attention=attention, token_buckets=False) as exact):
        ours = bucketed.step(batch).wait()
        plain = exact.step(batch).wait()
        alone = [exact.step(Batch(s.token_ids, s.cu_seqlens, s.token_type_ids)).wait()[0]
                 for s in _split(batch)]
    assert ours.shape == (4, plain.shape[1])
    np.testing.assert_allclose(ours, plain, rtol=0, atol=2e-6)
    np.testing.assert_allclose(ours, np.stack(alone), rtol=0, atol=2e-6)


def _split(batch: Batch) -> list[Batch]:
    out = []
    for start, end in zip(batch.cu_seqlens[:-1], batch.cu_seqlens[1:]):
        types = None if batch.token_type_ids is None else batch.token_type_ids[start:end]
        out.append(Batch(batch.token_ids[start:end], np.array([0, end - start], np.int32), types))
    return out
