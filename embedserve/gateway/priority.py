"""Which traffic class a request runs as: ``interactive`` (default) or ``batch``.

Owns reading the class off a request (docs/priority.md): an operator's forced
class (an API key given by ``--batch-api-key``, whose match the middleware
records in the scope; or the route, ``--route-priority``) wins over the
request's own ``priority`` body field, which wins over its
``x-embedserve-priority`` header; none of them: interactive. The choice is kept
in the scope for the pipeline (which sends it to the replicas and holds the
class's budget) and the middleware (per-class latency). A value that names no
class is a 400 naming where it came from, even when a forced class overrides it.
Routes with a ``priority`` field call ``request_priority``; on the others the
pipeline reads the class from the operator's rules and the header alone
(``scope_priority``).
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.types import Scope

from embedserve.errors import InvalidInput
from embedserve.link.wire import INTERACTIVE, PRIORITIES

HEADER = "x-embedserve-priority"
_HEADER_BYTES = HEADER.encode()
PRIORITY_KEY = "embedserve.priority"            # the class the request runs as
FORCED_KEY = "embedserve.forced_priority"       # set by the middleware for a batch API key


def check_priority(value: str, field: str) -> str:
    """``value`` as a class name (case and surrounding blanks ignored), or InvalidInput."""
    name = value.strip().lower()
    if name not in PRIORITIES:
        raise InvalidInput(f"{field} must be one of {', '.join(PRIORITIES)}, got {value!r}",
                           field=field)
    return name


def request_priority(scope: Scope, body_value: str | None,
                     route_priorities: Mapping[str, str]) -> str:
    """The class of the request in ``scope`` (see the module docstring); also stored there."""
    chosen = INTERACTIVE
    header = _header(scope)
    if header is not None:
        chosen = check_priority(header, HEADER)
    if body_value is not None:
        chosen = check_priority(body_value, "priority")
    forced = scope.get(FORCED_KEY) or route_priorities.get(scope.get("path", ""))
    if forced is not None:
        chosen = forced
    scope[PRIORITY_KEY] = chosen
    return chosen


def scope_priority(scope: Scope, route_priorities: Mapping[str, str]) -> str:
    """The class ``request_priority`` chose for this request; on a route that did not ask
    (one without a ``priority`` field), chosen now from the operator's rules and the header."""
    chosen = scope.get(PRIORITY_KEY)
    return chosen if chosen is not None else request_priority(scope, None, route_priorities)


def _header(scope: Scope) -> str | None:
    for name, value in scope.get("headers") or ():
        if name == _HEADER_BYTES:
            return value.decode("latin-1")
    return None


def parse_route_priorities(rules: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``ROUTE=CLASS`` rules (``--route-priority /embed=batch``) -> {route: class}; ValueError
    naming the rule when one is malformed."""
    parsed: dict[str, str] = {}
    for rule in rules:
        route, sep, name = rule.partition("=")
        if not sep or not route.startswith("/") or name.strip().lower() not in PRIORITIES:
            raise ValueError(f"--route-priority {rule!r}: expected ROUTE=CLASS with ROUTE a path "
                             f"such as /embed and CLASS one of {', '.join(PRIORITIES)}")
        parsed[route] = name.strip().lower()
    return parsed
