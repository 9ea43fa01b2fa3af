"""``embedserve embed`` in one process: parity with sentence-transformers, inputs, outputs, errors.

Parity runs the default model (multilingual-e5-small) against
sentence-transformers' ``encode`` of the same texts; the file mechanics run a
tiny random BERT. The command runs in-process through ``embedserve.cli.main``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bulk_corpus import documents, write_jsonl
from embedserve.cli import main
from embedserve.local.columns import embedding_matrix


def embed(*argv: object) -> int:
    # float32: the outputs are compared with float32 references (the command's default is auto).
    return main(["embed", *map(str, argv), "--no-progress", "--dtype", "float32"])


def read_output(path: Path, precision: str = "float32") -> tuple[list, np.ndarray, pa.Table]:
    table = pq.read_table(path)
    return table.column("id").to_pylist(), embedding_matrix(table.column("embedding"), precision), table


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def sentence_transformer(default_model_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(default_model_dir), device="cpu")


@pytest.fixture(scope="module")
def sixty_documents(sentence_transformer) -> tuple[list[str], np.ndarray]:
    """60 documents of mixed lengths and sentence-transformers' vectors of them (two tests)."""
    texts = documents(60)
    return texts, sentence_transformer.encode(texts, batch_size=16, convert_to_numpy=True)


def test_vectors_equal_sentence_transformers(tmp_path, default_model_dir, sentence_transformer, sixty_documents):
    texts, reference = sixty_documents
    ids = [f"doc-{i}" for i in range(len(texts))]
    source = write_jsonl(tmp_path / "in.jsonl", texts, ids)
    assert embed(source, "-o", tmp_path / "out.parquet", "--model", default_model_dir,
                 "--id-field", "id", "--part-size", 25) == 0   # two whole parts and a short one
    got_ids, vectors, table = read_output(tmp_path / "out.parquet")
    assert got_ids == ids  # input order, every row
    assert vectors.dtype == np.float32 and vectors.shape == (60, 384)
    assert cosines(vectors, reference).min() >= 0.99999
    lengths = sentence_transformer.tokenize(texts)["attention_mask"].sum(1).numpy()
    assert table.column("tokens").to_pylist() == lengths.tolist()
    assert not any(table.column("truncated").to_pylist()) and not any(table.column("chunked").to_pylist())
    assert (tmp_path / "out.parquet.errors.jsonl").read_text() == ""
    assert not (tmp_path / "out.parquet.parts").exists()  # the work directory goes once the output is whole


def test_unsorted_steps_of_mixed_lengths_equal_sentence_transformers(tmp_path, default_model_dir,
                                                                     sixty_documents):
    # A bulk job's steps hold up to BULK_CPU_TOKEN_BUDGET tokens; without length sorting
    # (--sort-window 1) one step holds 1-word documents next to 300-word ones, and every
    # document must still get exactly its own vector.
    from embedserve.local.embedder import LocalEmbedder
    from embedserve.local.options import BULK_CPU_TOKEN_BUDGET, EmbedOptions

    texts, reference = sixty_documents
    embedder = LocalEmbedder(default_model_dir, EmbedOptions(window=1))
    try:
        assert embedder.token_budget == BULK_CPU_TOKEN_BUDGET
        prepared = embedder.prepare(texts)
        lengths = prepared.texts.sequences.lengths
        widest = max(np.ptp(lengths[rows]) for rows in prepared.batches)
        assert len(prepared.batches) < len(texts) // 4 and widest > 100   # big steps, mixed lengths
    finally:
        embedder.close()
    source = write_jsonl(tmp_path / "in.jsonl", texts)
    assert embed(source, "-o", tmp_path / "out.parquet", "--model", default_model_dir,
                 "--sort-window", 1) == 0
    _, vectors, _ = read_output(tmp_path / "out.parquet")
    assert cosines(vectors, reference).min() >= 0.99999


def test_query_prompt_equals_sentence_transformers_prompt(tmp_path, default_model_dir, sentence_transformer):
    texts = documents(12)[::-1]
    source = tmp_path / "queries.txt"
    source.write_text("\n".join(texts) + "\n")
    assert embed(source, "-o", tmp_path / "q.parquet", "--model", default_model_dir,
                 "--input-type", "query") == 0
    ids, vectors, _ = read_output(tmp_path / "q.parquet")
    assert ids == list(range(1, 13))  # text: the line number
    reference = sentence_transformer.encode(texts, prompt_name="query", convert_to_numpy=True)
    assert cosines(vectors, reference).min() >= 0.99999
    plain = sentence_transformer.encode(texts, convert_to_numpy=True)
    assert cosines(vectors, plain).min() < 0.9999  # the prompt did change the vectors


@pytest.fixture(scope="module")
def corpus():
    return documents(90)


@pytest.fixture(scope="module")
def jsonl_reference(tmp_path_factory, tiny_bert_dir, corpus):
    directory = tmp_path_factory.mktemp("reference")
    source = write_jsonl(directory / "in.jsonl", corpus)
    assert embed(source, "-o", directory / "out.parquet", "--model", tiny_bert_dir, "--part-size", 32) == 0
    return read_output(directory / "out.parquet")


def test_every_input_format_gives_the_same_vectors(tmp_path, tiny_bert_dir, corpus, jsonl_reference):
    ids, reference, _ = jsonl_reference
    assert ids == list(range(90))
    with open(tmp_path / "in.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["key", "body"])
        writer.writerows([[f"k{i}", text] for i, text in enumerate(corpus)])
    pq.write_table(pa.table({"body": corpus, "key": [f"k{i}" for i in range(90)]}), tmp_path / "in.parquet",
                   row_group_size=25)
    (tmp_path / "in.txt").write_text("\n".join(corpus) + "\n")
    split = tmp_path / "split"
    split.mkdir()
    write_jsonl(split / "a.jsonl", corpus[:41])
    write_jsonl(split / "b.jsonl", corpus[41:])
    runs = {"csv": (tmp_path / "in.csv", "--text-field", "body", "--id-field", "key"),
            "parquet": (tmp_path / "in.parquet", "--text-field", "body", "--id-field", "key"),
            "text": (tmp_path / "in.txt",),
            "directory": (split,),
            "glob": (str(split / "*.jsonl"),)}
    expected_ids = {"csv": [f"k{i}" for i in range(90)], "parquet": [f"k{i}" for i in range(90)],
                    "text": list(range(1, 91)), "directory": list(range(90)), "glob": list(range(90))}
    for name, (source, *flags) in runs.items():
        out = tmp_path / f"{name}.parquet"
        assert embed(source, "-o", out, "--model", tiny_bert_dir, "--part-size", 32, *flags) == 0, name
        got_ids, vectors, _ = read_output(out)
        assert got_ids == expected_ids[name], name
        np.testing.assert_array_equal(vectors, reference, err_msg=name)


def test_bad_rows_go_to_the_errors_file_and_the_run_goes_on(tmp_path, tiny_bert_dir, corpus, jsonl_reference):
    lines = [json.dumps({"id": "a", "text": corpus[0]}), json.dumps({"id": "b"}),
             json.dumps({"id": "c", "text": 42}), "{not json", json.dumps({"id": "d", "text": ""}),
             json.dumps(["a list"]), json.dumps({"text": corpus[1]}), "",
             json.dumps({"id": 7, "text": corpus[2]})]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    assert embed(tmp_path / "in.jsonl", "-o", tmp_path / "out.parquet", "--model", tiny_bert_dir,
                 "--id-field", "id", "--part-size", 4) == 0
    ids, vectors, _ = read_output(tmp_path / "out.parquet")
    assert ids == ["a", "7"]
    np.testing.assert_array_equal(vectors, jsonl_reference[1][[0, 2]])
    errors = [json.loads(line) for line in (tmp_path / "out.parquet.errors.jsonl").read_text().splitlines()]
    assert errors == [
        {"row": 1, "id": "b", "reason": "missing field 'text'"},
        {"row": 2, "id": "c", "reason": "not text: field 'text' is int"},
        {"row": 3, "id": None, "reason": "not valid JSON"},
        {"row": 4, "id": "d", "reason": "empty text"},
        {"row": 5, "id": None, "reason": "not a JSON object"},
        {"row": 6, "id": None, "reason": "missing field 'id'"},
        {"row": 7, "id": None, "reason": "empty text"},
    ]


def test_long_documents_are_refused_or_truncated(tmp_path, tiny_bert_dir, corpus):
    long_text = " ".join(corpus) * 2
    source = write_jsonl(tmp_path / "in.jsonl", [corpus[0], long_text, corpus[1]])
    assert embed(source, "-o", tmp_path / "refused.parquet", "--model", tiny_bert_dir) == 0
    ids, _, _ = read_output(tmp_path / "refused.parquet")
    assert ids == [0, 2]
    (error,) = [json.loads(line) for line in (tmp_path / "refused.parquet.errors.jsonl").read_text().splitlines()]
    assert error["row"] == 1 and error["reason"].startswith("too long: ") and "at most 512" in error["reason"]
    assert embed(source, "-o", tmp_path / "cut.parquet", "--model", tiny_bert_dir, "--long-inputs", "truncate") == 0
    ids, vectors, table = read_output(tmp_path / "cut.parquet")
    assert ids == [0, 1, 2]
    assert table.column("truncated").to_pylist() == [False, True, False]
    assert table.column("tokens").to_pylist()[1] == 512


def test_npy_output_and_dimensions(tmp_path, tiny_bert_dir, corpus, jsonl_reference):
    source = write_jsonl(tmp_path / "in.jsonl", corpus)
    assert embed(source, "-o", tmp_path / "out.npy", "--model", tiny_bert_dir, "--part-size", 32) == 0
    matrix = np.load(tmp_path / "out.npy")
    np.testing.assert_array_equal(matrix, jsonl_reference[1])
    ids = [json.loads(line) for line in (tmp_path / "out.ids.jsonl").read_text().splitlines()]
    assert ids == list(range(90))
    assert embed(source, "-o", tmp_path / "half.npy", "--model", tiny_bert_dir, "--dimensions", 16,
                 "--precision", "float16") == 0
    half = np.load(tmp_path / "half.npy")
    assert half.dtype == np.float16 and half.shape == (90, 16)
    cut = jsonl_reference[1][:, :16]
    expected = cut / np.linalg.norm(cut, axis=1, keepdims=True)  # Matryoshka: cut, then renormalize
    np.testing.assert_allclose(half.astype(np.float32), expected, atol=1e-3)


def test_an_existing_output_is_kept_unless_overwrite(tmp_path, tiny_bert_dir, corpus, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", corpus[:5])
    out = tmp_path / "out.parquet"
    assert embed(source, "-o", out, "--model", tiny_bert_dir) == 0
    assert embed(source, "-o", out, "--model", tiny_bert_dir) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    # Refused before the model is read: a directory that is no model gets the same answer.
    (tmp_path / "not-a-model").mkdir()
    assert embed(source, "-o", out, "--model", tmp_path / "not-a-model") == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert embed(source, "-o", out, "--model", tiny_bert_dir, "--overwrite") == 0


def test_an_unknown_prompt_or_column_is_a_clear_error(tmp_path, tiny_bert_dir, corpus, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", corpus[:3])
    assert embed(source, "-o", tmp_path / "a.parquet", "--model", tiny_bert_dir, "--input-type", "doc") == 2
    assert "unknown prompt 'doc'" in capsys.readouterr().err
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "in.parquet")
    assert embed(tmp_path / "in.parquet", "-o", tmp_path / "b.parquet", "--model", tiny_bert_dir) == 2
    assert "no column 'text'; its columns are: body" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("")
    assert embed(tmp_path / "empty.jsonl", "-o", tmp_path / "c.parquet", "--model", tiny_bert_dir) == 2
    assert "the input has no rows" in capsys.readouterr().err
    assert not (tmp_path / "c.parquet.parts").exists()
    # Refused before the model is read (a directory that is no model), Parquet by its footer.
    (tmp_path / "not-a-model").mkdir()
    pq.write_table(pa.table({"text": pa.array([], pa.string())}), tmp_path / "empty.parquet")
    for empty in ("empty.jsonl", "empty.parquet"):
        assert embed(tmp_path / empty, "-o", tmp_path / "d.parquet", "--model", tmp_path / "not-a-model") == 2
        assert "the input has no rows" in capsys.readouterr().err


def test_a_missing_model_directory_is_a_clear_error(tmp_path, corpus, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", corpus[:3])
    assert embed(source, "-o", tmp_path / "out.parquet", "--model", tmp_path / "missing") == 2
    assert f"model directory not found: {tmp_path / 'missing'}" in capsys.readouterr().err
    assert not (tmp_path / "out.parquet.parts").exists()


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_precisions_equal_quantize_embeddings(tmp_path, tiny_bert_dir, corpus, jsonl_reference, precision):
    from sentence_transformers.util.quantization import quantize_embeddings

    from embedserve.calibration import calibration_dir, load_calibration

    source = write_jsonl(tmp_path / "in.jsonl", corpus)
    cache = tmp_path / "cache"
    out = tmp_path / f"{precision}.parquet"
    assert embed(source, "-o", out, "--model", tiny_bert_dir, "--cache-dir", cache, "--part-size", 32,
                 "--precision", precision) == 0
    _, stored, table = read_output(out, precision)
    floats = jsonl_reference[1]
    # The ranges the job used are the model's stored calibration (what a replica serves with).
    ranges = None
    if precision in ("int8", "uint8"):
        ranges = load_calibration(calibration_dir(cache, tiny_bert_dir, "float32")).ranges(None, True)
    expected = quantize_embeddings(floats, precision, ranges=ranges)
    assert stored.dtype == expected.dtype and stored.shape == expected.shape
    assert stored.tobytes() == expected.tobytes()
    if precision.endswith("binary"):
        assert table.schema.field("embedding").type == pa.binary(4)  # 32 dimensions, 8 per byte
    assert embed(source, "-o", tmp_path / f"{precision}.npy", "--model", tiny_bert_dir, "--cache-dir", cache,
                 "--part-size", 32, "--precision", precision) == 0
    assert np.load(tmp_path / f"{precision}.npy").tobytes() == expected.tobytes()
