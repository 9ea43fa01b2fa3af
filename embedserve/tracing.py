"""Whether and where to export OpenTelemetry traces: settings, the flag, the environment.

Tracing is optional (``pip install 'embedserve[otel]'``) and off unless
``--otlp-endpoint`` or the standard ``OTEL_*`` variables ask for it. This
module imports nothing of OpenTelemetry: a process that does not trace never
loads it, and its requests do no tracing work (each tier holds ``None`` for its
tracer and skips every span). ``start_tracer`` loads ``embedserve.otel``, the
SDK-backed spans, only when tracing is on. Entry points hand this module the
environment (``tracing_settings(flag, os.environ, ...)``); it never reads it.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from embedserve.entrypoint import StartupError

if TYPE_CHECKING:
    from embedserve.otel import Tracer

# The OTLP/HTTP path of traces, appended to a base endpoint as the OTLP exporter
# specification says (OTEL_EXPORTER_OTLP_ENDPOINT; --otlp-endpoint is read the same way).
TRACES_PATH = "/v1/traces"
# The samplers of OTEL_TRACES_SAMPLER (the specification's names).
SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on",
            "parentbased_always_off", "parentbased_traceidratio")
DEFAULT_SAMPLER = "parentbased_always_on"


@dataclass(frozen=True)
class TracingSettings:
    """Where spans go and which traces are kept."""

    endpoint: str                     # the OTLP/HTTP traces URL, .../v1/traces
    service_name: str                 # service.name of every span of this process
    sampler: str = DEFAULT_SAMPLER    # one of SAMPLERS
    sampler_arg: float = 1.0          # the ratio of the *traceidratio samplers
    # OTEL_EXPORTER_OTLP_(TRACES_)HEADERS: e.g. a collector's API key.
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    # OTEL_RESOURCE_ATTRIBUTES: deployment.environment=prod,...
    resource_attributes: tuple[tuple[str, str], ...] = ()


def add_otlp_endpoint_flag(parser: argparse.ArgumentParser) -> None:
    """``--otlp-endpoint``: on every command that starts a gateway or a replica."""
    parser.add_argument("--otlp-endpoint", default=None, metavar="URL",
                        help="export OpenTelemetry traces (OTLP over HTTP/protobuf) to this "
                             "collector, e.g. http://localhost:4318 (/v1/traces is added); "
                             "the OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME and "
                             "OTEL_TRACES_SAMPLER variables work too. Needs "
                             "pip install 'embedserve[otel]' (default: off; docs/tracing.md)")


def otlp_endpoint_args(args: argparse.Namespace) -> tuple[str, ...]:
    """The flag as argv, for a gateway or replica started as a child (the ``OTEL_*``
    variables reach children through their environment)."""
    return ("--otlp-endpoint", args.otlp_endpoint) if args.otlp_endpoint else ()


def tracing_settings(endpoint_flag: str | None, environ: Mapping[str, str],
                     default_service: str) -> TracingSettings | None:
    """What ``--otlp-endpoint`` and the ``OTEL_*`` variables in ``environ`` ask for; None:
    no tracing. The flag wins over the variables' endpoint; ``OTEL_SDK_DISABLED=true`` or
    ``OTEL_TRACES_EXPORTER=none`` turn tracing off. A bad value: ``StartupError``."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporter == "none":
        return None
    if endpoint_flag:
        given, endpoint = endpoint_flag, _traces_url(endpoint_flag)
    elif environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        given = endpoint = environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"]   # used as it is (the spec)
    elif environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        given = environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
        endpoint = _traces_url(given)
    else:
        return None
    if exporter != "otlp":
        raise StartupError(f"OTEL_TRACES_EXPORTER={exporter}: embedserve exports traces over OTLP",
                           "set OTEL_TRACES_EXPORTER=otlp (or none)")
    protocol = environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                           environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"))
    if protocol.strip() != "http/protobuf":
        raise StartupError(f"OTLP protocol {protocol}: embedserve exports traces as OTLP "
                           "http/protobuf", "point it at the collector's OTLP/HTTP port (4318) "
                           "and set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf")
    if not given.strip().startswith(("http://", "https://")):
        raise StartupError(f"OTLP endpoint {given!r} is not an http:// or https:// URL",
                           "give the collector's OTLP/HTTP address, e.g. http://localhost:4318")
    sampler = environ.get("OTEL_TRACES_SAMPLER", DEFAULT_SAMPLER).strip().lower()
    if sampler not in SAMPLERS:
        raise StartupError(f"OTEL_TRACES_SAMPLER={sampler} is not a sampler embedserve knows",
                           f"use one of {', '.join(SAMPLERS)}")
    ratio_text = environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0")
    try:
        ratio = float(ratio_text)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise StartupError(f"OTEL_TRACES_SAMPLER_ARG={ratio_text} is not a ratio",
                           "give a number from 0 to 1")
    _require_sdk()
    headers = _pairs(environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                                 environ.get("OTEL_EXPORTER_OTLP_HEADERS", "")))
    return TracingSettings(endpoint=endpoint,
                           service_name=environ.get("OTEL_SERVICE_NAME") or default_service,
                           sampler=sampler, sampler_arg=ratio, headers=headers,
                           resource_attributes=_pairs(environ.get("OTEL_RESOURCE_ATTRIBUTES", "")))


def start_tracer(settings: TracingSettings | None) -> Tracer | None:
    """A tracer exporting as ``settings`` say (None: tracing off, nothing loaded)."""
    if settings is None:
        return None
    try:
        from embedserve.otel import Tracer
    except ImportError as error:
        raise StartupError(f"tracing needs OpenTelemetry, which is not installed ({error.name})",
                           "pip install 'embedserve[otel]', or drop --otlp-endpoint and the "
                           "OTEL_EXPORTER_OTLP_* variables") from None
    return Tracer.exporting(settings.endpoint, settings.service_name, settings.sampler,
                            settings.sampler_arg, settings.headers, settings.resource_attributes)


def _require_sdk() -> None:
    """StartupError unless the otel extra is installed: found now, at the entry point, rather
    than when a process that the launcher started first loads it."""
    for module in ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http"):
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            raise StartupError(f"tracing needs OpenTelemetry, which is not installed ({module})",
                               "pip install 'embedserve[otel]', or drop --otlp-endpoint and the "
                               "OTEL_EXPORTER_OTLP_* variables")


def _traces_url(base: str) -> str:
    base = base.strip().rstrip("/")
    return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


def _pairs(text: str) -> tuple[tuple[str, str], ...]:
    """``k1=v1,k2=v2`` (the OTEL_*_HEADERS / OTEL_RESOURCE_ATTRIBUTES form) as pairs."""
    pairs = []
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            pairs.append((key.strip(), value.strip()))
    return tuple(pairs)
