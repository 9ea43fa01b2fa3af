"""LocalEmbedder: texts in, finished vectors out, with the engine in this process.

Owns one part's path through the model: the prompt, tokenization on all
cores (the model's tokenizer as the gateway loads it, ``load_tokenizer``: the
native one runs its own thread pool with the GIL released, ``tokenizers`` its own),
the long-input policy, packing into token-budget batches (``packing.py``),
engine steps with the next batch submitted while one runs, scatter back into
input order, normalization and Matryoshka cut (``model/postprocess.py``) and
the output precision. ``prepare`` (CPU: tokenize and plan) and ``compute``
(the model) are separate so a caller can prepare part k+1 on another thread
while part k computes.

Long inputs (``encoding.py``): ``refuse`` skips a document longer than the
model's limit (its reason goes to the errors file), ``truncate`` cuts it
from the right and flags it, ``chunk`` cuts it into windows of the model's
length that are packed into the same batches as every other sequence; their
raw vectors (full width, not normalized) are pooled back per document,
weighted by content tokens (``model/windows.py``, as the gateway pools),
before normalization, the Matryoshka cut and the precision.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embedserve.calibration import calibration_dir, load_or_calibrate
from embedserve.engine.batch import Batch
from embedserve.errors import InvalidInput
from embedserve.local.embedded import EmbeddedPart, SparseRows, TokenVectorRows
from embedserve.local.encoding import EncodedTexts, check_overlap, encode_texts, take
from embedserve.local.options import EmbedOptions, bulk_token_budget
from embedserve.local.packing import plan_batches
from embedserve.local.precision import RANGED_PRECISIONS, check_precision, convert
from embedserve.model import multivector
from embedserve.model.info import ModelInfo
from embedserve.model.postprocess import postprocess_embeddings, sparse_rows, token_vectors
from embedserve.model.probe_texts import DEFAULT_PROBE_MIN_COSINE
from embedserve.model.tasks import TASK_NAMES
from embedserve.model.windows import pool_windows
from embedserve.scheduler.engine_loading import load_engine
from embedserve.scheduler.settings import DEFAULT_DTYPE
from embedserve.tokenizer import load_tokenizer

# Steps handed to the engine before the oldest is awaited: one runs while the
# next is assembled and queued, so the engine never waits for Python.
IN_FLIGHT_STEPS = 2


@dataclass
class PreparedPart:
    """A part after the CPU work: which texts run, their sequences, and the batches."""

    texts: EncodedTexts                  # the texts that run, their sequences (windows), problems
    batches: list[np.ndarray]            # indices into ``texts.sequences``, one array per engine step

    @property
    def rows(self) -> np.ndarray:
        return self.texts.rows


class LocalEmbedder:
    """A tokenizer and an engine for one model, and the options every part is embedded with."""

    def __init__(self, model_dir: str | Path, options: EmbedOptions = EmbedOptions(),
                 device: str = "cpu", dtype: str | None = DEFAULT_DTYPE,
                 probe_min_cosine: float = DEFAULT_PROBE_MIN_COSINE,
                 tokenizer_cache_dir: Path | None = None, cache_dir: Path | None = None) -> None:
        """``dtype``: as a replica's ``--dtype`` (auto: by hardware, checked by the load-time
        probe at ``probe_min_cosine``; ``info.dtype_reason`` says why). ``cache_dir``: where
        the model's int8/uint8 calibration is kept (``embedserve.calibration``); needed only
        for those precisions, computed there on first use."""
        model_dir = Path(model_dir)
        self.engine = load_engine(model_dir, device, dtype, probe_min_cosine=probe_min_cosine)
        kwargs: dict[str, Any] = {} if tokenizer_cache_dir is None else {"cache_dir": tokenizer_cache_dir}
        self.tokenizer = load_tokenizer(model_dir, **kwargs)
        self.options = options
        info = self.engine.info
        check_bulk_task(info.task, info.model_id, options)
        if options.dimensions is not None and not 1 <= options.dimensions <= info.dimension:
            raise InvalidInput(f"dimensions must be between 1 and {info.dimension}, "
                               f"got {options.dimensions}", field="dimensions")
        check_precision(options.precision, self.dimension)
        if info.task == "multivector":
            # The document marker (encode_document), unless the job names a prompt; the
            # skiplist applies as to documents, or as to queries under the query prompt.
            self.prompt = (multivector.marker_prompt(info.prompts, "document") if options.input_type is None
                           else info.prompt(options.input_type, "input_type"))
            self.multivector_task = "query" if options.input_type == "query" else "document"
        else:
            self.prompt = info.prompt(options.input_type, "input_type")
        if options.long_inputs == "chunk":
            check_overlap(self.tokenizer, info.max_positions, options.chunk_overlap)
        self.token_budget = options.token_budget or bulk_token_budget(device)
        self.ranges = self._ranges(model_dir, cache_dir) if options.precision in RANGED_PRECISIONS else None

    def _ranges(self, model_dir: Path, cache_dir: Path | None) -> np.ndarray:
        """The calibration ranges a replica of this model and dtype uses (computed once, then read)."""
        if cache_dir is None:
            raise InvalidInput(f"precision {self.options.precision} needs a cache directory for the "
                               "model's calibration", field="precision")
        directory = calibration_dir(cache_dir, model_dir, self.info.dtype or "")
        calibration = load_or_calibrate(directory, model_dir, self.info,
                                        lambda tokens: self.engine.step(Batch.of(tokens)).wait())
        return calibration.ranges(self.options.dimensions, self.info.normalize)

    @property
    def info(self) -> ModelInfo:
        return self.engine.info

    @property
    def dimension(self) -> int:
        return self.options.dimensions or self.engine.info.dimension

    def close(self) -> None:
        self.engine.close()

    # ---- CPU side -------------------------------------------------------------
    def prepare(self, texts: list[str]) -> PreparedPart:
        """Tokenize ``texts`` (valid, non-empty strings), apply the long-input policy, plan batches."""
        spec = self.info.multivector
        # a multi-vector model's query_length / document_length / fixed expansion length
        limit = (self.info.max_positions if spec is None
                 else spec.input_limit(self.multivector_task, self.info.max_positions))
        out = encode_texts(self.tokenizer, texts, self.prompt, limit,
                           self.options.long_inputs, self.options.chunk_overlap)
        batches = plan_batches(out.sequences.lengths, self.token_budget, self.options.max_sequences,
                               self.options.window)
        return PreparedPart(out, batches)

    # ---- the model ------------------------------------------------------------
    def compute(self, part: PreparedPart) -> EmbeddedPart:
        """Run the planned batches (``IN_FLIGHT_STEPS`` at a time) and finish the vectors."""
        if self.info.task == "sparse":
            return self._compute_sparse(part)
        if self.info.task == "multivector":
            return self._compute_token_vectors(part)
        texts = part.texts
        sequences = texts.sequences
        raw = np.empty((sequences.num_sequences, self.info.dimension), dtype=np.float32)
        pending: deque = deque()
        for batch_rows in part.batches:
            ids, lengths = take(sequences, batch_rows)
            pending.append((batch_rows, self.engine.step(Batch.from_lengths(ids, lengths))))
            if len(pending) >= IN_FLIGHT_STEPS:
                done_rows, lazy = pending.popleft()
                raw[done_rows] = lazy.wait()
        while pending:
            done_rows, lazy = pending.popleft()
            raw[done_rows] = lazy.wait()
        if texts.windows is not None:
            raw = pool_windows(raw, texts.windows)
        vectors = postprocess_embeddings(raw, self.info.normalize, self.options.dimensions)
        return EmbeddedPart(texts.rows, convert(vectors, self.options.precision, self.ranges),
                            texts.tokens, texts.encoded.truncated.astype(bool), texts.chunked,
                            texts.problems)

    def _compute_sparse(self, part: PreparedPart) -> EmbeddedPart:
        """A sparse model's part: each step's vocabulary-wide rows cut to their nonzeros
        at once (a part's dense rows would take part_size x vocabulary floats)."""
        texts = part.texts
        sequences = texts.sequences
        by_row: list[tuple[np.ndarray, np.ndarray]] = [(np.empty(0, np.int32), np.empty(0, np.float32))] \
            * sequences.num_sequences
        pending: deque = deque()

        def finish(rows: np.ndarray, lazy) -> None:
            counts, indices, values = sparse_rows(lazy.wait(), self.options.top_k)
            ends = np.cumsum(counts)
            for row, a, b in zip(rows.tolist(), (ends - counts).tolist(), ends.tolist()):
                by_row[row] = (indices[a:b], values[a:b])

        for batch_rows in part.batches:
            ids, lengths = take(sequences, batch_rows)
            pending.append((batch_rows, self.engine.step(Batch.from_lengths(ids, lengths, "sparse"))))
            if len(pending) >= IN_FLIGHT_STEPS:
                finish(*pending.popleft())
        while pending:
            finish(*pending.popleft())
        sparse = SparseRows(np.array([len(i) for i, _ in by_row], dtype=np.int32),
                            np.concatenate([i for i, _ in by_row]) if by_row else np.empty(0, np.int32),
                            np.concatenate([v for _, v in by_row]) if by_row else np.empty(0, np.float32))
        return EmbeddedPart(texts.rows, np.empty((len(by_row), 0), np.float32), texts.tokens,
                            texts.encoded.truncated.astype(bool), texts.chunked, texts.problems, sparse)

    def _compute_token_vectors(self, part: PreparedPart) -> EmbeddedPart:
        """A multi-vector model's part: each step's token vectors, skiplist and
        normalization applied as a replica applies them (model/postprocess.py)."""
        texts = part.texts
        sequences = texts.sequences
        spec = self.info.multivector
        assert spec is not None, "a multi-vector model's info carries its spec"
        by_row: list[np.ndarray] = [np.empty((0, self.info.dimension), np.float32)] * sequences.num_sequences
        pending: deque = deque()

        def finish(rows: np.ndarray, batch: Batch, lazy) -> None:
            counts, vectors = token_vectors(lazy.wait(), batch.token_ids, batch.cu_seqlens, spec,
                                            self.info.normalize, self.multivector_task)
            ends = np.cumsum(counts)
            for row, a, b in zip(rows.tolist(), (ends - counts).tolist(), ends.tolist(), strict=True):
                by_row[row] = vectors[a:b]

        for batch_rows in part.batches:
            ids, lengths = take(sequences, batch_rows)
            batch = Batch.from_lengths(ids, lengths, "multivector")
            # the marker token and ColBERT query expansion, as a replica's EmbedTokens does it
            prepared, keys = multivector.prepare_inputs(batch, spec, self.multivector_task)
            if prepared is not batch:
                batch = Batch.of(prepared, "multivector", key_lengths=keys)
            pending.append((batch_rows, batch, self.engine.step(batch)))
            if len(pending) >= IN_FLIGHT_STEPS:
                finish(*pending.popleft())
        while pending:
            finish(*pending.popleft())
        rows = TokenVectorRows(np.array([len(v) for v in by_row], dtype=np.int32),
                               np.concatenate(by_row) if by_row else np.empty((0, self.info.dimension), np.float32))
        return EmbeddedPart(texts.rows, np.empty((len(by_row), 0), np.float32), texts.tokens,
                            texts.encoded.truncated.astype(bool), texts.chunked, texts.problems,
                            token_vectors=rows)

    def embed(self, texts: list[str]) -> EmbeddedPart:
        return self.compute(self.prepare(texts))


def check_bulk_task(task: str, model_id: str, options: EmbedOptions) -> None:
    """A bulk job embeds: dense vectors, or a sparse model's nonzeros (float32, no Matryoshka
    cut, no windows pooled); a reranker or classifier has no vector to store."""
    if task not in ("embed", "sparse", "multivector"):
        raise InvalidInput(f"embedserve embed needs an embedding model; {model_id} is "
                           f"{TASK_NAMES.get(task, task)} (task {task})", field="model")
    if task in ("sparse", "multivector"):
        refused = [name for name, given in (("precision", options.precision != "float32"),
                                            ("dimensions", options.dimensions is not None),
                                            ("long_inputs chunk", options.long_inputs == "chunk"))
                   if given]
        if refused:
            raise InvalidInput(f"{refused[0]} does not apply to {TASK_NAMES[task]}'s vectors "
                               f"({model_id}): they are stored as float32", field="model")
    if task != "sparse" and options.top_k is not None:
        raise InvalidInput(f"top_k applies to a sparse model; {model_id} is {TASK_NAMES[task]}",
                           field="top_k")
