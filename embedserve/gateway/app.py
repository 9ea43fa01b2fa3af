"""The gateway app factory: ``create_app(settings) -> FastAPI``.

Wires the pieces built elsewhere: reads each served model's directory
(tokenizer, prompts; a directory served twice is read once; startup.py warms the
tokenizer, and swaps in the native one later where the library serves first), gives each
model its own replica pool (started with its health watches in the app's
lifespan), token budget and names, and puts them behind one
``ModelRouter`` (``app.state.router``); installs the middleware
(``app.state.drain`` is the shutdown gate the entry point closes) and the
error handlers once, and mounts the routers. Nothing here handles a request itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from starlette.types import ASGIApp, Receive, Scope, Send

from embedserve import __version__
from embedserve.gateway.direct_routes import DirectRoutes, direct_routes
from embedserve.gateway.discovery import source_for
from embedserve.gateway.draining import Drain, DrainMiddleware
from embedserve.gateway.http_errors import ERROR_RESPONSES, install_error_handlers
from embedserve.gateway.metrics import GatewayMetrics
from embedserve.gateway.middleware import GatewayMiddleware
from embedserve.gateway.pipeline import Gateway
from embedserve.gateway.preprocess import Preprocessor
from embedserve.gateway.replicas import ReplicaPool, ReplicaSource
from embedserve.gateway.routes import classify, cohere, embed, multivector, ops, rerank, sparse, tei, tokenize
from embedserve.gateway.routing import ModelRouter
from embedserve.gateway.settings import GatewaySettings, ServedModel, check_distinct_names
from embedserve.gateway.startup import NativeSwitch, PreparedModel, prepare_models
from embedserve.link import wire
from embedserve.model.info import ModelInfo
from embedserve.tokenizer.kernel_cache import on_first_call
from embedserve.tracing import start_tracer

if TYPE_CHECKING:
    from embedserve.otel import Tracer

log = logging.getLogger(__name__)


class GatewayApp(FastAPI):
    """The FastAPI app, entered through the gateway's own ASGI layers (``wrap``).

    FastAPI runs its own outer layers (a telemetry check, Starlette's error middleware,
    FastAPI's exception-telemetry and body-limit middlewares) around any middleware
    added to it, so every request would pass them before the direct routes. Here the
    gateway middleware, the drain and the direct routes come first and FastAPI's whole
    stack after them: a direct route skips FastAPI's layers (40-180 µs of a short
    query's overhead in A/Bs; BENCHMARKS.md, gateway overhead), every other request
    goes through both as before.
    """

    def wrap(self, layers: Callable[[ASGIApp], ASGIApp]) -> None:
        """Enter the app through ``layers(FastAPI's own entry)`` from now on."""
        self._entry = layers(super().__call__)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = self   # as Starlette sets it: a direct route's Request reads app.state
        await self._entry(scope, receive, send)


def create_app(settings: GatewaySettings, source: ReplicaSource | None = None,
               prepared: dict[Path, PreparedModel] | None = None,
               tracer: Tracer | None = None) -> FastAPI:
    """An app serving ``settings.models``, each over its own replicas.

    ``source`` (tests) replaces the first model's replicas; otherwise each
    model's come from its ``upstreams``: fixed ``host:port`` entries, or
    ``dns:NAME:PORT`` (``discovery.py``). Tokenizers load and warm up here
    (those not in ``prepared``: ``startup.prepare_models``' answer, by resolved
    directory), so a bad model directory fails at start-up (``ModelLoadError``),
    not on a request; so do two models answering to one name (``ValueError``).
    ``tracer`` (tests): where its spans go; default: as ``settings.tracing`` says
    (docs/tracing.md), shut down (flushed) with the app.
    """
    # One thread for every model's tokenizer: the Numba encoder already runs
    # in parallel inside a call, and its threading layer must not be entered
    # from two threads at once (settings.tokenizer_threads).
    executor = ThreadPoolExecutor(settings.tokenizer_threads, thread_name_prefix="tokenize")
    metrics = GatewayMetrics()
    owns_tracer = tracer is None
    if tracer is None:
        tracer = start_tracer(settings.tracing)
    # Tokenizers warmed: no request waits for a tokenizer kernel (gateway/startup.py).
    prepared = dict(prepared or {})
    prepared.update(prepare_models(served.model_dir for served in settings.models
                                   if served.model_dir.resolve() not in prepared))
    read: dict[Path, tuple[ModelInfo, Preprocessor]] = {}
    switches: list[NativeSwitch] = []
    for served in settings.models:
        key = served.model_dir.resolve()
        if key not in read:
            model, tokenizer, switch_later = prepared[key]
            preprocessor = Preprocessor(tokenizer, model, executor, settings.auto_truncate,
                                        settings.chunk_overlap)
            read[key] = model, preprocessor
            if switch_later:
                switches.append(NativeSwitch(served.model_dir, preprocessor))
    sources = [source if i == 0 and source is not None else source_for(served.upstreams)
               for i, served in enumerate(settings.models)]
    check_distinct_names([served.names for served in settings.models])

    def gateway_for(served: ServedModel, replica_source: ReplicaSource) -> Gateway:
        model, preprocessor = read[served.model_dir.resolve()]
        pool = ReplicaPool(replica_source, settings.replica_max_outstanding_tokens,
                           settings.health_backoff_min_s, settings.health_backoff_max_s,
                           settings.replica_ping_s, replica_token=settings.replica_token,
                           frame_calls=settings.replica_calls == "frames",
                           check_info=lambda reply: wire.model_mismatch(reply, model))
        return Gateway(settings, model, preprocessor, pool, metrics, served.names)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        router = ModelRouter([gateway_for(served, replica_source)
                              for served, replica_source in zip(settings.models, sources)])
        app.state.router = router
        for gateway in router.gateways:
            await gateway.pool.start()
        switching = [asyncio.create_task(switch.run()) for switch in switches]
        try:
            with on_first_call(metrics.count_kernel_first_call):
                yield
        finally:
            for task in switching:
                task.cancel()
            await asyncio.gather(*switching, return_exceptions=True)
            for gateway in router.gateways:
                await gateway.pool.close()
            executor.shutdown(wait=False, cancel_futures=True)
            if tracer is not None and owns_tracer:
                await asyncio.to_thread(tracer.shutdown)   # sends the spans still batched

    # /docs and /redoc serve their scripts from the fastapi-offline package, not a
    # CDN, so they work on a machine without internet access.
    app = FastAPIOffline(title="embedserve gateway", version=__version__, lifespan=lifespan,
                         description="OpenAI- and TEI-compatible embedding and reranking API.")
    # fastapi-offline builds a plain FastAPI; the gateway's own entry (GatewayApp) is a
    # subclass that adds only methods, so the object itself can take it.
    app.__class__ = GatewayApp
    install_error_handlers(app)
    routers = [module.router for module in (embed, rerank, tokenize, ops, classify, sparse, multivector)]
    for router in routers:
        app.include_router(router, responses=ERROR_RESPONSES)
    # TEI's / and /similarity, Cohere's v2: their errors in their own shapes (their routers declare them).
    routers += [tei.router, cohere.router]
    app.include_router(tei.router)
    app.include_router(cohere.router)
    drain = Drain(metrics.registry, settings.retry_after_s)
    app.state.drain = drain
    app.state.metrics = metrics   # the gRPC API (grpc_server.py) counts into the same metrics
    app.state.tracer = tracer     # and traces its calls with the same tracer (None: off)
    routes = direct_routes(r for router in routers for r in router.routes)
    # The direct routes inside the drain (admitted like any request), both inside
    # GatewayMiddleware (their answers, the drain's 503s included, carry request ids
    # and are counted), FastAPI's stack innermost.
    app.wrap(lambda fastapi: GatewayMiddleware(  # type: ignore[attr-defined]  # a GatewayApp (above)
        DrainMiddleware(DirectRoutes(fastapi, routes), drain=drain),
        metrics=metrics, max_body_bytes=settings.max_body_bytes, api_key=settings.api_key,
        batch_api_keys=settings.batch_api_keys, tracer=tracer))
    return app
