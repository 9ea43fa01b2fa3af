"""``embedserve embed --url``: the same job through a real ``embedserve serve``.

The gateway and its replica run the default model as real processes; the
vectors that come back over HTTP equal the in-process run's (cosine >=
0.99999: the gateway packs its own batches), row for row with the same ids,
token counts and errors.
"""

from __future__ import annotations

import time

import httpx
import pytest
from fastapi import Request, Response  # module level: the proxy's handlers' annotations name them

from bulk_corpus import documents, write_jsonl
from serve_harness import served
from test_bulk_embed import cosines, embed, read_output


@pytest.fixture(scope="module")
def gateway_url(default_model_dir):
    with served("--model", str(default_model_dir)) as url:
        yield url


def test_url_gives_the_in_process_vectors(tmp_path, default_model_dir, gateway_url):
    texts = documents(150)
    texts[7] = ""  # a bad row is skipped the same way
    texts[20] = " ".join(documents(60))  # too long for the model: refused the same way
    source = write_jsonl(tmp_path / "in.jsonl", texts)
    common = ("--model", default_model_dir, "--part-size", 64, "--input-type", "passage")
    assert embed(source, "-o", tmp_path / "local.parquet", *common) == 0
    assert embed(source, "-o", tmp_path / "remote.parquet", "--url", gateway_url, *common) == 0
    local_ids, local, local_table = read_output(tmp_path / "local.parquet")
    remote_ids, remote, remote_table = read_output(tmp_path / "remote.parquet")
    assert remote_ids == local_ids == [i for i in range(150) if i not in (7, 20)]
    assert cosines(local, remote).min() >= 0.99999
    assert remote_table.column("tokens").equals(local_table.column("tokens"))
    assert (tmp_path / "remote.parquet.errors.jsonl").read_text() == \
        (tmp_path / "local.parquet.errors.jsonl").read_text()


def test_url_without_a_model_here_counts_tokens_on_the_gateway(tmp_path, default_model_dir, gateway_url,
                                                               monkeypatch):
    # No --model and an empty model cache: nothing is built or read here; /tokenize gives
    # the ids, and the output (tokens, truncation, chunking, errors) is the local run's.
    monkeypatch.setenv("EMBEDSERVE_CACHE_DIR", str(tmp_path / "no-models-here"))
    texts = documents(40)
    texts[3] = ""
    texts[9] = " ".join(documents(60))           # too long: refused, then cut, then chunked
    source = write_jsonl(tmp_path / "in.jsonl", texts)
    for policy in ("refuse", "truncate", "chunk"):
        common = ("--part-size", 16, "--input-type", "query", "--long-inputs", policy)
        assert embed(source, "-o", tmp_path / f"local-{policy}.parquet", "--model", default_model_dir,
                     *common) == 0
        assert embed(source, "-o", tmp_path / f"remote-{policy}.parquet", "--url", gateway_url, *common) == 0
        local_ids, local, local_table = read_output(tmp_path / f"local-{policy}.parquet")
        remote_ids, remote, remote_table = read_output(tmp_path / f"remote-{policy}.parquet")
        assert remote_ids == local_ids
        assert cosines(local, remote).min() >= 0.99999
        for column in ("tokens", "truncated", "chunked"):
            assert remote_table.column(column).equals(local_table.column(column)), (policy, column)
        assert (tmp_path / f"remote-{policy}.parquet.errors.jsonl").read_text() == \
            (tmp_path / f"local-{policy}.parquet.errors.jsonl").read_text()
    assert not (tmp_path / "no-models-here").exists()


def test_url_with_another_local_model_is_refused(tmp_path, tiny_bert_dir, gateway_url, capsys):
    source = write_jsonl(tmp_path / "in.jsonl", documents(3))
    assert embed(source, "-o", tmp_path / "x.parquet", "--url", gateway_url, "--model", tiny_bert_dir) == 2
    assert "pass the served model as --model" in capsys.readouterr().err


class RefusingProxy:
    """A real HTTP server in front of the gateway that answers the first ``refusals`` embedding
    requests with 429 / 503 and ``Retry-After: 0``, then forwards everything."""

    def __init__(self, upstream: str, refusals: int) -> None:
        import threading

        import uvicorn
        from fastapi import FastAPI

        from embedserve.gateway.cli import listening_socket

        self.refused = 0
        self.forwarded = 0
        app = FastAPI()

        @app.get("/info")
        async def info() -> Response:
            async with httpx.AsyncClient() as client:
                reply = await client.get(upstream + "/info")
            return Response(reply.content, media_type="application/json")

        @app.post("/v1/embeddings")
        async def embeddings(request: Request) -> Response:
            if self.refused < refusals:
                self.refused += 1
                status = 429 if self.refused % 2 else 503
                return Response('{"error": {"message": "busy"}}', status_code=status,
                                headers={"Retry-After": "0"}, media_type="application/json")
            self.forwarded += 1
            async with httpx.AsyncClient(timeout=120) as client:
                reply = await client.post(upstream + "/v1/embeddings", content=await request.body(),
                                          headers={"content-type": "application/json"})
            return Response(reply.content, status_code=reply.status_code, media_type="application/json")

        sock = listening_socket("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join()


def test_url_retries_429_and_503_after_retry_after(tmp_path, default_model_dir, gateway_url):
    texts = documents(10)
    source = write_jsonl(tmp_path / "in.jsonl", texts)
    proxy = RefusingProxy(gateway_url, refusals=3)
    try:
        assert embed(source, "-o", tmp_path / "retried.parquet", "--url", proxy.url,
                     "--model", default_model_dir) == 0
    finally:
        proxy.stop()
    assert proxy.refused == 3 and proxy.forwarded == 1
    assert embed(source, "-o", tmp_path / "local.parquet", "--model", default_model_dir) == 0
    ids, retried, _ = read_output(tmp_path / "retried.parquet")
    assert ids == list(range(10))
    assert cosines(retried, read_output(tmp_path / "local.parquet")[1]).min() >= 0.99999
