"""The gateway app factory: ``create_app(settings) -> FastAPI``.

Wires the pieces built elsewhere: reads the model directory (tokenizer,
prompts), starts the replica pool and its health watches in the app's
lifespan, installs the middleware (``app.state.drain`` is the shutdown
gate the entry point closes) and the error handlers once, and mounts the
routers. Nothing here handles a request itself.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from embedserve import __version__
from embedserve.gateway.routes import embed, ops, rerank, tokenize
from embedserve.gateway.draining import Drain, DrainMiddleware
from embedserve.gateway.http_errors import ERROR_RESPONSES, install_error_handlers
from embedserve.gateway.metrics import GatewayMetrics
from embedserve.gateway.middleware import GatewayMiddleware
from embedserve.gateway.preprocess import Preprocessor
from embedserve.gateway.discovery import source_for
from embedserve.gateway.replicas import ReplicaPool, ReplicaSource
from embedserve.gateway.pipeline import Gateway
from embedserve.gateway.settings import GatewaySettings
from embedserve.model.info import read_model_info
from embedserve.tokenizer import load_tokenizer

log = logging.getLogger(__name__)


def create_app(settings: GatewaySettings, source: ReplicaSource | None = None) -> FastAPI:
    """An app serving ``settings.model_dir`` over the replicas of ``source``.

    ``source`` defaults to what ``settings.upstreams`` names: fixed
    ``host:port`` entries, or ``dns:NAME:PORT`` (``discovery.py``). The
    tokenizer loads here, so a bad model directory fails at start-up
    (``ModelLoadError``), not on a request.
    """
    model = read_model_info(settings.model_dir)
    tokenizer = load_tokenizer(settings.model_dir)
    executor = ThreadPoolExecutor(settings.tokenizer_threads, thread_name_prefix="tokenize")
    preprocessor = Preprocessor(tokenizer, model, executor)
    metrics = GatewayMetrics()
    replica_source = source or source_for(settings.upstreams)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = ReplicaPool(replica_source, settings.replica_max_outstanding_tokens,
                           settings.health_backoff_min_s, settings.health_backoff_max_s,
                           settings.replica_ping_s, replica_token=settings.replica_token)
        app.state.gateway = Gateway(settings, model, preprocessor, pool, metrics)
        await pool.start()
        try:
            yield
        finally:
            await pool.close()
            executor.shutdown(wait=False, cancel_futures=True)

    # /docs and /redoc serve their scripts from the fastapi-offline package, not a
    # CDN, so they work on a machine without internet access.
    app = FastAPIOffline(title="embedserve gateway", version=__version__, lifespan=lifespan,
                  description="OpenAI- and TEI-compatible embedding and reranking API.")
    # Added first, so it runs inside GatewayMiddleware: its 503s carry request ids and are counted.
    drain = Drain(metrics.registry, settings.retry_after_s)
    app.state.drain = drain
    app.add_middleware(DrainMiddleware, drain=drain)
    app.add_middleware(GatewayMiddleware, metrics=metrics, max_body_bytes=settings.max_body_bytes,
                       api_key=settings.api_key)
    install_error_handlers(app)
    for module in (embed, rerank, tokenize, ops):
        app.include_router(module.router, responses=ERROR_RESPONSES)
    return app
