"""all-MiniLM-L6-v2 (BERT, WordPiece tokenizer.json) served end to end: the gateway loads its
tokenizer natively and the vectors equal sentence-transformers' (this model used to fail
at start-up with "model.type: 'WordPiece' is not supported")."""

from __future__ import annotations

import numpy as np

from gateway_harness import GatewayServer, SchedulerProcess, gateway_settings

TEXTS = ["Hello, World!", "Crème brûlée is a French dessert.", "中文 and English, mixed.", "x" * 150]


def test_minilm_embeddings_match_sentence_transformers(minilm_dir):
    import tokenizers
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(minilm_dir), device="cpu").encode(TEXTS, normalize_embeddings=True)
    reference_tokenizer = tokenizers.Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    reference_tokenizer.no_padding()  # the file pads to 128
    expected_ids = reference_tokenizer.encode(TEXTS[2]).ids
    replica = SchedulerProcess(minilm_dir, threads=1)
    try:
        server = GatewayServer(gateway_settings(minilm_dir, [replica.address]))
        try:
            server.wait_ready()
            with server.client() as http:
                reply = http.post("/v1/embeddings", json={"input": TEXTS})
                tokens = http.post("/tokenize", json={"inputs": TEXTS[2]}).json()
        finally:
            server.stop()
    finally:
        replica.stop()
    assert reply.status_code == 200
    vectors = np.array([item["embedding"] for item in reply.json()["data"]])
    cosine = (vectors * reference).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() > 0.9999, cosine
    assert [t["id"] for t in tokens[0]] == expected_ids
