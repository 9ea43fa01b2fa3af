"""Checking every answer against the reference, so a broken system cannot look fast.

Owns the reference (sentence-transformers on the same model directory: a
unit vector per text the suite sends, and CrossEncoder logits per rerank
pair) and the two checks: an embedding answer must have one vector per input,
the model's dimension, and cosine >= the system's bound with the text's
reference vector; a rerank answer must score every document once, each score
within the system's tolerance of the reference (on the sigmoid scale, or the
raw-logit scale for a server that returns logits) and, where the reference
scores spread, ranked the same way. Knows nothing about transports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class BadAnswer(Exception):
    """An answer that fails a check; str() says which and how."""


@dataclass(frozen=True)
class Reference:
    dimension: int
    vectors: dict[str, np.ndarray]            # text -> unit float32 [dimension]
    rerank_logits: dict[str, float]           # document -> logit for (rerank query, document)

    def embedding_matrix(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self.vectors[t] for t in texts])


def compute_reference(embedder, cross_encoder, texts: Sequence[str], rerank_query: str,
                      rerank_docs: Sequence[str]) -> Reference:
    """sentence-transformers' answers for every text the run sends (fp32, batches of 16)."""
    import torch

    vectors = embedder.encode(list(texts), batch_size=16, convert_to_numpy=True, normalize_embeddings=True)
    logits: dict[str, float] = {}
    if cross_encoder is not None and rerank_docs:
        raw = cross_encoder.predict([(rerank_query, d) for d in rerank_docs], batch_size=8,
                                    activation_fn=torch.nn.Identity())
        logits = {d: float(s) for d, s in zip(rerank_docs, np.asarray(raw).reshape(-1))}
    return Reference(dimension=int(vectors.shape[1]),
                     vectors={t: v.astype(np.float32) for t, v in zip(texts, vectors)},
                     rerank_logits=logits)


def load_sentence_transformer(model_dir: Path, device: str = "cpu"):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_dir), device=device, local_files_only=True)


def check_embeddings(vectors: np.ndarray, expected: np.ndarray, min_cosine: float) -> float:
    """The smallest cosine of ``vectors`` [n, d] with ``expected`` [n, d]; BadAnswer below the bound."""
    if vectors.ndim != 2 or vectors.shape[0] != expected.shape[0]:
        raise BadAnswer(f"{vectors.shape[0] if vectors.ndim else 0} vectors for {expected.shape[0]} inputs")
    if vectors.shape[1] != expected.shape[1]:
        raise BadAnswer(f"dimension {vectors.shape[1]}, expected {expected.shape[1]}")
    if not np.isfinite(vectors).all():
        raise BadAnswer("non-finite values in a vector")
    norms = np.linalg.norm(vectors, axis=1)
    cosines = np.einsum("nd,nd->n", vectors, expected) / np.where(norms > 0, norms, 1.0)
    worst = int(np.argmin(cosines))
    if cosines[worst] < min_cosine:
        raise BadAnswer(f"input {worst}: cosine {cosines[worst]:.5f} with the reference "
                        f"(bound {min_cosine})")
    return float(cosines[worst])


def check_scores(scores: np.ndarray, expected_logits: np.ndarray, tolerance: float) -> float:
    """Largest score error for one rerank answer (scores in input order); BadAnswer beyond ``tolerance``."""
    if scores.shape != expected_logits.shape:
        raise BadAnswer(f"{scores.size} scores for {expected_logits.size} documents")
    if not np.isfinite(scores).all():
        raise BadAnswer("non-finite score")
    sigmoid = 1.0 / (1.0 + np.exp(-expected_logits))
    # Cohere-style APIs return sigmoid(logit); some servers return the logit itself.
    error = min(float(np.abs(scores - sigmoid).max()), float(np.abs(scores - expected_logits).max()))
    if error > tolerance:
        raise BadAnswer(f"score off by {error:.4f} from the reference (tolerance {tolerance})")
    spread = float(np.ptp(sigmoid)) if sigmoid.size > 1 else 0.0
    if spread > 20 * tolerance and np.argmax(scores) != np.argmax(sigmoid):
        raise BadAnswer("the top document differs from the reference's")
    return error
