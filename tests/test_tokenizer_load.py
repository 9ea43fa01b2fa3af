"""Loading .model files: unsupported files fail clearly; the trie and its disk cache.

The files are a small Unigram model sentencepiece trains for the session (conftest
small_sp_model), and, where the reference data is present, SentencePiece's own
Japanese test model.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sentencepiece import sentencepiece_model_pb2 as model_pb2

import embedserve.tokenizer.kernels.trie as trie_module
from conftest import shared_file
from embedserve.errors import ModelLoadError
from embedserve.tokenizer import Tokenizer
from embedserve.tokenizer.formats.model_proto import load_sentencepiece_model
from embedserve.tokenizer.kernels.trie import NODE_DTYPE, build_trie, spec_hash
from embedserve.tokenizer.spec import PieceKind


@pytest.fixture
def proto(small_sp_model) -> model_pb2.ModelProto:
    """A fresh, mutable copy of the small model's ModelProto."""
    message = model_pb2.ModelProto()
    message.ParseFromString(small_sp_model.read_bytes())
    return message


def write(tmp_path, message: model_pb2.ModelProto, name: str = "bad.model"):
    path = tmp_path / name
    path.write_bytes(message.SerializeToString())
    return path


def expect_error(path, *fragments: str) -> None:
    with pytest.raises(ModelLoadError) as info:
        Tokenizer.from_file(path, compat="sentencepiece", cache_dir=None)
    for fragment in (str(path),) + fragments:
        assert fragment in info.value.message


@pytest.mark.parametrize("model_type, name", [(2, "BPE"), (3, "WORD"), (4, "CHAR")])
def test_non_unigram_models_are_rejected(tmp_path, model_type, name, proto):
    proto.trainer_spec.model_type = model_type
    expect_error(write(tmp_path, proto), "trainer_spec.model_type", name, "only UNIGRAM")


def test_byte_pieces_without_byte_fallback_are_rejected(tmp_path, proto):
    # sentencepiece refuses such a file too; with byte_fallback they load (test_tokenizer_sp_user_bytes.py).
    proto.pieces[10].type = int(PieceKind.BYTE)
    expect_error(write(tmp_path, proto), "pieces[10].type", "BYTE", "supported: NORMAL")


def test_user_defined_pieces_and_byte_fallback_are_sentencepiece_mode_only(tmp_path, proto):
    proto.pieces[10].type = int(PieceKind.USER_DEFINED)
    path = write(tmp_path, proto)
    assert Tokenizer.from_file(path, compat="sentencepiece", cache_dir=None).backend == "native-unigram"
    with pytest.raises(ModelLoadError, match="compat='sentencepiece' only"):
        Tokenizer.from_file(path, compat="hf", cache_dir=None)


def test_named_normalizer_without_charsmap_is_rejected(tmp_path, proto):
    proto.normalizer_spec.precompiled_charsmap = b""
    expect_error(write(tmp_path, proto), "normalizer_spec", f"'{proto.normalizer_spec.name}'")


def test_broken_charsmap_is_rejected(tmp_path, proto):
    proto.normalizer_spec.precompiled_charsmap = b"\xff\xff\xff\x7f" + b"\0" * 8
    expect_error(write(tmp_path, proto), "precompiled_charsmap")


def test_not_a_model_file(tmp_path):
    garbage = tmp_path / "garbage.model"
    garbage.write_bytes(b"\xff" * 64)
    expect_error(garbage, "not a SentencePiece ModelProto")
    empty = tmp_path / "empty.model"
    empty.write_bytes(b"")
    expect_error(empty, "pieces")
    expect_error(tmp_path / "missing.model", "no such tokenizer file")


def test_model_dir_without_tokenizer_files(tmp_path):
    with pytest.raises(ModelLoadError, match="no tokenizer.json, sentencepiece.bpe.model or vocab.txt"):
        Tokenizer.from_model_dir(tmp_path, cache_dir=None)


def test_identity_normalizer_loads_and_encodes_unnormalized(tmp_path, proto):
    import sentencepiece

    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.precompiled_charsmap = b""
    path = write(tmp_path, proto, "identity.model")
    reference = sentencepiece.SentencePieceProcessor(model_file=str(path))
    tokenizer = Tokenizer.from_file(path, compat="sentencepiece", cache_dir=None)
    for text in ["ｶﾞｷﾞ  Ａｂｃ ﬁ", "Hello   world ", "①②"]:
        assert tokenizer.encode(text, add_special_tokens=False).tolist() == reference.encode(text)


@pytest.mark.parametrize("source", ["small", "spm/test_ja_model.model"])
def test_trie_holds_every_matchable_piece_and_no_control_piece(source, small_sp_model):
    spec = load_sentencepiece_model(small_sp_model if source == "small" else shared_file(source))
    trie = build_trie(spec)
    assert trie.dtype == NODE_DTYPE and NODE_DTYPE.itemsize == 64

    def find(piece: str) -> int:
        node = 0
        for byte in piece.encode():
            if not int(trie["children"][node][byte >> 6]) >> (byte & 63) & 1:
                return -1
            parent, node = node, int(trie["base"][node]) + byte
            assert trie["check"][node] == parent  # no two nodes share a cell
        return int(trie["token_id"][node])

    for i, piece in enumerate(spec.pieces):
        expected = i if spec.kinds[i] == PieceKind.NORMAL else -1
        assert find(piece) == expected, piece
    assert np.allclose(trie["score64"][trie["token_id"] >= 0],
                       spec.scores[trie["token_id"][trie["token_id"] >= 0]])


@pytest.mark.parametrize("source", ["small", "spm/test_ja_model.model"])
def test_single_child_chains_lie_in_consecutive_cells(source, small_sp_model):
    # The depth-first placement (trie._build): a walk down a chain reads ascending lines.
    # A child cannot follow its parent where the parent's siblings sit there; the rest do
    # (about 2/3 here, 72 % for XLM-R; breadth-first first-fit placed none there).
    trie = build_trie(load_sentencepiece_model(small_sp_model if source == "small" else shared_file(source)))
    children = np.flatnonzero(trie["check"] >= 0)
    parents = trie["check"][children]
    only_child = children[np.bincount(parents, minlength=trie.shape[0])[parents] == 1]
    assert np.mean(only_child - trie["check"][only_child] == 1) > 0.5


@pytest.mark.parametrize("source", ["small", "spm/test_ja_model.model"])
def test_compact_nodes_are_the_trie_in_32_byte_rows(source, small_sp_model):
    trie = build_trie(load_sentencepiece_model(small_sp_model if source == "small" else shared_file(source)))
    nodes, score64 = trie_module.compact_nodes(trie, use_f64=False)
    n = trie.shape[0]
    width = trie_module.COMPACT_COLUMNS
    assert nodes.dtype == np.int32 and nodes.shape[1] == width and width * 4 == 32 and score64.shape == (0,)
    # Base and check are flat offsets (row * COMPACT_COLUMNS); -1 for no parent.
    assert (nodes[:n, trie_module.COMPACT_BASE] == trie["base"] * width).all()
    assert (nodes[:n, trie_module.COMPACT_CHECK] == np.where(trie["check"] >= 0, trie["check"] * width, -1)).all()
    assert (nodes[:n, trie_module.COMPACT_TOKEN] == trie["token_id"]).all()
    # A node with no token scores -inf (a candidate through it never wins).
    has_token = trie["token_id"] >= 0
    scores = nodes.view(np.float32)[:n, trie_module.COMPACT_SCORE32]
    assert (scores[has_token] == trie["score32"][has_token]).all() and (scores[~has_token] == -np.inf).all()
    # Every base + byte is a row (the walk has no bounds test); rows past the trie are free.
    assert nodes.shape[0] >= trie["base"].max() + 256
    assert (nodes[n:, trie_module.COMPACT_CHECK] == -1).all() and (nodes[n:, trie_module.COMPACT_TOKEN] == -1).all()
    flat = nodes.reshape(-1)
    masks = nodes[:, trie_module.COMPACT_MASK:trie_module.COMPACT_MASK + 2].copy().view(np.uint64)[:, 0]
    assert (masks[n:] == 0).all()
    for node in range(0, n, max(1, n // 200)):
        children = [byte for byte in range(256) if int(trie["children"][node][byte >> 6]) >> (byte & 63) & 1]
        # A child is found by its check alone: exactly the bitmap's children.
        for byte in range(256):
            child = nodes[node, trie_module.COMPACT_BASE] + byte * width
            assert (flat[child + trie_module.COMPACT_CHECK] == node * width) == (byte in children)
        # The mask has bit c & 63 for each child c, and no other.
        assert int(masks[node]) == sum({1 << (byte & 63) for byte in children})


def test_hf_mode_reads_float64_scores_only_where_float32_would_differ(small_sp_model):
    trie = build_trie(load_sentencepiece_model(small_sp_model))
    assert trie_module.compact_nodes(trie, use_f64=True)[1].shape == (0,)  # float32 scores throughout
    tokens = np.flatnonzero(trie["token_id"] >= 0)
    trie["score64"][tokens[0]] += 1e-12  # no longer a float32
    nodes, score64 = trie_module.compact_nodes(trie, use_f64=True)
    assert (score64[:trie.shape[0]][tokens] == trie["score64"][tokens]).all()
    assert (np.delete(score64, tokens) == -np.inf).all()  # no token: never a winning candidate
    assert trie_module.compact_nodes(trie, use_f64=False)[1].shape == (0,)  # sentencepiece mode: float32


def test_first_free_skips_taken_cells():
    free_from = trie_module._free_cells(8)
    for cell in (0, 1, 2, 4):
        trie_module._take(free_from, cell)
    assert [trie_module._first_free(free_from, i) for i in range(9)] == [3, 3, 3, 3, 5, 5, 6, 7, 8]
    assert [bool(trie_module._is_free(free_from, i)) for i in range(5)] == [False, False, False, True, False]


@pytest.mark.parametrize("source", ["small", "spm/test_ja_model.model"])
def test_node_views_read_every_field_at_its_slot(source, small_sp_model):
    trie = build_trie(load_sentencepiece_model(small_sp_model if source == "small" else shared_file(source)))
    nodes_u64, nodes_i32, nodes_f32, nodes_f64 = trie_module.node_views(trie)
    assert trie_module.NODE_BYTES == NODE_DTYPE.itemsize == 64
    for k in range(4):
        assert (nodes_u64[:, trie_module.SLOT_CHILDREN + k] == trie["children"][:, k]).all()
    assert (nodes_i32[:, trie_module.SLOT_BASE] == trie["base"]).all()
    assert (nodes_i32[:, trie_module.SLOT_TOKEN] == trie["token_id"]).all()
    assert (nodes_f32[:, trie_module.SLOT_SCORE32] == trie["score32"]).all()
    assert (nodes_f64[:, trie_module.SLOT_SCORE64] == trie["score64"]).all()


@pytest.mark.parametrize("field, view", [("base", np.int32), ("token_id", np.float32)])
def test_a_node_field_off_its_slot_is_refused(field, view):
    # "base" shifted by 2 bytes sits at no int32 column; "token_id" is no float32.
    shifted = np.dtype({"names": ["base", "token_id"], "formats": [np.int32, np.int32],
                        "offsets": [34, 40], "itemsize": 64})
    with pytest.raises(TypeError, match=field):
        trie_module._slot(shifted, field, view)


def test_trie_cache_written_then_used(tmp_path, monkeypatch, small_sp_model):
    path = small_sp_model
    first = Tokenizer.from_file(path, compat="sentencepiece", cache_dir=tmp_path)
    cached = list(tmp_path.glob("trie-*.npy"))
    assert [p.name for p in cached] == [f"trie-{spec_hash(first.spec)}.npy"]

    def no_build(spec):
        raise AssertionError("the cached trie should have been used")

    monkeypatch.setattr(trie_module, "build_trie", no_build)
    second = Tokenizer.from_file(path, compat="sentencepiece", cache_dir=tmp_path)
    text = "I saw a girl with a telescope."
    assert second.encode(text).tolist() == first.encode(text).tolist()


def test_trie_cache_keyed_by_content(tmp_path, proto, small_sp_model):
    proto.pieces[10].score -= 1.0  # one score differs: another trie
    other = write(tmp_path, proto, "other.model")
    Tokenizer.from_file(small_sp_model, compat="sentencepiece", cache_dir=tmp_path)
    Tokenizer.from_file(other, compat="sentencepiece", cache_dir=tmp_path)
    assert len(list(tmp_path.glob("trie-*.npy"))) == 2


def test_corrupt_cache_is_rebuilt(tmp_path, small_sp_model):
    path = small_sp_model
    good = Tokenizer.from_file(path, compat="sentencepiece", cache_dir=tmp_path)
    (cached,) = tmp_path.glob("trie-*.npy")
    cached.write_bytes(b"not a numpy file")
    again = Tokenizer.from_file(path, compat="sentencepiece", cache_dir=tmp_path)
    assert again.encode("hello world").tolist() == good.encode("hello world").tolist()
    assert np.load(cached).dtype == NODE_DTYPE  # rewritten


def test_unwritable_cache_dir_still_loads(tmp_path, small_sp_model):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    tokenizer = Tokenizer.from_file(small_sp_model, compat="sentencepiece",
                                    cache_dir=blocker / "sub")
    without_cache = Tokenizer.from_file(small_sp_model, compat="sentencepiece",
                                        cache_dir=tmp_path / "writable")
    assert tokenizer.encode("hello world").tolist() == without_cache.encode("hello world").tolist()


def test_a_home_that_cannot_be_found_means_no_trie_cache(monkeypatch, small_sp_model):
    """A uid without a passwd entry and no $HOME (a container run as an arbitrary uid): the
    default cache directory's ``~`` cannot be expanded, so the trie is built in memory and the
    tokenizer still gives sentencepiece's ids."""
    import pwd

    import sentencepiece

    def no_entry(uid: int):
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    with pytest.raises(RuntimeError):
        Path("~").expanduser()
    tokenizer = Tokenizer.from_file(small_sp_model, compat="sentencepiece")   # the default cache_dir, "~/..."
    reference = sentencepiece.SentencePieceProcessor(model_file=str(small_sp_model))
    for text in ("I saw a girl with a telescope.", "def f(x): return x ** 2"):
        assert tokenizer.encode(text, add_special_tokens=False).tolist() == reference.encode(text)
