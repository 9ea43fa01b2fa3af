"""``/ready`` is honest: the first request of every route, sent the moment it says ready,
is answered without a tokenizer kernel compiled or loaded on its way.

A real ``embedserve serve`` of an embedder and a reranker (tiny random models with the
XLM-R tokenizer.json) is polled for ``/ready``; at the first 200 a single text, several
texts, a long text cut into windows (``truncate: "chunk"``), a truncated text, a rerank
and a tokenize go at once. What makes a compile after ready observable is the gateway's
``embedserve_gateway_tokenizer_kernel_first_calls_total{when="serving"}``: every
kernel first call (a compile, or a load from Numba's disk cache) outside the
tokenizer's warm-up; it must be 0 after those requests. Whichever tokenizer serves
(native from a warm cache, or the ``tokenizers`` library while the native kernels
compile on a cold one: gateway/startup.py), the tokenize route's ids are the
``tokenizers`` library's.

The switch itself (library first, native after, ids the same across it) is tested
in-process on the same tokenizer.json, and that ``warm_up`` leaves no kernel for a
request to load is tested in a fresh interpreter (where nothing is loaded yet).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import tokenizers

from embedserve.entrypoint import GATEWAY_LISTENING
from embedserve.gateway.preprocess import Preprocessor
from embedserve.gateway.startup import NativeSwitch
from embedserve.launch.processes import popen_listening, stop_popen
from embedserve.model.info import read_model_info
from embedserve.tokenizer import HfTokenizer

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["Hello, world! A first text.", "Привет, мир", "日本語のテキスト", "naïve café"]
LONG = "a rather long sentence that the window cuts " * 80   # > 514 tokens: several windows
# A request that met a kernel compile waits tens of seconds on this machine class (20-45 s
# per kernel signature, docs/startup.md); one that met none is answered in milliseconds.
# 5 s tells the two apart even on a loaded machine; the counter below is the exact check.
NO_COMPILE_S = 5.0
_SERVING_FIRST_CALLS = re.compile(
    r'^embedserve_gateway_tokenizer_kernel_first_calls_total\{when="serving"\} (\S+)$', re.MULTILINE)


def serving_first_calls(url: str) -> float:
    """Tokenizer kernel first calls the gateway made outside a warm-up."""
    found = _SERVING_FIRST_CALLS.search(httpx.get(url + "/metrics", timeout=10).text)
    assert found, "the gateway exposes no kernel first-call counter"
    return float(found.group(1))


def reference_ids(tokenizer_json: Path, texts: list[str]) -> list[list[int]]:
    reference = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    reference.no_truncation()
    reference.no_padding()
    return [e.ids for e in reference.encode_batch(texts)]


def test_every_route_is_answered_without_a_compile_the_moment_ready_says_so(tiny_xlmr_dir: Path,
                                                                           tiny_reranker_dir: Path):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    argv = [sys.executable, "-m", "embedserve.cli", "serve", "--port", "0", "--replicas", "1",
            "--dtype", "float32", "--model", f"{tiny_xlmr_dir}:name=embedder",
            "--model", f"{tiny_reranker_dir}:name=reranker"]
    process, match = popen_listening(argv, GATEWAY_LISTENING, env=env, cwd=str(ROOT))
    try:
        url = match.group(1)
        deadline = time.monotonic() + 300
        with httpx.Client(base_url=url, timeout=NO_COMPILE_S) as http:
            while http.get("/ready").status_code != 200:
                assert time.monotonic() < deadline, "never ready"
                time.sleep(0.02)
            assert serving_first_calls(url) == 0
            first = {
                "single": http.post("/v1/embeddings", json={"model": "embedder", "input": TEXTS[0]}),
                "several": http.post("/v1/embeddings", json={"model": "embedder", "input": TEXTS}),
                "windows": http.post("/v1/embeddings", json={"model": "embedder", "input": [LONG],
                                                             "truncate": "chunk"}),
                "truncated": http.post("/embed", json={"model": "embedder", "inputs": [LONG],
                                                       "truncate": True}),
                "rerank": http.post("/rerank", json={"model": "reranker", "query": TEXTS[0],
                                                     "texts": TEXTS[1:]}),
                "tokenize": http.post("/tokenize", json={"model": "embedder", "inputs": TEXTS}),
            }
            assert {route: reply.status_code for route, reply in first.items()} == dict.fromkeys(first, 200)
            assert len(first["several"].json()["data"]) == len(TEXTS)
            assert len(first["rerank"].json()) == len(TEXTS) - 1
            served_ids = [[token["id"] for token in tokens] for tokens in first["tokenize"].json()]
            assert served_ids == reference_ids(tiny_xlmr_dir / "tokenizer.json", TEXTS)
            assert serving_first_calls(url) == 0
            backends = {m["model_id"]: m["tokenizer_backend"] for m in http.get("/info").json()["models"]}
            assert set(backends.values()) <= {"native-unigram", "tokenizers"}, backends
    finally:
        assert stop_popen(process, 60.0) == 0


class FirstCalls:
    """Kernel first calls seen in this process while a block runs."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, call: dict) -> None:
        self.calls.append(dict(call))


def test_the_library_serves_until_the_native_tokenizer_is_compiled_with_the_same_ids(
        tiny_xlmr_dir: Path):
    from embedserve.tokenizer.kernel_cache import on_first_call

    tokenizer_json = tiny_xlmr_dir / "tokenizer.json"
    info = read_model_info(tiny_xlmr_dir)
    library = HfTokenizer.from_file(tokenizer_json)
    with ThreadPoolExecutor(1) as executor:
        preprocessor = Preprocessor(library, info, executor)

        async def encode() -> tuple[list[list[int]], list[list[int]]]:
            texts = await preprocessor.encode_texts(TEXTS, "", False, "right", "input")
            pairs = await preprocessor.pack_pairs(TEXTS[0], TEXTS[1:], False, "right", "texts")
            return ([texts.sequence(i).tolist() for i in range(len(TEXTS))],
                    [pairs.sequence(i).tolist() for i in range(len(TEXTS) - 1)])

        before = asyncio.run(encode())
        seen = FirstCalls()
        with on_first_call(seen):
            asyncio.run(NativeSwitch(tiny_xlmr_dir, preprocessor).run())  # compiles in a child if needed
            assert preprocessor.tokenizer.backend == "native-unigram"
            after = asyncio.run(encode())
        assert all(call["warm_up"] for call in seen.calls), seen.calls
    reference = reference_ids(tokenizer_json, TEXTS)
    pair_reference = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    pair_reference.no_truncation()
    pairs = [e.ids for e in pair_reference.encode_batch([(TEXTS[0], t) for t in TEXTS[1:]])]
    assert before == after == (reference, pairs)


# Run in a fresh interpreter: load_warm, then every route's calls with other texts and
# lengths, counting kernel first calls outside the warm-up (none may happen).
_AFTER_WARM_UP = """
import json, sys
from pathlib import Path
from embedserve.tokenizer.kernel_cache import on_first_call
from embedserve.tokenizer.warm import load_warm
calls = []
with on_first_call(calls.append):
    tokenizer = load_warm(Path(sys.argv[1]), compile=True, max_length=514)
    warm = len(calls)
    texts = ["Other words " * 9, "ещё текст", "x"]
    tokenizer.encode_batch(texts[:1])
    tokenizer.encode_batch(texts)
    tokenizer.encode_batch(texts, max_length=7, truncation="left", return_offsets=True)
    tokenizer.encode_batch(["long " * 400], max_length=514, truncation="right")
    tokenizer.encode_pairs(texts[0], texts[1:], max_length=9, truncation="right")
    tokenizer.encode_pairs(texts[0], texts[1:2])
    tokenizer.encode_batch(["y" * 40000, "z" * 40000])
print(json.dumps({"warm_up": sum(c["warm_up"] for c in calls[:warm]), "warm": warm,
                  "after": [c["kernel"] for c in calls[warm:]], "backend": tokenizer.backend}))
"""


def test_warm_up_leaves_no_kernel_for_a_request_to_load(default_model_dir: Path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", _AFTER_WARM_UP, str(default_model_dir)], env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["backend"] == "native-unigram"
    assert report["warm"] > 0 and report["warm_up"] == report["warm"]   # it did load kernels, all tagged
    assert report["after"] == []

