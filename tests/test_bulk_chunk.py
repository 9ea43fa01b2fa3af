"""``embedserve embed --long-inputs chunk``: documents longer than the model, cut into windows and pooled.

A tiny random XLM-R whose window is 32 tokens (30 besides ``<s>``/``</s>``)
makes documents of a few hundred tokens many windows cheaply. Every vector
is compared with the rule written out in this file on ``tokenizers``' ids
and ``transformers``' hidden states: the content cut into windows of 30
with the overlap asked, ``<s>``/``</s>`` around each, each window's mean
hidden state (the raw vector), the mean of those weighted by content
tokens, cut to ``dimensions``, normalized. The same job runs in-process,
through the Ray actor class (called directly, as Ray's workers call it) and
with ``--url`` through a real ``embedserve serve``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from conftest import build_short_window_model
from embedserve.local.columns import embedding_matrix
from serve_harness import served
from test_bulk_embed import cosines, embed, read_output

MAX_POSITIONS = 32          # the tiny model's window, specials included
ROOM = MAX_POSITIONS - 2    # content tokens per window
COSINE_MIN = 0.99999

WORDS = ("the quick brown fox jumps over a lazy dog while Zürich's 東京 rivers "
         "carry numbers 1234 and symbols like ∑ past ancient libraries and new ideas").split()


def text_of(words: int, seed: int) -> str:
    return " ".join(np.random.default_rng(seed).choice(WORDS, size=words))


def corpus() -> list[str]:
    """Short documents (one window) between long ones (2 to ~10 windows), in no length order."""
    sizes = [3, 150, 12, 60, 1, 220, 25, 90, 8, 40, 300, 5]
    return [text_of(n, seed) for seed, n in enumerate(sizes)]


@pytest.fixture(scope="module")
def long_model_dir(tmp_path_factory: pytest.TempPathFactory, xlmr_tokenizer_dir: Path) -> Path:
    """A random XLM-R with a 32-token window, mean pooling + Normalize (like e5)."""
    return build_short_window_model(tmp_path_factory.mktemp("tiny_chunk_xlmr"), xlmr_tokenizer_dir, 5, MAX_POSITIONS)


@pytest.fixture(scope="module")
def by_hand(long_model_dir: Path):
    """(text, overlap, dimensions) -> (vector, tokens embedded, chunked), from tokenizers + transformers."""
    import torch
    import transformers
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(long_model_dir / "tokenizer.json"))
    model = transformers.AutoModel.from_pretrained(str(long_model_dir)).eval()

    def raw_vector(ids: list[int]) -> np.ndarray:
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor([ids]),
                           attention_mask=torch.ones(1, len(ids), dtype=torch.long)).last_hidden_state
        return hidden[0].double().mean(0).numpy()

    def chunk(text: str, overlap: int, dimensions: int | None = None) -> tuple[np.ndarray, int, bool]:
        ids = tokenizer.encode(text).ids            # <s> ... </s>, never truncated
        bos, content, eos = ids[0], ids[1:-1], ids[-1]
        windows, start = [], 0
        while True:
            windows.append(content[start:start + ROOM])
            if start + ROOM >= len(content):
                break
            start += ROOM - overlap
        weights = np.array([len(w) for w in windows], dtype=np.float64)
        vectors = np.stack([raw_vector([bos, *w, eos]) for w in windows])
        pooled = (weights[:, None] * vectors).sum(0) / weights.sum()
        if dimensions is not None:
            pooled = pooled[:dimensions]
        return pooled / np.linalg.norm(pooled), int(weights.sum()) + 2 * len(windows), len(windows) > 1

    return chunk


@pytest.mark.parametrize("overlap, dimensions", [(0, None), (7, None), (3, 16)])
def test_chunked_vectors_equal_doing_it_by_hand(tmp_path, long_model_dir, by_hand, overlap, dimensions):
    texts = corpus()
    source = tmp_path / "in.txt"
    source.write_text("\n".join(texts) + "\n")
    extra = () if dimensions is None else ("--dimensions", dimensions)
    # Small parts and steps: windows of long documents share steps with short documents.
    assert embed(source, "-o", tmp_path / "out.parquet", "--model", long_model_dir, "--long-inputs", "chunk",
                 "--chunk-overlap", overlap, "--part-size", 5, "--batch-tokens", 96, *extra) == 0
    ids, vectors, table = read_output(tmp_path / "out.parquet")
    assert ids == list(range(1, len(texts) + 1))             # every document, in input order
    expected = [by_hand(t, overlap, dimensions) for t in texts]
    reference = np.stack([e[0] for e in expected])
    assert vectors.shape == reference.shape
    assert cosines(vectors, reference).min() >= COSINE_MIN
    assert np.abs(np.linalg.norm(vectors, axis=1) - 1).max() < 1e-5
    assert table.column("tokens").to_pylist() == [e[1] for e in expected]
    assert table.column("chunked").to_pylist() == [e[2] for e in expected]
    assert sum(table.column("chunked").to_pylist()) == 7       # the corpus does mix both kinds
    assert not any(table.column("truncated").to_pylist())
    assert (tmp_path / "out.parquet.errors.jsonl").read_text() == ""


def test_the_overlap_changes_the_vectors_and_the_token_counts(tmp_path, long_model_dir):
    source = tmp_path / "in.txt"
    source.write_text(text_of(200, seed=1) + "\n")
    outputs = []
    for overlap in (0, 10):
        out = tmp_path / f"o{overlap}.parquet"
        assert embed(source, "-o", out, "--model", long_model_dir, "--long-inputs", "chunk",
                     "--chunk-overlap", overlap) == 0
        outputs.append(read_output(out))
    (_, a, table_a), (_, b, table_b) = outputs
    assert cosines(a, b)[0] < 0.99999
    assert table_b.column("tokens")[0].as_py() > table_a.column("tokens")[0].as_py()


def test_a_part_is_chunked_the_same_wherever_a_run_starts(tmp_path, long_model_dir):
    """What resume relies on: a part's bytes depend only on its own rows (windows are cut within it)."""
    texts = corpus()
    whole, tail = tmp_path / "whole.txt", tmp_path / "tail.txt"
    whole.write_text("\n".join(texts) + "\n")
    tail.write_text("\n".join(texts[4:8]) + "\n")
    common = ("--model", long_model_dir, "--long-inputs", "chunk", "--chunk-overlap", 4, "--part-size", 4,
              "--batch-tokens", 96)
    assert embed(whole, "-o", tmp_path / "whole.parquet", *common) == 0
    assert embed(tail, "-o", tmp_path / "tail.parquet", *common) == 0
    _, all_vectors, all_table = read_output(tmp_path / "whole.parquet")
    _, part_vectors, part_table = read_output(tmp_path / "tail.parquet")
    assert all_vectors[4:8].tobytes() == part_vectors.tobytes()
    assert all_table.column("tokens").to_pylist()[4:8] == part_table.column("tokens").to_pylist()


def test_the_job_records_the_policy_and_the_overlap(tmp_path):
    from embedserve.bulk.job import job_parameters
    from embedserve.bulk.reader import resolve_input
    from embedserve.local.options import EmbedOptions

    source = tmp_path / "in.txt"
    source.write_text("a\n")
    spec = resolve_input(str(source), None, "text", None)
    options = job_parameters(spec, "m", EmbedOptions(long_inputs="chunk", chunk_overlap=5), 10,
                             "parquet", {})["options"]
    assert (options["long_inputs"], options["chunk_overlap"]) == ("chunk", 5)
    assert job_parameters(spec, "m", EmbedOptions(long_inputs="chunk", chunk_overlap=6), 10,
                          "parquet", {}) != job_parameters(spec, "m", EmbedOptions(long_inputs="chunk",
                                                                                  chunk_overlap=5),
                                                           10, "parquet", {})


@pytest.mark.parametrize("flags, message", [
    (("--long-inputs", "chunk", "--chunk-overlap", ROOM), f"chunk_overlap {ROOM} must lie in [0, {ROOM - 1}]"),
    (("--long-inputs", "chunk", "--chunk-overlap", -1), "chunk_overlap must be >= 0"),
    (("--chunk-overlap", 3), "chunk_overlap applies only to the long-input policy chunk"),
])
def test_bad_overlaps_are_one_line_errors(tmp_path, long_model_dir, capsys, flags, message):
    source = tmp_path / "in.txt"
    source.write_text(text_of(100, seed=2) + "\n")
    assert embed(source, "-o", tmp_path / "out.parquet", "--model", long_model_dir, *flags) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out.parquet").exists()


def test_ray_actor_class_chunks_the_same_way(long_model_dir, by_hand):
    from embedserve.integrations.ray import EmbedBatches

    texts = corpus()
    actor = EmbedBatches(long_model_dir, dtype="float32", long_inputs="chunk", chunk_overlap=6,
                         token_budget=96)
    table = actor(pa.table({"text": texts, "n": list(range(len(texts)))}))
    expected = [by_hand(t, 6) for t in texts]
    assert table.column("n").to_pylist() == list(range(len(texts)))
    vectors = embedding_matrix(table.column("embedding"), "float32")
    assert cosines(vectors, np.stack([e[0] for e in expected])).min() >= COSINE_MIN
    assert table.column("tokens").to_pylist() == [e[1] for e in expected]
    assert table.column("chunked").to_pylist() == [e[2] for e in expected]


@pytest.fixture(scope="module")
def gateway_url(long_model_dir):
    """``embedserve serve`` with its default policy (refuse): the bulk client asks for chunk per request."""
    with served("--model", str(long_model_dir)) as url:
        yield url


def test_url_chunks_like_the_in_process_run(tmp_path, long_model_dir, gateway_url, by_hand):
    texts = corpus()
    source = tmp_path / "in.txt"
    source.write_text("\n".join(texts) + "\n")
    common = ("--model", long_model_dir, "--long-inputs", "chunk", "--chunk-overlap", 4, "--part-size", 5)
    assert embed(source, "-o", tmp_path / "local.parquet", *common) == 0
    assert embed(source, "-o", tmp_path / "remote.parquet", "--url", gateway_url, *common) == 0
    local_ids, local, local_table = read_output(tmp_path / "local.parquet")
    remote_ids, remote, remote_table = read_output(tmp_path / "remote.parquet")
    assert remote_ids == local_ids == list(range(1, len(texts) + 1))
    assert cosines(local, remote).min() >= COSINE_MIN
    reference = np.stack([by_hand(t, 4)[0] for t in texts])
    assert cosines(remote, reference).min() >= COSINE_MIN
    for column in ("tokens", "chunked", "truncated"):
        assert remote_table.column(column).equals(local_table.column(column)), column
    assert any(remote_table.column("chunked").to_pylist())
