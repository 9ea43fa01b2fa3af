"""Ray Data: embed Arrow batches with a model loaded once per actor.

    import ray
    from embedserve.integrations.ray import EmbedBatches

    ds = ray.data.read_parquet("s3://bucket/docs/")
    ds = ds.map_batches(EmbedBatches, fn_constructor_kwargs={"model_dir": "/models/e5"},
                        concurrency=8, batch_size=10_000, batch_format="pyarrow")
    ds.write_parquet("s3://bucket/vectors/")

Each actor builds one ``LocalEmbedder`` (tokenizer and engine) in its
constructor and reuses it for every batch; a batch is packed and embedded
exactly as ``embedserve embed`` embeds one part (same length sorting, token
budget, long-input policy and precision), so a batch of the same rows gives
the same vectors. The output keeps every input column except the text and
adds ``embedding`` (null for a skipped row), ``tokens``, ``truncated``,
``chunked`` and ``problem`` (why a row was skipped, else null). A
``problem`` column already in the input (set by an earlier step) is kept:
those rows are passed through, not embedded.

Ray itself is never imported here: this class is plain Python that Ray
instantiates in its workers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from embedserve.local import columns
from embedserve.local.documents import text_problem
from embedserve.local.embedder import LocalEmbedder
from embedserve.local.options import EmbedOptions
from embedserve.model.probe_texts import DEFAULT_PROBE_MIN_COSINE
from embedserve.scheduler.settings import DEFAULT_DTYPE

PROBLEM = "problem"


class EmbedBatches:
    """A callable class for ``Dataset.map_batches(..., batch_format="pyarrow")``."""

    def __init__(self, model_dir: str | Path, text_field: str = "text", id_field: str | None = None,
                 device: str = "cpu", dtype: str | None = DEFAULT_DTYPE,
                 probe_min_cosine: float = DEFAULT_PROBE_MIN_COSINE,
                 cache_dir: str | Path | None = None, **options: Any) -> None:
        """``options``: ``EmbedOptions`` fields (input_type, dimensions, precision,
        long_inputs, chunk_overlap, token_budget, max_sequences, window). ``id_field``: rows whose id
        is null are skipped (as ``embedserve embed --id-field`` skips them). ``cache_dir``:
        where the model's int8/uint8 calibration lives (share it between nodes, or every
        node calibrates on its own). ``dtype`` / ``probe_min_cosine``: as ``embedserve embed
        --dtype`` (auto: resolved, and probed, on each actor's node)."""
        self.text_field = text_field
        self.id_field = id_field
        self.embedder = LocalEmbedder(model_dir, EmbedOptions(**options), device=device, dtype=dtype,
                                      probe_min_cosine=probe_min_cosine,
                                      cache_dir=None if cache_dir is None else Path(cache_dir))

    def __call__(self, batch: pa.Table) -> pa.Table:
        if isinstance(batch, pa.RecordBatch):
            batch = pa.Table.from_batches([batch])
        n = batch.num_rows
        texts = batch.column(self.text_field).to_pylist()
        given = batch.column(PROBLEM).to_pylist() if PROBLEM in batch.column_names else [None] * n
        ids = batch.column(self.id_field).to_pylist() if self.id_field else [0] * n
        problems = [g or text_problem(t, self.text_field) or
                    (f"missing field {self.id_field!r}" if i is None else None)
                    for g, t, i in zip(given, texts, ids)]
        valid = np.array([i for i, p in enumerate(problems) if p is None], dtype=np.int64)
        embedded = self.embedder.embed([texts[i] for i in valid.tolist()])
        for i, reason in embedded.problems:
            problems[int(valid[i])] = reason
        done = valid[embedded.rows]
        options = self.embedder.options
        width = embedded.stored.shape[1] if embedded.stored.ndim == 2 else 0
        full = np.zeros((n, width), dtype=embedded.stored.dtype)
        full[done] = embedded.stored
        missing = np.ones(n, dtype=bool)
        missing[done] = False
        embedding = columns.embedding_array(full, options.precision, self.embedder.dimension)
        embedding = _with_nulls(embedding, missing)
        tokens = np.zeros(n, np.int32)
        tokens[done] = embedded.tokens
        truncated = np.zeros(n, bool)
        truncated[done] = embedded.truncated
        chunked = np.zeros(n, bool)
        chunked[done] = embedded.chunked
        kept = batch.drop_columns([c for c in (self.text_field, PROBLEM) if c in batch.column_names])
        for name, values in ((columns.EMBEDDING, embedding),
                             (columns.TOKENS, pa.array(tokens, mask=missing)),
                             (columns.TRUNCATED, pa.array(truncated, mask=missing)),
                             (columns.CHUNKED, pa.array(chunked, mask=missing)),
                             (PROBLEM, pa.array(problems, type=pa.string()))):
            kept = kept.append_column(name, values)
        return kept


def _with_nulls(array: pa.Array, missing: np.ndarray) -> pa.Array:
    """``array`` with rows where ``missing`` is True set to null (values kept, a validity bitmap added)."""
    if not missing.any():
        return array
    validity = pa.array(~missing).buffers()[1]
    if isinstance(array, pa.FixedSizeListArray):
        return pa.Array.from_buffers(array.type, len(array), [validity], children=[array.values])
    return pa.Array.from_buffers(array.type, len(array), [validity, array.buffers()[1]])
