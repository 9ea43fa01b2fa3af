"""Loading WordPiece tokenizers: a vocab.txt + tokenizer_config.json directory (against
transformers' BertTokenizerFast built from the same files), model directories, and the
clear errors for what the native encoder does not run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import python_docs_text
from embedserve.errors import ModelLoadError
from embedserve.tokenizer import Tokenizer
from tokenizer_corpus import seeded_strings

SPECIAL_TEXTS = ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]")
CONFIG_CASES = {
    "minilm": {},
    "cased": {"do_lower_case": False},
    "cased_strip_accents": {"do_lower_case": False, "strip_accents": True},
    "lower_keep_accents": {"strip_accents": False},
    "no_chinese": {"tokenize_chinese_chars": False},
}


def vocab_dir(directory: Path, minilm_dir: Path, overrides: dict) -> Path:
    """MiniLM's vocabulary as vocab.txt, its tokenizer_config.json with ``overrides``."""
    directory.mkdir(parents=True, exist_ok=True)
    vocab = json.loads((minilm_dir / "tokenizer.json").read_text())["model"]["vocab"]
    pieces = sorted(vocab, key=vocab.__getitem__)
    (directory / "vocab.txt").write_text("".join(p + "\n" for p in pieces), encoding="utf-8")
    config = json.loads((minilm_dir / "tokenizer_config.json").read_text())
    config.update(overrides)
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    shutil.copy(minilm_dir / "special_tokens_map.json", directory / "special_tokens_map.json")
    return directory


def texts() -> list[str]:
    lines = [line for line in python_docs_text().split("\n") if line.strip()][::5]
    extra = ["Crème Brûlée à la carte", "ÀÉÎÕÜ ß İ", "中文字符和English混合", "naïve café résumé", "a\u0301\u0323b"]
    return [t for t in lines + extra + seeded_strings(1_000) if not any(s in t for s in SPECIAL_TEXTS)]


@pytest.mark.parametrize("case", CONFIG_CASES)
def test_vocab_txt_directory_equals_transformers(case, minilm_dir, tmp_path, tokenizer_cache_dir):
    import transformers

    directory = vocab_dir(tmp_path / case, minilm_dir, CONFIG_CASES[case])
    ours = Tokenizer.from_model_dir(directory, cache_dir=tokenizer_cache_dir)
    reference = transformers.BertTokenizerFast.from_pretrained(directory)
    assert ours.backend == "native-wordpiece" and ours.vocab_size == len(reference) == 30522
    assert ours.spec.extra["model_max_length"] == "512"
    sample = texts()
    got = ours.encode_batch(sample)
    expected = reference(sample)["input_ids"]
    bad = [i for i, ids in enumerate(expected) if got.sequence(i).tolist() != ids]
    assert not bad, [(sample[i][:50], got.sequence(i)[:10].tolist(), expected[i][:10]) for i in bad[:3]]
    query = "Where is the café?"
    pairs = ours.encode_pairs(query, sample[:100])
    expected_pairs = reference([query] * 100, sample[:100])
    for i in range(100):
        lo, hi = pairs.cu_seqlens[i], pairs.cu_seqlens[i + 1]
        assert pairs.sequence(i).tolist() == expected_pairs["input_ids"][i]
        assert pairs.token_type_ids[lo:hi].tolist() == expected_pairs["token_type_ids"][i]


def test_tokenizer_json_wins_over_vocab_txt(minilm_dir, tmp_path, tokenizer_cache_dir):
    # A directory with both: tokenizer.json is read (a vocab.txt saying "cased" is ignored).
    directory = vocab_dir(tmp_path / "both", minilm_dir, {"do_lower_case": False})
    shutil.copy(minilm_dir / "tokenizer.json", directory / "tokenizer.json")
    tokenizer = Tokenizer.from_model_dir(directory, cache_dir=tokenizer_cache_dir)
    assert tokenizer.spec.source.endswith("tokenizer.json")
    assert tokenizer.tokenize("HELLO") == ["hello"]


def test_unigram_backend_name(xlmr_tokenizer_dir, tokenizer_cache_dir):
    assert Tokenizer.from_model_dir(xlmr_tokenizer_dir, cache_dir=tokenizer_cache_dir).backend == "native-unigram"


def _edited(minilm_dir: Path, tmp_path: Path, edit) -> Path:
    doc = json.loads((minilm_dir / "tokenizer.json").read_text())
    edit(doc)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.update(normalizer={"type": "NFKC"}), "normalizer.type"),
    (lambda d: d.update(pre_tokenizer={"type": "Whitespace"}), "pre_tokenizer.type"),
    (lambda d: d["model"].update(unk_token="<unk>"), "model.unk_token"),
    (lambda d: d["model"]["vocab"].update({"extra": 5}), "model.vocab"),
    (lambda d: d["normalizer"].update(lowercase="yes"), "normalizer.lowercase"),
    (lambda d: d.update(post_processor={"type": "ByteLevel"}), "post_processor.type"),
    (lambda d: d["post_processor"]["single"][1]["Sequence"].update(type_id=1), "post_processor.single"),
])
def test_unsupported_wordpiece_files_name_the_field(edit, field, minilm_dir, tmp_path):
    with pytest.raises(ModelLoadError, match=field.replace(".", r"\.")):
        Tokenizer.from_file(_edited(minilm_dir, tmp_path, edit), cache_dir=None)


def test_bert_processing_post_processor(minilm_dir, tmp_path, tokenizer_cache_dir):
    import tokenizers

    path = _edited(minilm_dir, tmp_path, lambda d: d.update(
        post_processor={"type": "BertProcessing", "sep": ["[SEP]", 102], "cls": ["[CLS]", 101]}))
    ours = Tokenizer.from_file(path, cache_dir=tokenizer_cache_dir)
    reference = tokenizers.Tokenizer.from_file(str(path))
    reference.no_padding()
    reference.no_truncation()
    pairs = ours.encode_pairs("a question", ["an answer", "another one"])
    for i, doc in enumerate(["an answer", "another one"]):
        expected = reference.encode("a question", doc)
        lo, hi = pairs.cu_seqlens[i], pairs.cu_seqlens[i + 1]
        assert pairs.sequence(i).tolist() == expected.ids
        assert pairs.token_type_ids[lo:hi].tolist() == expected.type_ids
