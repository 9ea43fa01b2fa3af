"""Sequences longer than the model's window, as windows, and their vectors pooled back.

Owns the two pure steps of chunk-and-pool, shared by the gateway's
long-input policy (``gateway/long_inputs.py``) and bulk jobs
(``local/encoding.py``): cutting over-long sequences into windows of the
model's length, the model's special tokens around every window, and pooling
the windows' raw vectors back into one vector per sequence, weighted by each
window's content tokens. Normalizing and Matryoshka dimensions are
``postprocess.py``'s, applied after pooling. Torch-free NumPy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from embedserve import ragged
from embedserve.ragged import RaggedBatch


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
    """Sequences as the model's windows, and which input each window belongs to."""

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
