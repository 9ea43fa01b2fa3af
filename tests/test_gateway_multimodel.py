"""Several models behind one gateway: ``embedserve serve --model A --model B``, for real.

One two-model deployment (a tiny random BERT embedder and a tiny random
XLM-R cross-encoder, one replica each, started by the real ``embedserve
serve``) is checked against two one-model deployments of the same
directories (a replica process and a gateway each): the vectors and the
scores must be equal, which they cannot be if a request reached the wrong
model. Then the routing rules (names, aliases, the only model of a kind,
404 ``model_not_found``, an embedder on /rerank), /v1/models, /info,
/ready and the per-model metrics, and SIGTERM stopping every model's
replicas. ``--model DIR:options`` parsing is tested as a table.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from embedserve.cli import main as cli_main
from embedserve.defaults.model_args import ModelSpec, parse_model_spec
from embedserve.entrypoint import GATEWAY_LISTENING
from embedserve.gateway.settings import ServedModel
from gateway_harness import GatewayServer, gateway_settings, metric_value
from process_tree import alive, children

ROOT = Path(__file__).resolve().parent.parent
TEXTS = ["Where is the Eiffel tower?", "Der Eiffelturm steht in Paris.", "x"]
QUERY = "Where is the Eiffel tower?"
DOCS = ["The Eiffel tower is in Paris.", "Bananas are yellow.", "Paris is the capital of France."]


# -- --model DIR[:options] ------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("/models/e5", ModelSpec(Path("/models/e5"))),
    ("", ModelSpec(None)),
    (":name=e5", ModelSpec(None, ("e5",))),
    ("/m/e5:name=e5,e5-alias:replicas=3", ModelSpec(Path("/m/e5"), ("e5", "e5-alias"), 3)),
    # Colons that do not start an option stay in the directory and the addresses.
    ("/m/a:b:upstream=10.0.0.1:50051,10.0.0.2:50051",
     ModelSpec(Path("/m/a:b"), upstream="10.0.0.1:50051,10.0.0.2:50051")),
    ("/m/rr:upstream=dns:reranker:50051:name=rr",
     ModelSpec(Path("/m/rr"), ("rr",), upstream="dns:reranker:50051")),
])
def test_model_specs_parse(text: str, expected: ModelSpec) -> None:
    spec = parse_model_spec(text)
    assert spec == expected
    assert parse_model_spec(spec.format()) == spec


@pytest.mark.parametrize("text, message", [
    ("/m:replicas=0", "at least 1"),
    ("/m:replicas=two", "at least 1"),
    ("/m:name=a:name=b", "given twice"),
    ("/m:name=", "needs a value"),
    ("/m:name=,", "at least one name"),
])
def test_malformed_model_specs_are_refused(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse_model_spec(text)


@pytest.mark.parametrize("args, message", [
    (["--model", "{a}:upstream=127.0.0.1:1", "--model", "{b}"], "give each its replicas"),
    (["--model", "{a}:upstream=127.0.0.1:1:name=x", "--model", "{b}:upstream=127.0.0.1:2:name=x"],
     "two models are served under the name 'x'"),
    (["--model", "{a}:name=x", "--served-model-name", "y", "--upstream", "127.0.0.1:1"],
     "--served-model-name names a single model"),
    (["--model", "{a}:replicas=2", "--upstream", "127.0.0.1:1"], "replicas= is for embedserve serve"),
])
def test_gateway_refuses_ambiguous_model_flags(args: list[str], message: str, tiny_bert_dir: Path,
                                               tiny_reranker_dir: Path, capsys) -> None:
    # In process through the CLI's main(): the flags are refused before anything is started,
    # as one error line and exit status 2 (docs/cli.md).
    argv = [arg.format(a=tiny_bert_dir, b=tiny_reranker_dir) for arg in args]
    assert cli_main(["gateway", "--port", "0", *argv]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("embedserve: error: ") and "\n" not in line and message in line


def test_the_gateway_process_exits_nonzero_saying_why(tiny_bert_dir: Path, tiny_reranker_dir: Path) -> None:
    # One of the refusals above as a real process: a non-zero exit and the reason on stderr.
    result = subprocess.run([sys.executable, "-m", "embedserve.cli", "gateway", "--port", "0",
                             "--model", f"{tiny_bert_dir}:upstream=127.0.0.1:1", "--model", str(tiny_reranker_dir)],
                            capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=120)
    assert result.returncode != 0 and "give each its replicas" in result.stderr, result.stderr


# -- the two-model deployment and its one-model references ----------------------

def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")


class ServeProcess:
    """``embedserve serve ARGS`` on port 0, and its URL."""

    def __init__(self, *args: str) -> None:
        # float32: replies are compared with float32 references (serve's default is auto).
        self.popen = subprocess.Popen([sys.executable, "-m", "embedserve.cli", "serve", "--port", "0",
                                       "--dtype", "float32", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=_env(), cwd=ROOT)
        self.lines: list[str] = []
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line)
            if match := GATEWAY_LISTENING.search(line):
                self.url = match.group(1)
                break
        else:
            raise RuntimeError("serve exited before listening:\n" + "".join(self.lines[-40:]))
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.append(line)

    def wait_ready(self, timeout_s: float = 120.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            reply = httpx.get(self.url + "/ready", timeout=10)
            if reply.status_code == 200:
                return reply.json()
            time.sleep(0.1)
        raise TimeoutError("the deployment never became ready:\n" + "".join(self.lines[-40:]))

    def kill(self) -> None:
        if self.popen.poll() is None:
            for pid in children(self.popen.pid):
                os.kill(pid, signal.SIGKILL)
            self.popen.kill()
            self.popen.wait(10)


@pytest.fixture(scope="module")
def two_models(tiny_bert_dir: Path, tiny_reranker_dir: Path):
    serve = ServeProcess("--replicas", "1",
                         "--model", f"{tiny_bert_dir}:name=tiny-embed,embed-alias",
                         "--model", f"{tiny_reranker_dir}:name=tiny-rerank")
    try:
        serve.wait_ready()
        yield serve
    finally:
        serve.kill()


@pytest.fixture(scope="module")
def one_model_replicas(tiny_bert_replica, tiny_reranker_replica):
    """One replica per model (the session's shared ones: these tests only send requests)."""
    return tiny_bert_replica, tiny_reranker_replica


@pytest.fixture(scope="module")
def one_model_deployments(one_model_replicas, tiny_bert_dir: Path, tiny_reranker_dir: Path):
    embedder, reranker = one_model_replicas
    servers = [GatewayServer(gateway_settings(tiny_bert_dir, [embedder.address])),
               GatewayServer(gateway_settings(tiny_reranker_dir, [reranker.address]))]
    try:
        for server in servers:
            server.wait_ready()
        yield servers
    finally:
        for server in servers:
            server.stop()


def _openai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def _vectors(client: openai.OpenAI, model: str) -> tuple[np.ndarray, str]:
    reply = client.embeddings.create(input=TEXTS, model=model)
    return np.array([d.embedding for d in reply.data]), reply.model


def test_embeddings_go_to_the_embedder(two_models, one_model_deployments, tiny_bert_dir) -> None:
    expected, _ = _vectors(_openai(one_model_deployments[0].url), tiny_bert_dir.name)
    client = _openai(two_models.url)
    for model in ("tiny-embed", "embed-alias"):
        vectors, name = _vectors(client, model)
        assert name == model
        np.testing.assert_array_equal(vectors, expected)
    with httpx.Client(base_url=two_models.url, timeout=60) as http:
        unnamed = http.post("/v1/embeddings", json={"input": TEXTS}).json()   # the only embedder
        tei = http.post("/embed", json={"inputs": TEXTS}).json()
        tei_named = http.post("/embed", json={"inputs": TEXTS, "model": "tiny-embed"}).json()
    assert unnamed["model"] == "tiny-embed"
    np.testing.assert_array_equal(np.array([d["embedding"] for d in unnamed["data"]]), expected)
    np.testing.assert_array_equal(np.array(tei), expected)
    np.testing.assert_array_equal(np.array(tei_named), expected)
    assert expected.shape == (len(TEXTS), 32)


def test_rerank_goes_to_the_cross_encoder(two_models, one_model_deployments) -> None:
    reference = one_model_deployments[1]
    with httpx.Client(base_url=reference.url, timeout=60) as http:
        expected_tei = http.post("/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True}).json()
        expected_cohere = http.post("/v1/rerank", json={"query": QUERY, "documents": DOCS}).json()
    with httpx.Client(base_url=two_models.url, timeout=60) as http:
        for model in ("tiny-rerank", None):   # None: the only reranker
            body = {"query": QUERY, "texts": DOCS, "raw_scores": True}
            tei = http.post("/rerank", json=body if model is None else {**body, "model": model})
            assert tei.status_code == 200, tei.text
            assert tei.json() == expected_tei
            cohere = http.post("/v1/rerank", json={"query": QUERY, "documents": DOCS,
                                                   **({"model": model} if model else {})})
            assert cohere.status_code == 200, cohere.text
            assert cohere.json()["results"] == expected_cohere["results"]
            assert cohere.json()["model"] == "tiny-rerank"
    # The scores are the cross-encoder's own (not constant, not an embedder's).
    assert len({round(r["score"], 6) for r in expected_tei}) == len(DOCS)


def test_models_lists_every_name(two_models) -> None:
    models = _openai(two_models.url).models.list()
    assert [m.id for m in models.data] == ["tiny-embed", "embed-alias", "tiny-rerank"]
    assert {m.object for m in models.data} == {"model"}


def test_unknown_model_is_openai_404(two_models) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        _openai(two_models.url).embeddings.create(input="x", model="no-such-model")
    assert raised.value.status_code == 404
    assert raised.value.body["code"] == "model_not_found" and raised.value.body["param"] == "model"
    with httpx.Client(base_url=two_models.url, timeout=60) as http:
        for path, body in [("/v1/rerank", {"query": "q", "documents": ["d"]}),
                           ("/rerank", {"query": "q", "texts": ["d"]}),
                           ("/embed", {"inputs": "x"})]:
            reply = http.post(path, json={**body, "model": "no-such-model"})
            assert reply.status_code == 404, (path, reply.text)
            error = reply.json()["error"]
            assert error["code"] == "model_not_found" and error["type"] == "invalid_request_error"
            assert "no-such-model" in error["message"]
        assert http.get("/info", params={"model": "no-such-model"}).status_code == 404


def test_a_model_on_a_route_it_cannot_serve_is_400(two_models) -> None:
    with httpx.Client(base_url=two_models.url, timeout=60) as http:
        rerank = http.post("/v1/rerank", json={"query": "q", "documents": ["d"], "model": "embed-alias"})
        tei_rerank = http.post("/rerank", json={"query": "q", "texts": ["d"], "model": "tiny-embed"})
        embed = http.post("/v1/embeddings", json={"input": "x", "model": "tiny-rerank"})
        tokenize = http.post("/tokenize", json={"inputs": "x"})
        tokenize_named = http.post("/tokenize", json={"inputs": "x", "model": "tiny-rerank"})
    for reply in (rerank, tei_rerank):
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == "model"
        assert "cannot rerank" in reply.json()["error"]["message"]
    assert embed.status_code == 400 and "cannot embed" in embed.json()["error"]["message"]
    # /tokenize suits either model: without a name it cannot choose.
    assert tokenize.status_code == 400 and "name one in `model`" in tokenize.json()["error"]["message"]
    assert tokenize_named.status_code == 200 and tokenize_named.json()[0][0]["special"]


def test_info_and_ready_per_model(two_models, tiny_bert_dir) -> None:
    with httpx.Client(base_url=two_models.url, timeout=60) as http:
        ready = http.get("/ready").json()
        every = http.get("/info").json()
        reranker = http.get("/info", params={"model": "tiny-rerank"}).json()
        by_alias = http.get("/info", params={"model": "embed-alias"}).json()
    assert ready["models"] == {"tiny-embed": 1, "tiny-rerank": 1} and ready["replicas_healthy"] == 2
    assert [m["model_id"] for m in every["models"]] == ["tiny-embed", "tiny-rerank"]
    assert [m["model_type"] for m in every["models"]] == ["embedding", "reranker"]
    assert sorted(r["model"] for r in every["replicas"]) == ["tiny-embed", "tiny-rerank"]
    assert reranker["model_type"] == "reranker" and reranker["dimension"] == 0
    assert reranker["served_model_names"] == ["tiny-rerank"]
    assert by_alias["model_id"] == "tiny-embed" and by_alias["dimension"] == 32
    assert by_alias["served_model_names"] == ["tiny-embed", "embed-alias"]
    assert by_alias["prompts"] == {"query": "query: ", "passage": "passage: "}


def test_metrics_are_labelled_by_model(two_models) -> None:
    def scrape() -> str:
        return httpx.get(two_models.url + "/metrics", timeout=10).text

    def inputs(text: str, route: str, model: str) -> float:
        return metric_value(text, "embedserve_gateway_inputs_total", route=route, model=model)

    before = scrape()
    with httpx.Client(base_url=two_models.url, timeout=60) as http:
        assert http.post("/v1/embeddings", json={"input": TEXTS, "model": "embed-alias"}).status_code == 200
        assert http.post("/v1/rerank", json={"query": QUERY, "documents": DOCS}).status_code == 200
    after = scrape()
    # Counted under each model's canonical name, whichever name the request used.
    assert inputs(after, "/v1/embeddings", "tiny-embed") - inputs(before, "/v1/embeddings", "tiny-embed") == len(TEXTS)
    assert inputs(after, "/v1/rerank", "tiny-rerank") - inputs(before, "/v1/rerank", "tiny-rerank") == len(DOCS)
    assert inputs(after, "/v1/embeddings", "tiny-rerank") == 0
    assert inputs(after, "/v1/rerank", "tiny-embed") == 0
    for model in ("tiny-embed", "tiny-rerank"):
        assert metric_value(after, "embedserve_gateway_replicas_healthy", model=model) == 1
        assert metric_value(after, "embedserve_gateway_replicas", model=model) == 1
        assert metric_value(after, "embedserve_gateway_tokens_total", model=model) > 0


def test_sigterm_stops_every_models_replicas(two_models, tiny_bert_dir, tiny_reranker_dir) -> None:
    replicas = children(two_models.popen.pid)
    served = sorted(Path(f"/proc/{pid}/cmdline").read_text().split("\0")[
        Path(f"/proc/{pid}/cmdline").read_text().split("\0").index("--model") + 1] for pid in replicas)
    assert served == sorted([str(tiny_bert_dir), str(tiny_reranker_dir)])
    two_models.popen.send_signal(signal.SIGTERM)
    assert two_models.popen.wait(90) == 0, "".join(two_models.lines[-40:])
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in replicas) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in replicas)


# -- one gateway, replicas wired per model (in process) ---------------------------

def test_ready_waits_for_every_model_and_refuses_a_replica_of_another_model(
        one_model_replicas, tiny_bert_dir, tiny_reranker_dir, tiny_xlmr_dir) -> None:
    embedder, reranker = one_model_replicas
    closed = f"127.0.0.1:{_closed_port()}"
    # The reranker's replicas are down; a third model is wired to the reranker's replica.
    settings = gateway_settings(tiny_bert_dir, [embedder.address], served_model_names=("embed",),
                                additional_models=(ServedModel(tiny_reranker_dir, (closed,), ("rerank",)),
                                                   ServedModel(tiny_xlmr_dir, (reranker.address,), ("xlmr",))))
    server = GatewayServer(settings)
    try:
        server.wait_ready()
        with server.client() as http:
            deadline = time.monotonic() + 30
            while http.get("/info").json()["models"][0]["replicas"][0]["healthy"] is False \
                    and time.monotonic() < deadline:
                time.sleep(0.05)
            ready = http.get("/ready")
            assert ready.status_code == 503
            assert "rerank" in ready.json()["error"]["message"] and "xlmr" in ready.json()["error"]["message"]
            assert "embed," not in ready.json()["error"]["message"]
            # The model with a replica serves; the others answer 503, never another model's output.
            assert http.post("/v1/embeddings", json={"input": "x", "model": "embed"}).status_code == 200
            assert http.post("/v1/rerank", json={"query": "q", "documents": ["d"]}).status_code == 503
            # Until its health watch has read the replica's Info, it is merely "not ready".
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                wrong = http.post("/v1/embeddings", json={"input": "x", "model": "xlmr"})
                assert wrong.status_code == 503, wrong.text
                if "another model" in wrong.json()["error"]["message"]:
                    break
                time.sleep(0.05)
            assert "serve another model" in wrong.json()["error"]["message"]
            # Two embedders and no name: the gateway asks for one.
            ambiguous = http.post("/v1/embeddings", json={"input": "x"})
            assert ambiguous.status_code == 400
            assert "`embed`" in ambiguous.json()["error"]["message"]
            assert "`xlmr`" in ambiguous.json()["error"]["message"]
            replicas = {r["model"]: r["healthy"] for r in http.get("/info").json()["replicas"]}
            assert replicas == {"embed": True, "rerank": False, "xlmr": False}
    finally:
        server.stop()


def test_two_models_under_one_name_fail_at_start(tiny_bert_dir, tiny_reranker_dir) -> None:
    from embedserve.gateway.app import create_app

    settings = gateway_settings(tiny_bert_dir, ["127.0.0.1:1"], served_model_names=("m", "shared"),
                                additional_models=(ServedModel(tiny_reranker_dir, ("127.0.0.1:2",),
                                                               ("shared",)),))
    with pytest.raises(ValueError, match="'shared'"):
        create_app(settings)


def _closed_port() -> int:
    from embedserve.launch.processes import free_port

    return free_port()
