"""The Tokenizer API: templates, XLM-R ids, batches, pairs, truncation, offsets, edge inputs.

References: sentencepiece for ids, tokenizers (loading the same tokenizer.json) for the
pair template and longest-first truncation; never our own earlier output. The files are
the XLM-R tokenizer files the default-model builder writes (conftest xlmr_tokenizer_dir)
and the English text is the Python documentation that ships with the interpreter, so
this module needs no reference data from ../shared.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tokenizers

from conftest import python_docs_text
from embedserve.errors import InvalidInput
from embedserve.ragged import RaggedBatch
from embedserve.tokenizer import EncodedBatch, Tokenizer
from embedserve.tokenizer.formats.model_proto import load_sentencepiece_model

DOCS_TEXT = python_docs_text()
ENGLISH = [line.strip() for line in DOCS_TEXT.split("\n")
           if len(line.split()) > 3 and "  " not in line.strip()][:400]


def fairseq(sp_ids: list[int]) -> list[int]:
    """SentencePiece ids -> XLM-R ids (<unk> 0 -> 3, others + 1)."""
    return [3 if i == 0 else i + 1 for i in sp_ids]


@pytest.fixture(scope="module")
def xlmr(tmp_path_factory, tokenizer_cache_dir, xlmr_tokenizer_dir) -> Tokenizer:
    """from_model_dir on a directory holding only sentencepiece.bpe.model (XLM-R ids)."""
    directory = tmp_path_factory.mktemp("xlmr_sp_only")
    shutil.copy(xlmr_tokenizer_dir / "sentencepiece.bpe.model", directory / "sentencepiece.bpe.model")
    return Tokenizer.from_model_dir(directory, compat="sentencepiece", cache_dir=tokenizer_cache_dir)


@pytest.fixture(scope="module")
def hf_reference(xlmr_tokenizer_dir) -> tokenizers.Tokenizer:
    return tokenizers.Tokenizer.from_file(str(xlmr_tokenizer_dir / "tokenizer.json"))


def test_xlmr_ids_and_single_template(xlmr, default_sp_reference):
    assert (xlmr.vocab_size, xlmr.bos_id, xlmr.pad_id, xlmr.eos_id, xlmr.unk_id, xlmr.mask_id) == \
        (250002, 0, 1, 2, 3, 250001)
    assert [xlmr.id_to_piece(i) for i in (0, 1, 2, 3, 250001)] == ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    for text in ENGLISH[:50] + ["a\u0378b", "日本語"]:
        assert xlmr.encode(text).tolist() == [0] + fairseq(default_sp_reference.encode(text)) + [2]


def test_matches_tokenizers_json_on_english(xlmr, hf_reference):
    # Where the two references agree (plain English), XLM-R ids equal tokenizers' output.
    for text in ENGLISH[:100]:
        assert xlmr.encode(text).tolist() == hf_reference.encode(text).ids


def test_special_token_text_is_plain_text(default_sp_tokenizer, default_sp_reference, xlmr):
    for text in ["<s>", "</s>", "<mask> x <pad>", "<unk>"]:
        raw = default_sp_tokenizer.encode(text, add_special_tokens=False).tolist()
        assert raw == default_sp_reference.encode(text)
        assert not set(raw) & {1, 2}  # never the control ids
        assert not set(xlmr.encode(text).tolist()[1:-1]) & {0, 1, 2, 250001}


def test_empty_and_whitespace_only(xlmr):
    for text in ["", " ", "   \t\n ", "\u3000\u2003"]:
        assert xlmr.encode(text).tolist() == [0, 2]
        assert xlmr.encode(text, add_special_tokens=False).tolist() == []
    batch = xlmr.encode_batch(["", "a", ""])
    assert batch.cu_seqlens.tolist() == [0, 2, 5, 7]


def test_lone_surrogates_become_replacement_char(xlmr):
    assert xlmr.encode("a\ud800b\udfffc").tolist() == xlmr.encode("a\ufffdb\ufffdc").tolist()
    batch = xlmr.encode_batch(["\ud83d", "x\udc00"], return_offsets=True)
    assert batch.sequence(0).tolist() == xlmr.encode("\ufffd").tolist()
    assert batch.sequence(1).tolist() == xlmr.encode("x\ufffd").tolist()


def test_not_a_string_is_invalid_input(xlmr):
    with pytest.raises(InvalidInput):
        xlmr.encode(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        xlmr.encode_batch("one string, not a list")


def test_ten_megabyte_string(default_sp_tokenizer, default_sp_reference):
    # Defined result in linear time: the pieces tile sentencepiece's normalized text
    # exactly, and the token count is within 0.1% of sentencepiece's. (Token-for-token
    # parity is not claimed at this length: float32 path-score ties, see the parity
    # tests.)
    text = DOCS_TEXT
    big = (text * (10_000_000 // len(text) + 1))[:10_000_000]
    ours = default_sp_tokenizer.encode(big, add_special_tokens=False)
    expected = default_sp_reference.encode(big)
    pieces = [default_sp_tokenizer.id_to_piece(int(i)) for i in ours]
    assert "".join(pieces) == default_sp_reference.normalize(big)
    assert abs(len(ours) - len(expected)) <= len(expected) // 1000
    assert ours[:10_000].tolist() == expected[:10_000]
    batch = default_sp_tokenizer.encode_batch([big, "x"], add_special_tokens=False)
    assert batch.sequence(0).tolist() == ours.tolist()


def test_batch_is_packed_and_equals_single(xlmr):
    texts = ENGLISH[:64] + ["", "ｶﾞｷﾞ ①", "👍🏽 " * 50]
    batch = xlmr.encode_batch(texts)
    assert isinstance(batch, EncodedBatch) and len(batch) == len(texts)
    assert isinstance(batch, RaggedBatch)
    assert batch.token_ids.dtype == np.int32 and batch.cu_seqlens.dtype == np.int32
    assert batch.cu_seqlens[-1] == len(batch.token_ids)
    for i, text in enumerate(texts):
        assert batch.sequence(i).tolist() == xlmr.encode(text).tolist()
    assert not batch.truncated.any()
    assert batch.original_lengths.tolist() == batch.lengths.tolist()


@pytest.mark.parametrize("compat", ["hf", "sentencepiece"])
def test_a_batch_of_one_text_equals_the_reference(compat, xlmr_tokenizer_dir, tokenizer_cache_dir,
                                                  hf_reference, default_sp_reference):
    # One text takes encode()'s path inside encode_batch unless it must be cut; each
    # mode against its own reference (tokenizers, sentencepiece).
    tokenizer = Tokenizer.from_model_dir(xlmr_tokenizer_dir, compat=compat, cache_dir=tokenizer_cache_dir)
    for text in ENGLISH[:40] + ["query: ¿Dónde está?", "日本語のテキスト", "👍🏽 " * 30]:
        expected = (hf_reference.encode(text).ids if compat == "hf"
                    else [0] + fairseq(default_sp_reference.encode(text)) + [2])
        batch = tokenizer.encode_batch([text])
        assert batch.token_ids.tolist() == expected and batch.token_ids.dtype == np.int32
        assert batch.cu_seqlens.tolist() == [0, len(expected)] and batch.cu_seqlens.dtype == np.int32
        assert batch.original_lengths.tolist() == [len(expected)] and not batch.truncated.any()
        bare = tokenizer.encode_batch([text], add_special_tokens=False)
        assert bare.token_ids.tolist() == expected[1:-1]
        cut = tokenizer.encode_batch([text], max_length=8, truncation="right")
        assert cut.token_ids.tolist() == (expected if len(expected) <= 8 else expected[:7] + [2])
        assert cut.truncated.tolist() == [len(expected) > 8]
        assert cut.original_lengths.tolist() == [len(expected)]
    ids = [tokenizer.encode_batch(["the same text"]).token_ids for _ in range(2)]
    assert ids[0] is not ids[1] and ids[0].tolist() == ids[1].tolist()   # never a shared buffer


@pytest.mark.parametrize("compat", ["hf", "sentencepiece"])
def test_a_batch_whose_normalization_outgrows_its_scratch_equals_the_reference(
        compat, xlmr_tokenizer_dir, tokenizer_cache_dir, hf_reference, default_sp_reference):
    # The batch kernel sizes its scratch at twice the longest text; the charsmap spells
    # U+FDFA (3 bytes) in 33, so the first texts need the retry with ever larger scratch,
    # and the texts after them must come out as if it never happened.
    tokenizer = Tokenizer.from_model_dir(xlmr_tokenizer_dir, compat=compat, cache_dir=tokenizer_cache_dir)
    texts = ["\ufdfa" * 40, "a", "\ufdfa \u337b \ufdfa", "\u337b" * 30 + " x", "the last text"]
    batch = tokenizer.encode_batch(texts)
    for i, text in enumerate(texts):
        expected = (hf_reference.encode(text).ids if compat == "hf"
                    else [0] + fairseq(default_sp_reference.encode(text)) + [2])
        assert batch.sequence(i).tolist() == expected, text
    # It did outgrow the room: its pieces spell more than twice its bytes.
    spelled = sum(len(tokenizer.id_to_piece(i).encode()) for i in batch.sequence(0)[1:-1].tolist())
    assert spelled > 2 * len(texts[0].encode()) + 16


def test_large_batch_on_threads_equals_single(default_sp_reference, xlmr_tokenizer_dir):
    # Enough bytes to be split across threads; three threads even on a 2-core machine.
    tokenizer = Tokenizer(load_sentencepiece_model(xlmr_tokenizer_dir / "sentencepiece.bpe.model"), threads=3)
    texts = ENGLISH * 3 + [t[::-1] for t in ENGLISH]
    batch = tokenizer.encode_batch(texts, add_special_tokens=False)
    for i in range(0, len(texts), 17):
        assert batch.sequence(i).tolist() == default_sp_reference.encode(texts[i])


@pytest.mark.parametrize("direction", ["right", "left"])
def test_truncation_single(xlmr, direction):
    texts = ENGLISH[:40]
    full = [xlmr.encode(t).tolist() for t in texts]
    batch = xlmr.encode_batch(texts, max_length=12, truncation=direction)
    for i, ids in enumerate(full):
        raw = ids[1:-1]
        kept = raw if len(ids) <= 12 else (raw[:10] if direction == "right" else raw[-10:])
        assert batch.sequence(i).tolist() == [0] + kept + [2]
        assert batch.truncated[i] == (len(ids) > 12)
        assert batch.original_lengths[i] == len(ids)


def test_no_truncation_keeps_everything(xlmr):
    batch = xlmr.encode_batch(ENGLISH[:5], max_length=4, truncation=None)
    assert [len(batch.sequence(i)) for i in range(5)] == [len(xlmr.encode(t)) for t in ENGLISH[:5]]
    assert not batch.truncated.any()


def test_bad_truncation_options(xlmr):
    with pytest.raises(InvalidInput):
        xlmr.encode_batch(["x"], max_length=8, truncation="middle")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        xlmr.encode_batch(["x"], truncation="right")
    with pytest.raises(InvalidInput):
        xlmr.encode_batch(["x"], max_length=1, truncation="right")


def test_pair_template_matches_tokenizers(xlmr, hf_reference):
    for a, b in zip(ENGLISH[:30], ENGLISH[30:60]):
        assert xlmr.encode_pair(a, b).tolist() == hf_reference.encode(a, b).ids


@pytest.mark.parametrize("direction", ["right", "left"])
def test_pair_longest_first_truncation_matches_tokenizers(xlmr, direction, xlmr_tokenizer_dir):
    reference = tokenizers.Tokenizer.from_file(str(xlmr_tokenizer_dir / "tokenizer.json"))
    pairs = [(ENGLISH[i], ENGLISH[i + 1] + " " + ENGLISH[i + 2]) for i in range(0, 60, 3)]
    pairs += [(b, a) for a, b in pairs] + [("short", ENGLISH[5]), ("", ENGLISH[6])]
    for max_length in (4, 7, 8, 13, 20, 33, 64):
        reference.enable_truncation(max_length, strategy="longest_first", direction=direction)
        for a, b in pairs:
            ours = xlmr.encode_pair(a, b, max_length=max_length, truncation=direction).tolist()
            assert ours == reference.encode(a, b).ids, (a, b, max_length)


def test_encode_pairs_one_query_many_docs(xlmr):
    query, docs = ENGLISH[0], ENGLISH[1:20]
    batch = xlmr.encode_pairs(query, docs, max_length=24, truncation="right")
    for i, doc in enumerate(docs):
        assert batch.sequence(i).tolist() == xlmr.encode_pair(query, doc, max_length=24, truncation="right").tolist()
        full = len(xlmr.encode_pair(query, doc))
        assert batch.original_lengths[i] == full and batch.truncated[i] == (full > 24)


def test_offsets_point_at_the_source_text(xlmr):
    texts = ENGLISH[:50]
    batch = xlmr.encode_batch(texts, return_offsets=True)
    assert batch.offsets is not None and batch.offsets.shape == (len(batch.token_ids), 2)
    for i, text in enumerate(texts):
        ids, offsets = batch.sequence(i), batch.sequence_offsets(i)
        assert offsets[0].tolist() == [0, 0] and offsets[-1].tolist() == [0, 0]  # specials
        for k, (token, (start, end)) in enumerate(zip(ids[1:-1], offsets[1:-1])):
            piece = xlmr.id_to_piece(int(token))
            surface = text[start:end].replace(" ", "\u2581")
            assert piece == ("\u2581" + surface if k == 0 else surface), (text, piece, start, end)


def test_offsets_are_characters_not_bytes(xlmr):
    text = "日本語 ｶﾞ Grüße 👍🏽"
    batch = xlmr.encode_batch([text], return_offsets=True)
    offsets = batch.sequence_offsets(0)[1:-1]
    assert offsets[:, 1].max() == len(text)
    assert (np.diff(offsets[:, 0]) >= 0).all() and (offsets[:, 0] <= offsets[:, 1]).all()


def test_a_server_that_only_batches_never_binds_encodes_kernel(tokenizer_cache_dir, xlmr_tokenizer_dir,
                                                               hf_reference):
    # Binding encode()'s kernel compiles it on a fresh install (38 s in hf mode on 2 cores),
    # and the gateway, the bulk job and the calibration run encode_batch only.
    tokenizer = Tokenizer.from_file(xlmr_tokenizer_dir / "tokenizer.json", "hf", cache_dir=tokenizer_cache_dir)
    batch = tokenizer.encode_batch(ENGLISH[:3])
    assert "_encode_one" not in vars(tokenizer)
    assert [tokenizer.encode(text).tolist() for text in ENGLISH[:3]] == \
        [batch.sequence(i).tolist() for i in range(3)] == \
        [hf_reference.encode(text).ids for text in ENGLISH[:3]]
