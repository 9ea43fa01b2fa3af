"""Inputs longer than the model's window: which policy a request runs under.

Owns the policy: the server's default (``--auto-truncate``, TEI's flag
name) overridden by the request's ``truncate`` (TEI's and Jina's boolean,
Cohere's ``NONE``/``START``/``END``, or ``chunk``), ``truncation_direction``
(TEI's) and ``chunk_overlap``. Refusing (413) and truncating are the
tokenizer's and validate's work (``preprocess.py``); cutting windows and
pooling them are ``model/windows.py``'s (shared with bulk jobs);
normalizing and Matryoshka dimensions are ``model/postprocess.py``'s,
applied after pooling. Also owns what a refusal tells the client to do
instead (``says_how_to_fix``). Knows nothing about HTTP or replicas.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

from embedserve.errors import InputTooLong, InvalidInput

Mode = Literal["refuse", "truncate", "chunk"]
Direction = Literal["right", "left"]

# What ``--auto-truncate`` accepts; a bare flag means "right", as TEI's does.
SERVER_POLICIES = ("refuse", "right", "left", "chunk")

# A request's string ``truncate``, case-insensitive: our names and Cohere's
# (``END`` drops the end of the text, i.e. cuts from the right).
_REQUEST_VALUES: dict[str, tuple[Mode, Direction | None]] = {
    "refuse": ("refuse", None), "none": ("refuse", None),
    "right": ("truncate", "right"), "end": ("truncate", "right"),
    "left": ("truncate", "left"), "start": ("truncate", "left"),
    "chunk": ("chunk", None),
}


@dataclass(frozen=True)
class LongInputPolicy:
    """What happens to an input longer than the model's window."""

    mode: Mode = "refuse"
    direction: Direction = "right"   # which end truncation cuts
    overlap: int = 0                 # content tokens consecutive windows share (mode "chunk")


def server_policy(name: str, overlap: int, room: int) -> LongInputPolicy:
    """The server's default from its flags; ValueError (at start-up) when they do not fit."""
    if name not in SERVER_POLICIES:
        raise ValueError(f"--auto-truncate must be one of {', '.join(SERVER_POLICIES)}, not {name!r}")
    if not 0 <= overlap < room:
        raise ValueError(f"--chunk-overlap {overlap} must lie in [0, {room - 1}]: the model's "
                         f"windows hold {room} tokens besides the special tokens")
    if name == "refuse" or name == "chunk":
        return LongInputPolicy(name, "right", overlap)  # type: ignore[arg-type]  # checked above
    return LongInputPolicy("truncate", name, overlap)  # type: ignore[arg-type]  # checked above


def resolve_policy(default: LongInputPolicy, truncate: bool | str | None, direction: str | None,
                   overlap: int | None, room: int) -> LongInputPolicy:
    """The policy one request runs under: its own fields over the server's ``default``.

    ``truncate``: None keeps the default; False refuses; True truncates
    (from ``direction``, else the default's direction when the default
    truncates, else the right); a string names a policy (``_REQUEST_VALUES``).
    ``room`` is the window's content tokens, which bounds ``overlap``.
    InvalidInput (400) names the field at fault.
    """
    if overlap is not None and not 0 <= overlap < room:
        raise InvalidInput(f"chunk_overlap must lie in [0, {room - 1}] (the model's windows hold "
                           f"{room} tokens besides the special tokens), got {overlap}",
                           field="chunk_overlap")
    asked = direction.lower() if direction is not None else None
    if asked is not None and asked not in ("right", "left"):
        raise InvalidInput(f"truncation_direction must be 'right' or 'left', got {direction!r}",
                           field="truncation_direction")
    if truncate is None:
        mode, fixed = default.mode, None
    elif isinstance(truncate, bool):
        mode, fixed = ("truncate" if truncate else "refuse"), None
    else:
        key = truncate.lower()
        if key not in _REQUEST_VALUES:
            raise InvalidInput(f"truncate must be true, false or one of "
                               f"{', '.join(sorted(_REQUEST_VALUES))} (any case), got {truncate!r}",
                               field="truncate")
        mode, fixed = _REQUEST_VALUES[key]
    if fixed is not None and asked is not None and asked != fixed:
        raise InvalidInput(f"truncate={truncate!r} cuts from the {fixed}, but truncation_direction "
                           f"is {direction!r}", field="truncation_direction")
    chosen: Direction = fixed or asked or (default.direction if default.mode == "truncate" else "right")  # type: ignore[assignment]
    return LongInputPolicy(mode, chosen, default.overlap if overlap is None else overlap)


# What a 413 for an input longer than the model's window says to do, per kind of
# route. The embedding routes (TEI's /embed, the OpenAI-style /v1/embeddings, whose
# extension field has the same name) follow --auto-truncate; the rerank routes take
# only the request's own boolean.
EMBED_TOO_LONG_FIX = ("set the request's \"truncate\" to true to cut it to the window (\"left\" "
                      "keeps its end, \"chunk\" embeds every window and pools them), or start "
                      "the server with --auto-truncate (right, left or chunk) to do so by default")
RERANK_TOO_LONG_FIX = "set the request's \"truncate\" to true to cut each pair to the window"


@contextmanager
def says_how_to_fix(fix: str) -> Iterator[None]:
    """Within the block, an ``InputTooLong`` for one sequence (one that names its index)
    leaves with ``fix`` appended: what the client can change to be served."""
    try:
        yield
    except InputTooLong as exc:
        if exc.index is None:
            raise
        raise InputTooLong(f"{exc.message}; {fix}", index=exc.index, length=exc.length,
                           limit=exc.limit, field=exc.field) from None
