"""Inputs longer than the model's window: refuse, truncate, or chunk and pool.

The pure steps of ``model/windows.py`` and ``gateway/long_inputs.py`` are
checked directly (window bounds, windows, pooling, which policy a request
gets). End to end, a real replica serves a tiny random XLM-R whose window
is 32 tokens (30 besides ``<s>``/``</s>``), so inputs of a few hundred
tokens make many windows cheaply; gateways in front of it run with the default policy (refuse) and
with ``--auto-truncate chunk``. Every vector is compared with
sentence-transformers run on token ids built by hand in this file from
``tokenizers``' encoding: truncated, or cut into windows, embedded one by
one (Transformer + Pooling: the raw vector), averaged weighted by content
tokens, cut to ``dimensions``, normalized. ``embedserve serve`` is started
once to show the flags reach its gateway.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from conftest import build_short_window_model
from embedserve.cli import build_parser
from embedserve.entrypoint import GATEWAY_LISTENING
from embedserve.errors import InvalidInput
from embedserve.gateway.app import create_app
from embedserve.gateway.cli import long_input_args
from embedserve.gateway.long_inputs import LongInputPolicy, resolve_policy, server_policy
from embedserve.launch.processes import popen_listening, stop_popen
from embedserve.model.windows import Windows, cut_windows, pool_windows, window_bounds
from embedserve.ragged import from_sequences
from gateway_harness import GatewayServer, SchedulerProcess, gateway_settings

MAX_POSITIONS = 32          # the tiny model's window, specials included
ROOM = MAX_POSITIONS - 2    # content tokens per window (<s> ... </s>)
OVERLAP = 4                 # the chunking gateway's --chunk-overlap
COSINE_MIN = 0.99999

WORDS = ("the quick brown fox jumps over a lazy dog while Zürich's 東京 rivers "
         "carry numbers 1234 and symbols like ∑ past ancient libraries and new ideas").split()


def long_text(words: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(rng.choice(WORDS, size=words))


# -- pure functions ----------------------------------------------------------

@pytest.mark.parametrize("content, room, overlap, expected", [
    (5, 30, 0, [(0, 5)]),
    (30, 30, 4, [(0, 30)]),
    (31, 30, 0, [(0, 30), (30, 31)]),
    (10, 4, 0, [(0, 4), (4, 8), (8, 10)]),
    (10, 4, 1, [(0, 4), (3, 7), (6, 10)]),
    (10, 4, 3, [(0, 4), (1, 5), (2, 6), (3, 7), (4, 8), (5, 9), (6, 10)]),
    (0, 4, 0, [(0, 0)]),
])
def test_window_bounds_table(content, room, overlap, expected) -> None:
    assert window_bounds(content, room, overlap) == expected


def test_window_bounds_cover_every_token_with_the_overlap_asked() -> None:
    for room in range(1, 9):
        for overlap in range(room):
            for content in range(1, 40):
                bounds = window_bounds(content, room, overlap)
                assert bounds[0][0] == 0 and bounds[-1][1] == content
                assert all(0 < stop - start <= room for start, stop in bounds)
                for (a, b), (c, _d) in zip(bounds, bounds[1:]):
                    assert b - c == overlap and c > a   # each window moves on, sharing `overlap`
                assert len(bounds) == 1 + max(0, -(-(content - room) // (room - overlap)))


@pytest.mark.parametrize("room, overlap", [(0, 0), (4, 4), (4, -1)])
def test_window_bounds_refuse_impossible_windows(room, overlap) -> None:
    with pytest.raises(ValueError):
        window_bounds(10, room, overlap)


def test_cut_windows_repeats_the_specials_and_maps_windows_to_inputs() -> None:
    bos, eos = 0, 2
    batch = from_sequences([[bos, 10, 11, eos], [bos, *range(100, 109), eos], [bos, 7, eos]])
    windows = cut_windows(batch, 1, 1, max_positions=6, overlap=1)
    got = [windows.batch.sequence(i).tolist() for i in range(windows.batch.num_sequences)]
    assert got == [[bos, 10, 11, eos],
                   [bos, 100, 101, 102, 103, eos], [bos, 103, 104, 105, 106, eos],
                   [bos, 106, 107, 108, eos],
                   [bos, 7, eos]]
    assert windows.window_cu.tolist() == [0, 1, 4, 5]
    assert windows.weights.tolist() == [2, 4, 4, 3, 1]
    assert windows.split and windows.num_inputs == 3


def test_cut_windows_leaves_a_batch_that_fits_as_it_is() -> None:
    batch = from_sequences([[0, 5, 2], [0, 5, 6, 7, 2]])
    windows = cut_windows(batch, 1, 1, max_positions=5, overlap=0)
    assert windows.batch is batch and not windows.split
    assert windows.window_cu.tolist() == [0, 1, 2]


def test_pool_windows_is_the_token_weighted_mean_and_keeps_single_windows_exact() -> None:
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((5, 3)).astype(np.float32)
    windows = Windows(from_sequences([[1]] * 5), np.array([0, 1, 4, 5]), np.array([2, 4, 4, 3, 1]))
    pooled = pool_windows(vectors, windows)
    assert pooled.dtype == np.float32 and pooled.shape == (3, 3)
    assert np.array_equal(pooled[0], vectors[0]) and np.array_equal(pooled[2], vectors[4])
    by_hand = (4 * vectors[1].astype(np.float64) + 4 * vectors[2] + 3 * vectors[3]) / 11
    assert np.allclose(pooled[1], by_hand, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError):
        pool_windows(vectors[:4], windows)


REFUSE = LongInputPolicy()
CHUNK = LongInputPolicy("chunk", "right", 3)
LEFT = LongInputPolicy("truncate", "left", 0)


@pytest.mark.parametrize("default, truncate, direction, overlap, expected", [
    (REFUSE, None, None, None, REFUSE),
    (REFUSE, True, None, None, LongInputPolicy("truncate", "right", 0)),
    (REFUSE, True, "Left", None, LongInputPolicy("truncate", "left", 0)),
    (REFUSE, "END", None, None, LongInputPolicy("truncate", "right", 0)),
    (REFUSE, "start", None, None, LongInputPolicy("truncate", "left", 0)),
    (REFUSE, "Chunk", None, 5, LongInputPolicy("chunk", "right", 5)),
    (CHUNK, None, None, None, CHUNK),
    (CHUNK, False, None, None, LongInputPolicy("refuse", "right", 3)),
    (CHUNK, "NONE", None, None, LongInputPolicy("refuse", "right", 3)),
    (CHUNK, None, None, 0, LongInputPolicy("chunk", "right", 0)),
    (LEFT, None, None, None, LEFT),
    (LEFT, True, None, None, LEFT),                       # the server's direction
    (LEFT, None, "right", None, LongInputPolicy("truncate", "right", 0)),
    (LEFT, "right", "right", None, LongInputPolicy("truncate", "right", 0)),
])
def test_request_fields_override_the_server_policy(default, truncate, direction, overlap,
                                                   expected) -> None:
    assert resolve_policy(default, truncate, direction, overlap, room=30) == expected


@pytest.mark.parametrize("truncate, direction, overlap, field", [
    ("sideways", None, None, "truncate"),
    ("", None, None, "truncate"),
    ("chunk", None, -1, "chunk_overlap"),
    ("chunk", None, 30, "chunk_overlap"),
    (None, None, 10**12, "chunk_overlap"),
    ("START", "right", None, "truncation_direction"),
    (True, "up", None, "truncation_direction"),
])
def test_bad_request_fields_are_invalid_input_naming_the_field(truncate, direction, overlap,
                                                               field) -> None:
    with pytest.raises(InvalidInput) as error:
        resolve_policy(REFUSE, truncate, direction, overlap, room=30)
    assert error.value.field == field and field in error.value.message


def test_server_policy_from_flags() -> None:
    assert server_policy("refuse", 0, 30) == REFUSE
    assert server_policy("left", 2, 30) == LongInputPolicy("truncate", "left", 2)
    assert server_policy("chunk", 29, 30) == LongInputPolicy("chunk", "right", 29)
    for name, overlap in (("sideways", 0), ("chunk", 30), ("chunk", -1)):
        with pytest.raises(ValueError):
            server_policy(name, overlap, 30)


def test_flags_parse_for_gateway_serve_and_cluster() -> None:
    parser = build_parser()
    bare = parser.parse_args(["gateway", "--upstream", "x:1", "--auto-truncate"])
    assert (bare.auto_truncate, bare.chunk_overlap) == ("right", 0)     # TEI's bare flag
    default = parser.parse_args(["serve"])
    assert default.auto_truncate == "refuse"
    cluster = parser.parse_args(["cluster", "--auto-truncate", "chunk", "--chunk-overlap", "7"])
    assert long_input_args(cluster) == ("--auto-truncate", "chunk", "--chunk-overlap", "7")
    for bad in (["--auto-truncate", "sideways"], ["--chunk-overlap", "-1"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["serve", *bad])


# -- end to end --------------------------------------------------------------

@pytest.fixture(scope="module")
def long_model_dir(tmp_path_factory: pytest.TempPathFactory, xlmr_tokenizer_dir: Path) -> Path:
    """A random XLM-R with a 32-token window, mean pooling + Normalize (like e5)."""
    return build_short_window_model(tmp_path_factory.mktemp("tiny_short_xlmr"), xlmr_tokenizer_dir, 3, MAX_POSITIONS)


@pytest.fixture(scope="module")
def reference(long_model_dir: Path):
    """sentence-transformers and tokenizers over the same directory."""
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    return (SentenceTransformer(str(long_model_dir), device="cpu"),
            Tokenizer.from_file(str(long_model_dir / "tokenizer.json")))


def ids_by_hand(reference, text: str) -> list[int]:
    return reference[1].encode(text).ids          # <s> ... </s>, never truncated


def raw_vector(reference, ids: list[int]) -> np.ndarray:
    """sentence-transformers' Transformer + Pooling on ``ids``: the vector before Normalize."""
    import torch

    st = reference[0]
    features = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
    with torch.no_grad():
        return st[1](st[0](features))["sentence_embedding"][0].double().numpy()


def unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


def chunk_by_hand(reference, ids: list[int], overlap: int, dimensions: int | None = None,
                  normalize: bool = True) -> tuple[np.ndarray, int]:
    """The chunk-and-pool rule written out: windows, raw vectors, weighted mean, cut, normalize.

    Returns the vector and the tokens embedded (specials of every window included).
    """
    bos, content, eos = ids[0], ids[1:-1], ids[-1]
    windows = []
    start = 0
    while True:
        windows.append(content[start:start + ROOM])
        if start + ROOM >= len(content):
            break
        start += ROOM - overlap
    weights = np.array([len(w) for w in windows], dtype=np.float64)
    vectors = np.stack([raw_vector(reference, [bos, *w, eos]) for w in windows])
    pooled = (weights[:, None] * vectors).sum(axis=0) / weights.sum()
    if dimensions is not None:
        pooled = pooled[:dimensions]
    return (unit(pooled) if normalize else pooled), int(weights.sum()) + 2 * len(windows)


def assert_close(got, expected) -> None:
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    assert got.shape == expected.shape
    cosine = got @ expected / (np.linalg.norm(got) * np.linalg.norm(expected))
    assert cosine >= COSINE_MIN, cosine
    assert abs(np.linalg.norm(got) / np.linalg.norm(expected) - 1) < 1e-4


@pytest.fixture(scope="module")
def replica(long_model_dir: Path):
    process = SchedulerProcess(long_model_dir, threads=1)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def refusing(long_model_dir: Path, replica: SchedulerProcess):
    """A gateway with the default policy: refuse."""
    server = GatewayServer(gateway_settings(long_model_dir, [replica.address]))
    server.wait_ready()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def chunking(long_model_dir: Path, replica: SchedulerProcess):
    """A gateway started with --auto-truncate chunk --chunk-overlap 4."""
    server = GatewayServer(gateway_settings(long_model_dir, [replica.address],
                                            auto_truncate="chunk", chunk_overlap=OVERLAP))
    server.wait_ready()
    yield server
    server.stop()


def openai_client(server: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_refuse_is_openai_shaped_413(refusing, reference, long_model_dir) -> None:
    text = long_text(80, seed=1)
    assert len(ids_by_hand(reference, text)) > MAX_POSITIONS
    with refusing.client() as http:
        reply = http.post("/v1/embeddings", json={"input": ["short", text]})
        explicit = http.post("/embed", json={"inputs": text, "truncate": False})
    assert reply.status_code == 413, reply.text
    error = reply.json()["error"]
    assert (error["type"], error["code"], error["param"]) == \
        ("invalid_request_error", "input_too_long", "input[1]")
    assert f"at most {MAX_POSITIONS}" in error["message"]
    assert explicit.status_code == 413 and explicit.json()["error"]["param"] == "inputs[0]"
    # Each says how to be served instead: the request's field and the server's flag.
    for message in (error["message"], explicit.json()["error"]["message"]):
        assert '"truncate" to true' in message and "--auto-truncate" in message, message
    with pytest.raises(openai.APIStatusError) as raised:
        openai_client(refusing).embeddings.create(model=long_model_dir.name, input=text)
    assert raised.value.status_code == 413


def test_too_many_inputs_is_a_413_naming_the_flag(refusing) -> None:
    limit = refusing.settings.max_inputs
    with refusing.client() as http:
        reply = http.post("/embed", json={"inputs": ["a"] * (limit + 1)})
    assert reply.status_code == 413, reply.text
    assert reply.json()["error"]["param"] == "inputs"
    assert f"at most {limit}" in reply.json()["error"]["message"]
    assert "--max-inputs" in reply.json()["error"]["message"]


def test_truncate_right_equals_sentence_transformers(refusing, reference, long_model_dir) -> None:
    texts = [long_text(90, seed=2), "a short one", long_text(50, seed=3)]
    expected = reference[0].encode(texts, normalize_embeddings=False)   # ST cuts at 32, from the right
    for truncate in (True, "END", "right"):
        reply = openai_client(refusing).embeddings.create(
            model=long_model_dir.name, input=texts, extra_body={"truncate": truncate})
        for item, reference_vector in zip(reply.data, expected):
            assert_close(item.embedding, reference_vector)
        lengths = [min(len(ids_by_hand(reference, t)), MAX_POSITIONS) for t in texts]
        assert reply.usage.prompt_tokens == reply.usage.total_tokens == sum(lengths)


def test_truncate_left_equals_ids_cut_by_hand(refusing, reference) -> None:
    text = long_text(70, seed=4)
    ids = ids_by_hand(reference, text)
    kept = [ids[0], *ids[1:-1][-ROOM:], ids[-1]]
    expected = unit(raw_vector(reference, kept))
    with refusing.client() as http:
        tei = http.post("/embed", json={"inputs": [text], "truncate": True,
                                        "truncation_direction": "Left"})
        cohere = http.post("/v1/embeddings", json={"input": text, "truncate": "START"})
    assert tei.status_code == 200, tei.text
    assert_close(tei.json()[0], expected)
    assert_close(cohere.json()["data"][0]["embedding"], expected)
    assert cohere.json()["usage"]["prompt_tokens"] == MAX_POSITIONS


@pytest.mark.parametrize("overlap", [0, 7])
def test_chunk_and_pool_equals_doing_it_by_hand(refusing, reference, long_model_dir, overlap) -> None:
    texts = [long_text(150, seed=5), long_text(45, seed=6)]
    reply = openai_client(refusing).embeddings.create(
        model=long_model_dir.name, input=texts,
        extra_body={"truncate": "chunk", "chunk_overlap": overlap})
    expected = [chunk_by_hand(reference, ids_by_hand(reference, t), overlap) for t in texts]
    for item, (vector, _) in zip(reply.data, expected):
        assert_close(item.embedding, vector)
    tokens = sum(n for _, n in expected)
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == tokens
    assert tokens > sum(len(ids_by_hand(reference, t)) for t in texts)   # specials per window


def test_chunk_then_dimensions_then_normalize(refusing, reference) -> None:
    text = long_text(120, seed=7)
    ids = ids_by_hand(reference, text)
    with refusing.client() as http:
        cut = http.post("/v1/embeddings", json={"input": text, "truncate": "chunk", "dimensions": 12})
        raw = http.post("/embed", json={"inputs": text, "truncate": "chunk", "normalize": False})
        raw_cut = http.post("/embed", json={"inputs": text, "truncate": "chunk", "normalize": False,
                                            "dimensions": 12})
    assert cut.status_code == raw.status_code == raw_cut.status_code == 200
    # Pool at full width, then cut, then normalize: not the pool of cut-and-normalized windows.
    assert_close(cut.json()["data"][0]["embedding"], chunk_by_hand(reference, ids, 0, dimensions=12)[0])
    assert_close(raw.json()[0], chunk_by_hand(reference, ids, 0, normalize=False)[0])
    assert_close(raw_cut.json()[0], chunk_by_hand(reference, ids, 0, 12, normalize=False)[0])


def test_chunked_inputs_in_embedding_types_are_the_pooled_vector_quantized(refusing, reference) -> None:
    """embedding_types on a chunked input: the gateway pools, so it quantizes (binary needs no
    calibration ranges); the float entry is the pooled vector and the binary one its bits."""
    from sentence_transformers.quantization import quantize_embeddings

    texts = [long_text(120, seed=11), "short"]
    with refusing.client() as http:
        reply = http.post("/embed", json={"inputs": texts, "truncate": "chunk",
                                          "embedding_types": ["float", "ubinary", "binary"]})
    assert reply.status_code == 200, reply.text
    by_type = reply.json()["embeddings"]
    expected = np.array([chunk_by_hand(reference, ids_by_hand(reference, t), 0)[0] for t in texts])
    for got, want in zip(by_type["float"], expected):
        assert_close(got, want)
    floats = np.array(by_type["float"], dtype=np.float32)
    for kind in ("ubinary", "binary"):
        assert by_type[kind] == quantize_embeddings(floats, precision=kind).tolist()


def test_a_batch_of_short_and_long_inputs_keeps_its_order(chunking, reference, long_model_dir) -> None:
    texts = ["first, short", long_text(100, seed=8), "third", long_text(200, seed=9),
             long_text(28, seed=10), "last"]
    reply = openai_client(chunking).embeddings.create(model=long_model_dir.name, input=texts,
                                                       encoding_format="float")
    assert [item.index for item in reply.data] == list(range(len(texts)))
    tokens = 0
    for item, text in zip(reply.data, texts):
        vector, embedded = chunk_by_hand(reference, ids_by_hand(reference, text), OVERLAP)
        assert_close(item.embedding, vector)
        tokens += embedded
    assert reply.usage.prompt_tokens == tokens
    short = reference[0].encode(["first, short", "third", "last"])
    for i, row in zip((0, 2, 5), short):
        assert_close(reply.data[i].embedding, row)


def test_token_ids_at_the_window_edges_are_chunked(chunking, reference) -> None:
    rng = np.random.default_rng(11)
    bos, eos = ids_by_hand(reference, "x")[0], ids_by_hand(reference, "x")[-1]
    sequences = [rng.integers(5, 250000, size=n).tolist() for n in (ROOM, ROOM + 1, 3 * ROOM, 1)]
    with chunking.client() as http:
        reply = http.post("/v1/embeddings", json={"input": sequences})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    tokens = 0
    for item, content in zip(body["data"], sequences):
        vector, embedded = chunk_by_hand(reference, [bos, *content, eos], OVERLAP)
        assert_close(item["embedding"], vector)
        tokens += embedded
    assert body["usage"]["prompt_tokens"] == tokens


def test_request_fields_beat_the_server_flag(chunking, reference) -> None:
    text = long_text(90, seed=12)
    ids = ids_by_hand(reference, text)
    with chunking.client() as http:
        default = http.post("/embed", json={"inputs": text})
        refused = http.post("/embed", json={"inputs": text, "truncate": False})
        refused_cohere = http.post("/v1/embeddings", json={"input": text, "truncate": "NONE"})
        truncated = http.post("/v1/embeddings", json={"input": text, "truncate": True})
        own_overlap = http.post("/embed", json={"inputs": text, "chunk_overlap": 0})
    assert_close(default.json()[0], chunk_by_hand(reference, ids, OVERLAP)[0])
    assert refused.status_code == refused_cohere.status_code == 413
    assert refused.json()["error"]["code"] == "input_too_long"
    assert_close(truncated.json()["data"][0]["embedding"], reference[0].encode(text))
    assert truncated.json()["usage"]["prompt_tokens"] == MAX_POSITIONS
    assert_close(own_overlap.json()[0], chunk_by_hand(reference, ids, 0)[0])


@pytest.mark.parametrize("route, body, param", [
    ("/v1/embeddings", {"truncate": "sideways"}, "truncate"),
    ("/embed", {"truncate": "CHUNKS"}, "truncate"),
    ("/v1/embeddings", {"truncate": "chunk", "chunk_overlap": -1}, "chunk_overlap"),
    ("/embed", {"truncate": "chunk", "chunk_overlap": ROOM}, "chunk_overlap"),
    ("/v1/embeddings", {"truncate": "START", "truncation_direction": "right"}, "truncation_direction"),
])
def test_bad_long_input_fields_are_400_naming_the_field(refusing, route, body, param) -> None:
    key = "input" if route == "/v1/embeddings" else "inputs"
    with refusing.client() as http:
        reply = http.post(route, json={key: "some text", **body})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (param, "invalid_input", "invalid_request_error")
    assert param in error["message"]


def test_an_overlap_too_large_for_the_model_fails_at_start_up(long_model_dir) -> None:
    with pytest.raises(ValueError, match="--chunk-overlap"):
        create_app(gateway_settings(long_model_dir, ["127.0.0.1:1"], auto_truncate="chunk",
                                    chunk_overlap=ROOM))


def test_embedserve_serve_passes_the_flags_to_its_gateway(long_model_dir, reference) -> None:
    argv = [sys.executable, "-m", "embedserve.cli", "serve", "--port", "0", "--model",
            str(long_model_dir), "--auto-truncate", "chunk", "--chunk-overlap", "5", "--dtype", "float32"]
    process, listening = popen_listening(argv, GATEWAY_LISTENING, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        url = listening.group(1)
        text = long_text(110, seed=13)
        with httpx.Client(base_url=url, timeout=120) as http:
            for _ in range(600):
                if http.get("/ready").status_code == 200:
                    break
                time.sleep(0.1)
            reply = http.post("/v1/embeddings", json={"input": text})
        assert reply.status_code == 200, reply.text
        vector, tokens = chunk_by_hand(reference, ids_by_hand(reference, text), 5)
        assert_close(reply.json()["data"][0]["embedding"], vector)
        assert reply.json()["usage"]["prompt_tokens"] == tokens
    finally:
        assert stop_popen(process, grace_s=30) == 0
