"""``embedserve gateway``: the HTTP gateway alone in front of ``--upstream`` replicas.

Prints ``embedserve gateway listening on http://HOST:PORT`` once it accepts
requests. On Ctrl-C or SIGTERM it drains: new requests (and /ready) get 503
at once while those admitted before the signal are answered normally, the
listening socket staying open meanwhile; then it closes and exits 0 (or
after ``--drain-timeout``). The gateway's flags and settings are built here
(``embedserve serve`` reuses them); flags and environment are read here only.

Several models: ``--model DIR:upstream=ADDRESSES`` once per model (the
replicas of each), optionally ``:name=NAME[,ALIAS...]``; requests pick a
model by ``model``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn

from embedserve.defaults.model_args import ModelSpec, add_model_spec_arguments, model_specs_from_args
from embedserve.entrypoint import (
    configure_logging,
    gateway_banner,
    gateway_grpc_banner,
    run_event_loop,
    stop_on_signals,
)
from embedserve.gateway.long_inputs import SERVER_POLICIES
from embedserve.gateway.priority import parse_route_priorities
from embedserve.gateway.settings import REPLICA_CALLS, GatewaySettings, ServedModel, check_distinct_names
from embedserve.link.token_file import add_replica_token_argument, replica_token_from_args
from embedserve.tracing import add_otlp_endpoint_flag, tracing_settings

if TYPE_CHECKING:
    from fastapi import FastAPI

    from embedserve.gateway.grpc_server import GrpcApiServer
    from embedserve.gateway.startup import PreparedModel

log = logging.getLogger("embedserve.gateway")
_DEFAULTS = GatewaySettings(model_dir=Path("."), upstreams=())
# Once every admitted request is answered, only 503s can still be in flight:
# uvicorn needs little time to finish them and close the connections.
_CLOSE_GRACE_S = 3
# Then it goes on answering 503 + Connection: close for this long before closing
# connections: a client whose last answer was sent before the drain began kept
# its connection, and its next request, if it lands just as uvicorn closes idle
# connections, is cut instead of refused. Seen under load (tests/sigterm_load.py).
_KEEP_ALIVE_GRACE_S = 0.5


def register(subparsers: argparse._SubParsersAction) -> None:
    gateway = subparsers.add_parser("gateway", help="run the HTTP gateway in front of replicas",
                                    description=__doc__.splitlines()[0])
    gateway.add_argument("--upstream", default=None,
                         help="scheduler replicas of the model: host:port[,host:port...], or "
                              "dns:NAME:PORT (every address NAME resolves to, re-resolved as it "
                              "changes); with several --model, give each its own as "
                              "--model DIR:upstream=ADDRESSES instead")
    add_replica_token_argument(gateway, "send the token in this file to the replicas on every call "
                                        "('authorization: Bearer TOKEN'), as replicas started with "
                                        "the same file require")
    add_gateway_flags(gateway)
    gateway.set_defaults(func=run_gateway)


def add_gateway_flags(parser: argparse.ArgumentParser, starts_replicas: bool = False) -> None:
    """The gateway's flags; ``starts_replicas``: for ``serve``, which starts each model's replicas."""
    d = _DEFAULTS
    add_model_spec_arguments(parser, replicas=starts_replicas, upstream=not starts_replicas)
    parser.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                        help="names a request's 'model' may use when one model is served: the "
                             "first is the one answers carry, the rest are aliases; another name "
                             "gets 404 model_not_found (default: the model directory's name; "
                             "several models: --model DIR:name=NAME[,ALIAS...])")
    parser.add_argument("--host", default=d.host, help="address to bind (default: %(default)s)")
    parser.add_argument("--port", type=int, default=d.port, help="HTTP port; 0 picks a free one "
                        "(default: %(default)s)")
    add_grpc_port_flag(parser)
    parser.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer KEY' on API routes (also "
                             "$EMBEDSERVE_API_KEY); probes, /metrics and docs stay open")
    parser.add_argument("--batch-api-key", action="append", default=[], metavar="KEY",
                        help="a further key accepted like --api-key whose requests always run "
                             "in the batch class (docs/priority.md); repeatable (also "
                             "$EMBEDSERVE_BATCH_API_KEY)")
    parser.add_argument("--route-priority", action="append", default=[], metavar="ROUTE=CLASS",
                        help="run every request to ROUTE in CLASS (interactive or batch), "
                             "whatever it asks, e.g. /embed=batch; repeatable")
    parser.add_argument("--max-inputs", type=int, default=d.max_inputs,
                        help="inputs per request; more gets 413 (default: %(default)s)")
    parser.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes,
                        help="larger request bodies get 413 before parsing, larger gRPC "
                             "messages RESOURCE_EXHAUSTED (default: %(default)s)")
    parser.add_argument("--max-inflight-tokens", type=int, default=d.max_inflight_tokens,
                        help="tokens admitted at once across requests, per served model and "
                             "per class (interactive, batch); beyond it requests get 429 + "
                             "Retry-After. Bounds memory and queueing (default: %(default)s)")
    add_long_input_flags(parser)
    parser.add_argument("--request-timeout", type=float, default=d.request_timeout_s,
                        help="seconds before a request is answered 504 (default: %(default)s)")
    parser.add_argument("--chunk-sequences", type=int, default=d.chunk_max_sequences,
                        help="most sequences per chunk sent to one replica; smaller chunks spread "
                             "a large request over more replicas (default: %(default)s)")
    parser.add_argument("--chunk-tokens", type=int, default=d.chunk_max_tokens,
                        help="most tokens per chunk (default: %(default)s)")
    parser.add_argument("--replica-ping", type=float, default=d.replica_ping_s,
                        help="seconds between pings to each replica and how long one may go "
                             "unanswered before the replica counts as hung and its calls are "
                             "retried elsewhere (its TCP frame connections: keepalive probes "
                             "as often); 0 turns pings off (default: %(default)s)")
    parser.add_argument("--replica-calls", choices=REPLICA_CALLS, default=d.replica_calls,
                        help="how Embed/Score reach a replica: frames (protobuf frames on its "
                             "frame socket: PATH.frames beside a unix:PATH one, the TCP port its "
                             "Info names for a host:port one; about a millisecond less per call "
                             "than grpc.aio, and gRPC whenever no frame connection is open) or "
                             "grpc; health and Info always use gRPC (default: %(default)s)")
    parser.add_argument("--drain-timeout", type=float, default=d.drain_timeout_s,
                        help="after SIGTERM, seconds that requests admitted before it may run "
                             "while new ones get 503; then the process exits "
                             "(default: %(default)s)")
    add_otlp_endpoint_flag(parser)
    parser.add_argument("--log-level", default="info", help="default: %(default)s")


def add_grpc_port_flag(parser: argparse.ArgumentParser) -> None:
    """``--grpc-port``: also ``embedserve cluster``'s, passed on to its gateway."""
    parser.add_argument("--grpc-port", type=_non_negative, default=None, metavar="PORT",
                        help="also serve the public gRPC API (embedserve.v1.Embeddings, with "
                             "health and reflection; docs/grpc-api.md) on this port of --host; "
                             "0 picks a free one (default: off)")


def add_long_input_flags(parser: argparse.ArgumentParser) -> None:
    """``--auto-truncate`` and ``--chunk-overlap``: also ``embedserve cluster``'s, passed on."""
    d = _DEFAULTS
    parser.add_argument("--auto-truncate", nargs="?", const="right", default=d.auto_truncate,
                        choices=SERVER_POLICIES, metavar="POLICY",
                        help="inputs longer than the model's window, unless a request's "
                             "'truncate' says otherwise: refuse (413), right or left (cut from "
                             "that end, special tokens kept), chunk (embed windows of the model's "
                             "length, pool them weighted by their tokens); the bare flag means "
                             "right, as TEI's (default: %(default)s)")
    parser.add_argument("--chunk-overlap", type=_non_negative, default=d.chunk_overlap,
                        metavar="TOKENS",
                        help="tokens consecutive windows of one input share under "
                             "--auto-truncate chunk (request: chunk_overlap) (default: %(default)s)")


def long_input_args(args: argparse.Namespace) -> tuple[str, ...]:
    """The flags of ``add_long_input_flags`` as argv, for a gateway started as a child."""
    return ("--auto-truncate", args.auto_truncate, "--chunk-overlap", str(args.chunk_overlap))


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def served_models(args: argparse.Namespace, specs: Sequence[ModelSpec],
                  upstreams: Sequence[tuple[str, ...]]) -> tuple[ServedModel, ...]:
    """Each ``--model`` with its replicas' addresses and its names.

    ``--served-model-name`` names a lone model; with several, each takes its
    names from ``:name=``. SystemExit saying which when both are given.
    """
    if args.served_model_name and (len(specs) > 1 or specs[0].names):
        raise SystemExit("--served-model-name names a single model; give each --model its names "
                         "as --model DIR:name=NAME[,ALIAS...]")
    # A Hub model is named by its id unless told otherwise (spec.served_names).
    names = [spec.names or tuple(args.served_model_name or ()) or spec.served_names for spec in specs]
    models = tuple(ServedModel(spec.model_dir, addresses, model_names)
                   for spec, addresses, model_names in zip(specs, upstreams, names, strict=True))
    try:
        check_distinct_names([model.names for model in models])
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    return models


def gateway_settings(args: argparse.Namespace, models: Sequence[ServedModel],
                     replica_token: str | None = None) -> GatewaySettings:
    first, *others = models
    batch_keys = [*args.batch_api_key, os.environ.get("EMBEDSERVE_BATCH_API_KEY") or ""]
    try:
        route_priorities = parse_route_priorities(args.route_priority)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    return GatewaySettings(
        model_dir=first.model_dir, upstreams=first.upstreams, host=args.host, port=args.port,
        grpc_port=args.grpc_port,
        served_model_names=first.served_model_names, additional_models=tuple(others),
        api_key=args.api_key or os.environ.get("EMBEDSERVE_API_KEY") or None,
        batch_api_keys=tuple(key for key in batch_keys if key), route_priorities=route_priorities,
        max_inputs=args.max_inputs, max_body_bytes=args.max_body_bytes,
        max_inflight_tokens=args.max_inflight_tokens,
        auto_truncate=args.auto_truncate, chunk_overlap=args.chunk_overlap,
        request_timeout_s=args.request_timeout, chunk_max_sequences=args.chunk_sequences,
        chunk_max_tokens=args.chunk_tokens, replica_ping_s=args.replica_ping,
        drain_timeout_s=args.drain_timeout, replica_token=replica_token,
        replica_calls=args.replica_calls,
        tracing=tracing_settings(args.otlp_endpoint, os.environ, "embedserve-gateway"))


def run_gateway(args: argparse.Namespace) -> int:
    configure_logging(args.log_level)
    specs = model_specs_from_args(args)
    upstreams = [_upstreams(spec, args.upstream, len(specs)) for spec in specs]
    settings = gateway_settings(args, served_models(args, specs, upstreams),
                                replica_token_from_args(args, os.environ))
    return run_event_loop(serve_http(settings))


def _upstreams(spec: ModelSpec, upstream_flag: str | None, model_count: int) -> tuple[str, ...]:
    """One model's replica addresses: its ``:upstream=``, or ``--upstream`` for a lone model."""
    if spec.replicas is not None:
        raise SystemExit(f"--model {spec.format()}: the gateway starts no replicas; "
                         "replicas= is for embedserve serve and embedserve cluster")
    if spec.upstream is not None and upstream_flag is not None:
        raise SystemExit(f"--model {spec.format()}: its replicas are given twice "
                         "(:upstream= and --upstream)")
    if spec.upstream is None and model_count > 1:
        raise SystemExit(f"--model {spec.format()}: with several models, give each its replicas "
                         "as --model DIR:upstream=HOST:PORT[,...] (or dns:NAME:PORT)")
    text = spec.upstream if spec.upstream is not None else upstream_flag or ""
    upstreams = tuple(u.strip() for u in text.split(",") if u.strip())
    if not upstreams:
        raise SystemExit("--upstream needs host:port[,host:port...] or dns:NAME:PORT")
    return upstreams


async def serve_http(settings: GatewaySettings, stop: asyncio.Event | None = None,
                     prepared: dict[Path, PreparedModel] | None = None) -> int:
    """Serve the gateway until ``stop`` is set (or SIGINT/SIGTERM when None), then drain.

    ``prepared``: models read and tokenizers warmed beforehand (``startup.prepare_models``).

    Draining keeps the socket open and the server running, so requests
    admitted before the stop are answered and later ones get a clean 503;
    uvicorn's own shutdown starts only once the admitted requests are done
    (or ``settings.drain_timeout_s`` ran out), and then has nothing to cut.
    """
    from embedserve.gateway.app import create_app

    app = create_app(settings, prepared=prepared)
    sock = listening_socket(settings.host, settings.port)
    host, port = sock.getsockname()[:2]
    # httptools, named rather than left to "auto": h11's pure-Python parser cost
    # ~0.1 ms more gateway CPU per request, and a missing httptools should fail
    # at start, not quietly serve slower.
    server = _Server(uvicorn.Config(app, http="httptools", log_level="warning", access_log=False,
                                    timeout_graceful_shutdown=_CLOSE_GRACE_S),
                     gateway_banner(host, port, tuple(u for m in settings.models for u in m.upstreams)))
    own_stop = stop is None
    stop = stop or asyncio.Event()
    grpc_api = await _start_grpc_api(app, settings)

    async def drain_when_told() -> None:
        await stop.wait()
        drain = app.state.drain
        drain.begin()
        if grpc_api is not None:
            await grpc_api.draining()
        log.info("stopping: refusing new requests, %d admitted still running", drain.in_flight)
        if not await drain.wait_idle(settings.drain_timeout_s):
            log.warning("drain timeout (%.0f s): %d requests still running are cut off",
                        settings.drain_timeout_s, drain.in_flight)
        else:
            await asyncio.sleep(_KEEP_ALIVE_GRACE_S)
        server.should_exit = True

    with stop_on_signals(stop.set) if own_stop else contextlib.nullcontext():
        watcher = asyncio.create_task(drain_when_told())
        try:
            await server.serve(sockets=[sock])
        finally:
            watcher.cancel()
            if grpc_api is not None:
                await grpc_api.stop(_CLOSE_GRACE_S)
    return 0


async def _start_grpc_api(app: FastAPI, settings: GatewaySettings) -> GrpcApiServer | None:
    """The public gRPC API, listening and announced, when ``settings.grpc_port`` asks for it.

    Its calls share the HTTP side's drain: admitted ones finish before the stop."""
    if settings.grpc_port is None:
        return None
    from embedserve.gateway.grpc_server import GrpcApiServer

    grpc_api = GrpcApiServer(app, settings)
    port = await grpc_api.start()
    print(gateway_grpc_banner(settings.host, port), flush=True)
    return grpc_api


def listening_socket(host: str, port: int) -> socket.socket:
    """A bound TCP socket for uvicorn, with Nagle off on the connections it accepts.

    asyncio turns on TCP_NODELAY only for sockets whose ``proto`` is
    IPPROTO_TCP; a plain ``socket.socket()`` has proto 0, and then every
    response written as headers + body waits ~40 ms for the client's delayed
    ACK. Linux copies the option from the listener to accepted sockets.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    return sock


class _Server(uvicorn.Server):
    """uvicorn's server that leaves signals to the entry point and prints a banner.

    uvicorn re-raises a captured SIGTERM after shutting down, which would end
    the process before ``serve`` stops its replicas; the entry point's own
    handlers set ``should_exit`` instead.
    """

    def __init__(self, config: uvicorn.Config, banner: str) -> None:
        super().__init__(config)
        self._banner = banner

    @contextlib.contextmanager
    def capture_signals(self):
        yield

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets=sockets)
        if not self.should_exit:
            print(self._banner, flush=True)
