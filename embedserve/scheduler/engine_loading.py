"""A replica's (or an in-process embedder's) engine, with ``--dtype auto``'s probe wired in.

Owns the one thing the engine cannot do itself: turning the probe's fixed
texts (model/probe_texts.py) into token ids with the model's own tokenizer
(the engine never imports the tokenizer). The tokenizer is loaded only when
auto picks a reduced precision and the probe runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from embedserve import ragged
from embedserve.model.calibration_texts import CALIBRATION_TEXTS
from embedserve.model.cuda_options import CudaOptions
from embedserve.model.info import read_model_info
from embedserve.model.probe_texts import DEFAULT_PROBE_MIN_COSINE, PROBE_TEXTS
from embedserve.ragged import RaggedBatch
from embedserve.scheduler.probe_token_cache import DEFAULT_PROBE_CACHE_DIR, cached_tokens

if TYPE_CHECKING:
    from embedserve.engine import Engine


def probe_tokens(model_dir: Path, texts: Sequence[str] = PROBE_TEXTS,
                 cache_dir: Path | None = DEFAULT_PROBE_CACHE_DIR) -> RaggedBatch:
    """The probe texts with the model's specials, cut to the model's length.

    The same ids go through both dtypes, so what matters is that they are the
    model's vocabulary on real text, not parity with the served tokenizer: a
    tokenizer.json is read by the ``tokenizers`` library alone (a fraction of a
    second, where the native encoder would first load its Numba kernels: seconds
    at every start, for a dozen texts); a directory with only a SentencePiece
    model goes through ``load_tokenizer``. Either way the ids are kept in
    ``cache_dir`` (probe_token_cache.py), so only a model's first start loads a
    tokenizer for them. ``texts``: another fixed sample (int8's calibration texts)
    tokenized the same way.
    """
    max_positions = read_model_info(model_dir).max_positions
    return cached_tokens(model_dir, texts, max_positions, lambda: _tokenize(model_dir, texts, max_positions),
                         cache_dir)


def _tokenize(model_dir: Path, texts: Sequence[str], max_positions: int) -> RaggedBatch:
    json_path = model_dir / "tokenizer.json"
    if not json_path.is_file():
        from embedserve.tokenizer.load import load_tokenizer

        return load_tokenizer(model_dir).encode_batch(list(texts), max_length=max_positions,
                                                      truncation="right")
    import tokenizers

    tokenizer = tokenizers.Tokenizer.from_file(str(json_path))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_positions)
    return ragged.from_sequences([encoding.ids for encoding in tokenizer.encode_batch(list(texts))])


def load_engine(model_dir: Path, device: str = "cpu", dtype: str | None = "auto", *,
                probe_min_cosine: float = DEFAULT_PROBE_MIN_COSINE,
                cuda_graphs: bool = True, cuda: CudaOptions | None = None,
                cpu_lanes: int | None = None, cpu_lane_nice: int = 0,
                small_step_threads: int | None = None) -> Engine:
    """``Engine.load`` with the probe of ``dtype="auto"`` (see engine/dtype_choice.py)."""
    from embedserve.engine import Engine
    from embedserve.engine.dtype_choice import DtypeProbe

    model_dir = Path(model_dir)
    probe = DtypeProbe(lambda: probe_tokens(model_dir), probe_min_cosine,
                       calibration=lambda: probe_tokens(model_dir, CALIBRATION_TEXTS))
    return Engine.load(model_dir, device, dtype, cuda_graphs=cuda_graphs, cuda=cuda, probe=probe,
                       cpu_lanes=cpu_lanes, cpu_lane_nice=cpu_lane_nice,
                       small_step_threads=small_step_threads)
