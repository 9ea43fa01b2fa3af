"""Attention restricted to each sequence of a packed batch, of a given kind.

Owns the ways of keeping a token's attention inside its own sequence when all
sequences share one ``[T, heads, head_dim]`` tensor, and the attention kinds a
model may ask for inside a sequence (``AttentionKind``):

- bidirectional (encoders): every token sees its whole sequence;
- causal (decoder LLMs): token i sees tokens j <= i of its sequence;
- sliding window ``w``, bidirectional or causal: additionally |i - j| <= w
  (ModernBERT's local layers; Mistral's ``sliding_window`` s is w = s - 1).

Each builder takes the batch layout once per step, plus the kind its model
uses by default, and returns an ``Attend`` closure the model calls in every
layer. A layer that needs another kind (ModernBERT alternates global and local
layers) passes ``kind=`` to that same closure; masks are built once per kind
per step:

- ``per_sequence``: one SDPA call per sequence on a slice (no padding at all;
  B calls per layer); in bf16 on CPUs with AMX or AVX512-BF16, bidirectional
  calls go to one native kernel call per layer instead (bf16_attention.py), its
  products in int8 for --dtype int8's layers where the CPU has AVX512-VNNI.
  ``per_sequence_sdpa`` is the same without the native kernel.
- ``padded``: scatter into a padded ``[B, heads, L, hd]`` view, one SDPA with a
  key mask, gather back (padding in attention only, never in dense layers).
- ``block_diagonal``: one SDPA over all T tokens with a mask allowing only
  same-sequence pairs (static shapes: what CUDA graphs need). Its cost and
  memory grow with T squared (the math path materializes heads x T x T
  scores: 12 GB at T = 16k), so it suits small token counts only.

Which one the engine uses on CPU was chosen by measurement (BENCHMARKS.md,
engine section; ``bench/engine_bench.py --attention``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch
import torch.nn.functional as F

from embedserve.engine.modules import bf16_attention
from embedserve.engine.modules.layout import PackedLayout


@dataclass(frozen=True)
class AttentionKind:
    """Which tokens of its own sequence a query at position i may attend to.

    causal: only keys j <= i. window: only keys with |i - j| <= window (None:
    no limit). Never across sequences, whatever the kind.
    """

    causal: bool = False
    window: int | None = None

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 0:
            raise ValueError(f"attention window must be >= 0, got {self.window}")

    @property
    def is_full(self) -> bool:
        return not self.causal and self.window is None


BIDIRECTIONAL = AttentionKind()
CAUSAL = AttentionKind(causal=True)


class Attend(Protocol):
    """(q, k, v) each [T, heads, head_dim] -> context [T, heads, head_dim].

    ``kind`` None means the kind the closure was built with. ``quantized``: the caller's
    layer is int8 (--dtype int8's ``Int8Layer``), so the products may run in int8 where the
    native kernel has them (``per_sequence``; bf16_attention.int8_products_available); the
    other ways ignore it and compute exactly as without.
    """

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 kind: AttentionKind | None = None, quantized: bool = False) -> torch.Tensor: ...


AttentionBuilder = Callable[..., Attend]   # (layout, causal=False, window=None) -> Attend
Built = TypeVar("Built")


def allowed_pairs(query_pos: torch.Tensor, key_pos: torch.Tensor, kind: AttentionKind) -> torch.Tensor:
    """Boolean [Q, K]: may the query at position query_pos[a] see the key at key_pos[b]?

    Positions are offsets inside one sequence (or indices of a packed batch:
    differences are what counts). Callers add the same-sequence condition.
    """
    distance = query_pos[:, None] - key_pos[None, :]                                  # [Q, K]
    allowed = torch.ones_like(distance, dtype=torch.bool)
    if kind.causal:
        allowed &= distance >= 0
    if kind.window is not None:
        allowed &= distance.abs() <= kind.window
    return allowed


def _memo(default: AttentionKind, build: Callable[[AttentionKind], Built]) -> Callable[[AttentionKind | None], Built]:
    """Per-step cache: one mask (or set of masks) per kind the layers ask for."""
    built: dict[AttentionKind, Built] = {}

    def get(kind: AttentionKind | None) -> Built:
        kind = kind or default
        if kind not in built:
            built[kind] = build(kind)
        return built[kind]

    return get


def per_sequence(layout: PackedLayout, causal: bool = False, window: int | None = None,
                 native: bool = True) -> Attend:
    bounds = list(zip(layout.starts, layout.ends))
    default = AttentionKind(causal, window)
    starts = torch.from_numpy(layout.cu_seqlens[:-1].astype("int64"))

    def slice_masks(kind: AttentionKind) -> dict[int, torch.Tensor]:
        # One [L, L] mask per distinct length the window cuts into (L - 1 > window);
        # other slices run full or plain causal SDPA (is_causal), with no mask at all.
        if kind.window is None:
            return {}
        lengths = {end - start for start, end in bounds if end - start - 1 > kind.window}
        device = layout.seq_ids_tensor.device
        return {n: allowed_pairs(torch.arange(n, device=device), torch.arange(n, device=device), kind)
                for n in lengths}

    masks = _memo(default, slice_masks)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               kind: AttentionKind | None = None, quantized: bool = False) -> torch.Tensor:
        # q, k, v: [T, heads, hd]; each slice -> [1, heads, L, hd] for SDPA
        kind = kind or default
        if native and kind.is_full and bf16_attention.covers(q, k, v):
            return bf16_attention.attend_sequences(q, k, v, starts, layout.lengths_tensor,
                                                   quantized=quantized and bf16_attention.int8_products_available())
        by_length = masks(kind)
        out = torch.empty_like(q)
        for start, end in bounds:
            qs, ks, vs = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
            mask = by_length.get(end - start)
            out[start:end] = F.scaled_dot_product_attention(
                qs, ks, vs, attn_mask=mask, is_causal=kind.causal and mask is None)[0].transpose(0, 1)
        return out

    return attend


def padded_from_ids(seq_ids: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor,
                    longest: int, causal: bool = False, window: int | None = None) -> Attend:
    """Scatter tokens into rows of ``longest`` slots, one SDPA with a key mask, gather back.

    seq_ids, offsets: [T] (row and column of each token); lengths: [R]. Static
    shapes for fixed (T, R, longest), so CUDA graphs can capture it. Tokens of
    a CUDA-graph bucket's padding all land in the last (dump) row; rows without
    tokens are never gathered back.
    """
    rows = lengths.shape[0]
    slot = seq_ids * longest + offsets.clamp(max=longest - 1)                         # [T]
    columns = torch.arange(longest, device=lengths.device)
    key_mask = columns[None, :] < lengths[:, None]                                  # [R, L]

    def row_mask(kind: AttentionKind) -> torch.Tensor:
        mask = key_mask[:, None, None, :]                                           # [R, 1, 1, L]
        if not kind.is_full:
            mask = mask & allowed_pairs(columns, columns, kind)[None, None]         # [R, 1, L, L]
        return mask

    masks = _memo(AttentionKind(causal, window), row_mask)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               kind: AttentionKind | None = None, quantized: bool = False) -> torch.Tensor:
        heads, hd = q.shape[1], q.shape[2]

        def to_padded(t: torch.Tensor) -> torch.Tensor:
            buffer = t.new_zeros(rows * longest, heads, hd)
            buffer[slot] = t
            return buffer.view(rows, longest, heads, hd).transpose(1, 2)            # [R, heads, L, hd]

        ctx = F.scaled_dot_product_attention(to_padded(q), to_padded(k), to_padded(v),
                                             attn_mask=masks(kind))
        return ctx.transpose(1, 2).reshape(rows * longest, heads, hd)[slot]          # [T, heads, hd]

    return attend


def padded(layout: PackedLayout, causal: bool = False, window: int | None = None) -> Attend:
    return padded_from_ids(layout.seq_ids_tensor, layout.offsets_tensor, layout.lengths_tensor,
                           layout.max_length, causal, window)


def block_diagonal_from_seq_ids(seq_ids: torch.Tensor, causal: bool = False,
                                window: int | None = None) -> Attend:
    """One attention over all tokens; ``seq_ids [T]`` says which pairs may attend.

    Padding tokens (in a CUDA-graph bucket) carry their own id, so they attend
    only to each other and never leak into real sequences. Sequences are
    contiguous runs of the packed batch, so index differences inside one are
    position differences: causal and window masks need no offsets.
    """
    same_sequence = seq_ids[:, None] == seq_ids[None, :]                              # [T, T]
    index = torch.arange(seq_ids.shape[0], device=seq_ids.device)

    def token_mask(kind: AttentionKind) -> torch.Tensor:
        if kind.is_full:
            return same_sequence[None]                                              # [1, T, T]
        return (same_sequence & allowed_pairs(index, index, kind))[None]

    masks = _memo(AttentionKind(causal, window), token_mask)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               kind: AttentionKind | None = None, quantized: bool = False) -> torch.Tensor:
        ctx = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1),
                                             v.transpose(0, 1), attn_mask=masks(kind))  # [heads, T, hd]
        return ctx.transpose(0, 1)

    return attend


def block_diagonal(layout: PackedLayout, causal: bool = False, window: int | None = None) -> Attend:
    return block_diagonal_from_seq_ids(layout.seq_ids_tensor, causal, window)


def key_limited(layout: PackedLayout, key_lengths: torch.Tensor) -> Attend:
    """Bidirectional attention in which sequence ``i``'s tokens all attend to its first
    ``key_lengths[i]`` tokens only: the tokens after them get outputs but are nobody's
    keys, as a ColBERT query's expansion tokens with ``attention_mask`` 0 in transformers.
    One SDPA per sequence (these are short queries, on the CPU). A sliding-window kind
    (ModernBERT's local layers, which find ``windowed`` set) also keeps ``|i - j| <= w``,
    as transformers combines its window with the padding mask; a token with no key in its
    window gets zeros."""
    bounds = list(zip(layout.starts, layout.ends, strict=True))
    limits = key_lengths.tolist()

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               kind: AttentionKind | None = None, quantized: bool = False) -> torch.Tensor:
        if kind is not None and kind.causal:
            raise ValueError("key-limited attention is bidirectional only")
        window = kind.window if kind is not None else None
        out = torch.empty_like(q)
        for (start, end), keys in zip(bounds, limits, strict=True):
            qs = q[start:end].transpose(0, 1).unsqueeze(0)
            ks, vs = (t[start:start + keys].transpose(0, 1).unsqueeze(0) for t in (k, v))
            mask = None
            if window is not None:
                rows = torch.arange(end - start, device=q.device)[:, None]
                mask = (rows - torch.arange(keys, device=q.device)[None, :]).abs() <= window   # [L, keys]
            ctx = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask)[0].transpose(0, 1)
            if mask is not None:
                ctx = ctx.masked_fill(~mask.any(dim=1)[:, None, None], 0.0)   # no key at all: not NaN
            out[start:end] = ctx
        return out

    attend.windowed = True  # type: ignore[attr-defined]  # runs a window kind itself
    return attend


def per_sequence_sdpa(layout: PackedLayout, causal: bool = False, window: int | None = None) -> Attend:
    return per_sequence(layout, causal, window, native=False)


ATTENTION_IMPLS: dict[str, AttentionBuilder] = {
    "per_sequence": per_sequence,
    "per_sequence_sdpa": per_sequence_sdpa,
    "padded": padded,
    "block_diagonal": block_diagonal,
}
