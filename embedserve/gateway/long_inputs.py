"""Inputs longer than the model's window: the policy, the windows, the pooling.

Owns three pure steps. Which policy a request runs under: the server's
default (``--auto-truncate``, TEI's flag name) overridden by the request's
``truncate`` (TEI's and Jina's boolean, Cohere's ``NONE``/``START``/``END``,
or ``chunk``), ``truncation_direction`` (TEI's) and ``chunk_overlap``.
Cutting over-long sequences into windows of the model's length, the
model's special tokens around every window. Pooling the windows' raw
vectors back into one vector per input, weighted by each window's content
tokens. Refusing (413) and truncating are the tokenizer's and validate's
work (``preprocess.py``); normalizing and Matryoshka dimensions are
``model/postprocess.py``'s, applied after pooling. Knows nothing about HTTP
or replicas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from embedserve import ragged
from embedserve.errors import InvalidInput
from embedserve.ragged import RaggedBatch

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
        return LongInputPolicy(name, "right", overlap)
    return LongInputPolicy("truncate", name, overlap)


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
    chosen: Direction = fixed or asked or (default.direction if default.mode == "truncate" else "right")
    return LongInputPolicy(mode, chosen, default.overlap if overlap is None else overlap)


def window_bounds(content: int, room: int, overlap: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each window over ``content`` tokens, ``room`` at most each.

    Windows start every ``room - overlap`` tokens; the last one ends at the
    content's end (and may be shorter). Content that fits is one window.
    """
    if room < 1 or not 0 <= overlap < room:
        raise ValueError(f"windows of {room} tokens cannot overlap by {overlap}")
    bounds = [(0, min(content, room))]
    stride = room - overlap
    while bounds[-1][1] < content:
        start = bounds[-1][0] + stride
        bounds.append((start, min(content, start + room)))
    return bounds


@dataclass(frozen=True)
class Windows:
    """A request's sequences as the model's windows, and which input each belongs to."""

    batch: RaggedBatch        # W windows, each with the model's special tokens
    window_cu: np.ndarray     # int64 [B+1]: input i's windows are window_cu[i]:window_cu[i+1]
    weights: np.ndarray       # int64 [W]: content tokens (specials excluded) of each window

    @property
    def num_inputs(self) -> int:
        return int(self.window_cu.shape[0] - 1)

    @property
    def split(self) -> bool:
        """Whether any input became more than one window."""
        return self.batch.num_sequences > self.num_inputs


def cut_windows(batch: RaggedBatch, prefix: int, suffix: int, max_positions: int,
                overlap: int) -> Windows:
    """Each sequence of ``batch`` (specials included) as windows of ``max_positions`` tokens.

    ``prefix`` and ``suffix`` are how many special tokens the sequences
    start and end with; every window gets the same ones around its slice of
    the content. A sequence that fits stays one window, unchanged.
    """
    room = max_positions - prefix - suffix
    lengths = batch.lengths.astype(np.int64)
    content = lengths - prefix - suffix
    if int(lengths.max(initial=0)) <= max_positions:
        return Windows(batch, np.arange(batch.num_sequences + 1, dtype=np.int64), content)
    pieces: list[np.ndarray] = []
    window_lengths: list[int] = []
    weights: list[int] = []
    counts = np.zeros(batch.num_sequences, dtype=np.int64)
    for i in range(batch.num_sequences):
        sequence = batch.sequence(i)
        if lengths[i] <= max_positions:
            pieces.append(sequence)
            window_lengths.append(int(lengths[i]))
            weights.append(int(content[i]))
            counts[i] = 1
            continue
        head, body, tail = sequence[:prefix], sequence[prefix:len(sequence) - suffix], \
            sequence[len(sequence) - suffix:]
        bounds = window_bounds(int(content[i]), room, overlap)
        for start, stop in bounds:
            pieces += [head, body[start:stop], tail]
            window_lengths.append(stop - start + prefix + suffix)
            weights.append(stop - start)
        counts[i] = len(bounds)
    windows = ragged.from_lengths(np.concatenate(pieces), np.array(window_lengths, dtype=np.int64))
    return Windows(windows, ragged.cu_seqlens_from_lengths(counts), np.array(weights, dtype=np.int64))


def pool_windows(vectors: np.ndarray, windows: Windows) -> np.ndarray:
    """Raw window vectors [W, d] -> one raw vector per input [B, d], float32.

    The mean of an input's windows weighted by their content tokens, summed
    in float64; an input of one window keeps its vector exactly.
    """
    if vectors.shape[0] != windows.batch.num_sequences:
        raise ValueError(f"{vectors.shape[0]} vectors for {windows.batch.num_sequences} windows")
    if not windows.split:
        return np.asarray(vectors, dtype=np.float32)
    cu = windows.window_cu
    pooled = np.array(vectors[cu[:-1]], dtype=np.float32)   # inputs of one window: as they are
    for i in np.flatnonzero(np.diff(cu) > 1).tolist():
        weights = windows.weights[cu[i]:cu[i + 1]].astype(np.float64)
        pooled[i] = weights @ vectors[cu[i]:cu[i + 1]].astype(np.float64) / weights.sum()
    return pooled
