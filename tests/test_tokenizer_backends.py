"""The tokenizers fallback and the load dispatch, against ``tokenizers`` itself.

Every tokenizer.json here is trained in the test by ``tokenizers`` on
python_docs_text(): byte-level BPE as GPT-2 ships it (ByteLevel pre-tokenizer and
post-processor, offsets trimmed) and as Qwen3-Embedding ships it (NFC, a Split regex,
ByteLevel, a template that appends ``<|endoftext|>``); a Unigram with byte_fallback;
a BPE behind a Sequence normalizer (NFKC + Lowercase) and Metaspace with a BERT-style
pair template (type ids 1 on the second text). Each loads through
``load_tokenizer_file`` and must give exactly the reference's ids, type ids and
offsets, alone, packed, in pairs and truncated. The reference runs with
``encode_special_tokens`` on, as our backends do (specials only from the template).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import tokenizers

from embedserve.errors import InvalidInput, ModelLoadError
from embedserve.tokenizer import HfTokenizer, Tokenizer, TokenizerBackend, load_tokenizer, load_tokenizer_file
from embedserve.tokenizer.kernels.trie import COMPACT_COLUMNS
from embedserve.tokenizer.load import native_backend_for
from trained_tokenizers import (
    MULTILINGUAL,
    docs_lines,
    gpt2_bpe,
    lowercase_metaspace_bpe,
    qwen3_bpe,
    unigram_byte_fallback,
    unigram_metaspace,
)

BUILDERS = {"gpt2": gpt2_bpe, "qwen3": qwen3_bpe, "unigram_byte_fallback": unigram_byte_fallback,
            "lowercase_metaspace_bpe": lowercase_metaspace_bpe}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def trained(request, tmp_path_factory) -> tuple[str, Path]:
    path = BUILDERS[request.param](tmp_path_factory.mktemp("tok") / "tokenizer.json")
    return request.param, path


@pytest.fixture(scope="module")
def pair(trained, tmp_path_factory):
    """(ours, reference) for one trained tokenizer.json."""
    name, path = trained
    reference = tokenizers.Tokenizer.from_file(str(path))
    reference.encode_special_tokens = True
    return load_tokenizer_file(path, cache_dir=tmp_path_factory.mktemp("trie")), reference


def _texts() -> list[str]:
    return docs_lines()[::37] + MULTILINGUAL


def _assert_matches(batch, encodings, offsets: bool = True) -> None:
    """The packed batch is the concatenation of the reference encodings."""
    lengths = [len(e.ids) for e in encodings]
    assert batch.cu_seqlens.tolist() == np.concatenate([[0], np.cumsum(lengths)]).tolist()
    assert batch.token_ids.tolist() == [t for e in encodings for t in e.ids]
    types = batch.token_type_ids if batch.token_type_ids is not None else np.zeros(batch.num_tokens)
    assert types.tolist() == [t for e in encodings for t in e.type_ids]
    if offsets:
        assert batch.offsets.tolist() == [list(o) for e in encodings for o in e.offsets]
    assert batch.token_ids.dtype == np.int32 and batch.cu_seqlens.dtype == np.int32


def test_every_trained_file_loads_through_tokenizers(pair):
    ours, _ = pair
    assert isinstance(ours, HfTokenizer) and ours.backend == "tokenizers"
    assert isinstance(ours, TokenizerBackend)


def test_batches_equal_the_reference(pair):
    ours, reference = pair
    texts = _texts()
    for special in (True, False):
        batch = ours.encode_batch(texts, add_special_tokens=special, return_offsets=True)
        _assert_matches(batch, reference.encode_batch(texts, add_special_tokens=special))
        assert not batch.truncated.any()
        assert batch.original_lengths.tolist() == batch.lengths.tolist()


def test_single_encodes_and_pieces_equal_the_reference(pair):
    ours, reference = pair
    for text in MULTILINGUAL:
        expected = reference.encode(text)
        assert ours.encode(text).tolist() == expected.ids
        assert ours.encode(text, add_special_tokens=False).tolist() == reference.encode(
            text, add_special_tokens=False).ids
        assert ours.tokenize(text) == reference.encode(text, add_special_tokens=False).tokens
        assert [ours.id_to_piece(i) for i in expected.ids] == expected.tokens


def test_specials_in_text_stay_text_as_in_the_reference_with_encode_special_tokens(pair):
    ours, reference = pair
    text = "<|endoftext|><s>[CLS]"
    assert ours.encode(text).tolist() == reference.encode(text).ids
    plain = tokenizers.Tokenizer.from_str(reference.to_str())  # the library's default splits them
    plain.encode_special_tokens = False
    assert ours.encode("no specials here").tolist() == plain.encode("no specials here").ids


def test_pairs_equal_the_reference(pair):
    ours, reference = pair
    texts = _texts()
    query, docs = "What does the with statement do?", texts
    batch = ours.encode_pairs(query, docs, return_offsets=True)
    _assert_matches(batch, reference.encode_batch([(query, d) for d in docs]))
    assert ours.encode_pair(query, docs[0]).tolist() == reference.encode(query, docs[0]).ids


@pytest.mark.parametrize("direction", ["right", "left"])
def test_truncation_equals_the_reference(pair, direction):
    ours, reference = pair
    texts = _texts()
    query = "a query of several words that is not short at all"
    full = [len(e.ids) for e in reference.encode_batch(texts)]
    full_pairs = [len(e.ids) for e in reference.encode_batch([(query, d) for d in texts])]
    cut = tokenizers.Tokenizer.from_str(reference.to_str())
    cut.encode_special_tokens = True
    for max_length in (3, 8, 17, 64):
        cut.enable_truncation(max_length, strategy="longest_first", direction=direction)
        batch = ours.encode_batch(texts, max_length=max_length, truncation=direction, return_offsets=True)
        _assert_matches(batch, cut.encode_batch(texts))
        assert batch.original_lengths.tolist() == full
        assert batch.truncated.tolist() == [n > max_length for n in full]
        if max_length >= 8:
            pairs = ours.encode_pairs(query, texts, max_length=max_length, truncation=direction,
                                      return_offsets=True)
            _assert_matches(pairs, cut.encode_batch([(query, d) for d in texts]))
            assert pairs.original_lengths.tolist() == full_pairs
            assert pairs.truncated.tolist() == [n > max_length for n in full_pairs]


def test_one_thread_gives_the_same_batches(trained):
    _, path = trained
    texts = _texts()
    threaded, single = HfTokenizer.from_file(path), HfTokenizer.from_file(path, threads=1)
    for a, b in ((threaded.encode_batch(texts, 20, "left", return_offsets=True),
                  single.encode_batch(texts, 20, "left", return_offsets=True)),
                 (threaded.encode_pairs("q", texts), single.encode_pairs("q", texts))):
        assert a.token_ids.tolist() == b.token_ids.tolist()
        assert a.cu_seqlens.tolist() == b.cu_seqlens.tolist()


def test_lone_surrogates_become_replacement_characters(pair):
    ours, reference = pair
    assert ours.encode("a\ud800b").tolist() == reference.encode("a\ufffdb").ids


def test_bad_arguments_are_invalid_input(pair):
    ours, _ = pair
    n_specials = sum(len(s) for s in ours.single_specials)
    with pytest.raises(InvalidInput, match="max_length"):
        ours.encode_batch(["x"], truncation="right")
    with pytest.raises(InvalidInput, match="truncation"):
        ours.encode_batch(["x"], max_length=5, truncation="middle")
    if n_specials:
        with pytest.raises(InvalidInput, match="no room"):
            ours.encode_batch(["x"], max_length=n_specials - 1, truncation="right")
    with pytest.raises(InvalidInput, match="one string"):
        ours.encode_batch("not a list")
    with pytest.raises(InvalidInput):
        ours.id_to_piece(ours.vocab_size)
    with pytest.raises(InvalidInput):
        ours.encode(b"bytes")


def test_single_specials_are_the_template(pair):
    ours, reference = pair
    prefix, suffix = ours.single_specials
    full, bare = reference.encode("hello world"), reference.encode("hello world", add_special_tokens=False)
    assert full.ids == prefix.tolist() + bare.ids + suffix.tolist()


def test_qwen3_template_appends_endoftext(tmp_path):
    ours = load_tokenizer_file(qwen3_bpe(tmp_path / "tokenizer.json"))
    eos = ours.id_to_piece(int(ours.encode("text")[-1]))
    assert eos == "<|endoftext|>"
    prefix, suffix = ours.single_specials
    assert prefix.tolist() == [] and [ours.id_to_piece(i) for i in suffix] == ["<|endoftext|>"]


# ---- the dispatch -------------------------------------------------------------------
def test_a_supported_unigram_runs_natively_and_exactly(tmp_path):
    path = unigram_metaspace(tmp_path / "tokenizer.json", lowercase=False)
    ours = load_tokenizer_file(path, cache_dir=tmp_path / "trie")
    assert isinstance(ours, Tokenizer) and ours.backend == "native-unigram"
    assert native_backend_for(json.loads(path.read_text()))[0] == "native-unigram"
    # Trained scores are not float32s: Viterbi reads them from the float64 column.
    assert ours._model.score64.shape == (ours._model.nodes.shape[0] // COMPACT_COLUMNS,)
    reference = tokenizers.Tokenizer.from_file(str(path))
    reference.encode_special_tokens = True
    # The trained vocabulary holds "<s>" as a scored piece: tokenizers' Viterbi matches it
    # in text, the native encoder never does (hf_json.py: specials are CONTROL pieces).
    # Offsets: the native encoder's own contract (characters of the source), not compared.
    texts = [t for t in _texts() if "<s>" not in t and "</s>" not in t]
    scores = {piece: score for piece, score in json.loads(path.read_text())["model"]["vocab"]}
    _assert_equal_up_to_exact_ties(ours.encode_batch(texts), reference.encode_batch(texts), scores)
    pairs = ours.encode_pairs("a query", texts, max_length=12, truncation="left")
    reference.enable_truncation(12, direction="left")
    _assert_equal_up_to_exact_ties(pairs, reference.encode_batch([("a query", t) for t in texts]), scores)


def _assert_equal_up_to_exact_ties(batch, encodings, scores: dict[str, float]) -> None:
    """Equal ids, except where both segmentations spell the same pieces' text with the same
    total score: the trainer's vocabulary (it varies between runs) can hold exact ties
    (runs of "*"), which the native encoder and tokenizers break differently. Anything
    else (another text, a worse score) fails."""
    assert batch.lengths.shape[0] == len(encodings)
    ties = 0
    for i, encoding in enumerate(encodings):
        got = batch.sequence(i).tolist()
        if got == encoding.ids:
            continue
        ours_pieces = _pieces(got, encoding, scores)
        assert "".join(ours_pieces) == "".join(encoding.tokens), (i, ours_pieces, encoding.tokens)
        total = sum(scores.get(p, 0.0) for p in ours_pieces)
        expected = sum(scores.get(p, 0.0) for p in encoding.tokens)
        assert abs(total - expected) <= 1e-9 * max(1.0, abs(expected)), (i, ours_pieces, encoding.tokens)
        ties += 1
    assert ties <= max(1, len(encodings) // 100), f"{ties} of {len(encodings)} sequences differ"


def _pieces(ids: list[int], encoding, scores: dict[str, float]) -> list[str]:
    by_id = {token_id: token for token_id, token in zip(encoding.ids, encoding.tokens)}
    pieces = list(scores)
    return [by_id.get(token_id, pieces[token_id]) for token_id in ids]


def test_a_unigram_the_native_loader_refuses_falls_back(tmp_path, caplog):
    path = unigram_metaspace(tmp_path / "tokenizer.json", lowercase=True)
    assert native_backend_for(json.loads(path.read_text()))[0] == "native-unigram"
    with caplog.at_level("INFO", logger="embedserve.tokenizer.load"):
        ours = load_tokenizer_file(path, cache_dir=tmp_path / "trie")
    assert ours.backend == "tokenizers"
    assert re.search(r"backend tokenizers \(the native native-unigram encoder refused it: .*normalizer",
                     caplog.text)
    reference = tokenizers.Tokenizer.from_file(str(path))
    reference.encode_special_tokens = True
    texts = _texts()
    _assert_matches(ours.encode_batch(texts, return_offsets=True), reference.encode_batch(texts))


def test_the_decision_reads_the_model(trained):
    name, path = trained
    backend, why = native_backend_for(json.loads(path.read_text()))
    assert backend is None
    assert ("byte_fallback" if name == "unigram_byte_fallback" else "'BPE'") in why


def test_load_tokenizer_reads_a_model_directory(trained, tmp_path):
    _, path = trained
    (tmp_path / "tokenizer.json").write_bytes(path.read_bytes())
    assert load_tokenizer(tmp_path).backend == "tokenizers"


def test_unreadable_files_are_model_load_errors(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(ModelLoadError, match="cannot read"):
        load_tokenizer_file(bad)
    bad.write_text(json.dumps({"model": {"type": "Nonsense"}}))
    with pytest.raises(ModelLoadError, match="tokenizers cannot load"):
        load_tokenizer_file(bad)
    with pytest.raises(ModelLoadError):
        load_tokenizer(tmp_path / "missing")


def test_importing_the_backend_loads_no_torch():
    import subprocess
    import sys

    code = ("import sys, embedserve.tokenizer.load, tokenizers; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.strip() == "[]"


def test_the_tokenize_command_runs_a_byte_level_bpe(capsys, tmp_path):
    from embedserve.cli import main

    path = qwen3_bpe(tmp_path / "tokenizer.json")
    reference = tokenizers.Tokenizer.from_file(str(path))
    text = "Hello  wörld, 日本語 👍🏽"
    for model in (path, tmp_path):  # the file, and the directory holding it
        assert main(["tokenize", "--model", str(model), "--json", "--offsets", text]) == 0
        out = json.loads(capsys.readouterr().out)
        expected = reference.encode(text)
        assert out["ids"] == expected.ids and out["pieces"] == expected.tokens
        assert out["offsets"] == [list(o) for o in expected.offsets]
