"""``--dtype int8`` on CPU: the encoder and decoder layers' linears on int8 weights and uint8 activations.

Owns swapping each encoder ``Layer`` for an ``Int8Layer`` that computes the same
function with oneDNN's quantized matmul (``torch.ops.onednn.qlinear_pointwise``,
the kernel behind torch's x86 quantization): AMX-INT8 tiles or AVX512-VNNI /
AVX-VNNI dot products where the CPU has them, oneDNN's AVX2 / SSE4.1 int8 code
elsewhere (same results, slower). The feed-forward's second linear runs int8 too
where int8_linear.py's kernel runs on VPDPBUSD, its input quantized per row
(``PER_ROW_LINEARS``). Everything else (embeddings, attention, LayerNorms, that
linear elsewhere, pooling, heads) stays in the model's base dtype: bfloat16 where
the CPU has native bf16, else float32 (``base_dtype``). In a decoder
(``modules/decoder.py``: Qwen, Llama, Mistral embedders and rerankers) the same three
kinds of linear (QKV, attention output, the fused gate and up projection) become
``Int8Linear``s in place; ``down``, whose input is SwiGLU's product, stays in the base
dtype (not measured per row: no real decoder checkpoint is reachable here).

- weights (``INT8_LINEARS``): int8, symmetric, one scale per output channel (the
  largest |w| of the row maps to 127), packed once into oneDNN's layout; bias float32;
- activations: uint8 (7-bit on CPUs without VNNI, ``int8_quantize.activation_max``)
  with one scale and zero point per tensor, either ``static``
  (per-column ranges measured once at load on the calibration texts,
  ``observe_ranges``, with SmoothQuant's per-column factors folded into the
  weights) or ``dynamic`` (each call measures its input's min and max; what runs
  when no calibration tokens are given). The quantization is one native pass
  (int8_quantize.py).
- calls of few rows (a short query's step) go to the native kernel where it runs
  (int8_linear.py: the same quantization and integer products, in one call, with
  the weight's second copy in its layout); oneDNN's per-call cost dominates there.

Knows nothing about batching or attention: the layer calls the ``Attend``
function it is given. CUDA models are never transformed (int8 is CPU only).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from embedserve.engine import int8_linear, int8_quantize
from embedserve.engine.modules import bf16_attention, decoder
from embedserve.engine.modules.bert import Attend, EncoderModel, Layer
from embedserve.engine.onednn import PackedWeight
from embedserve.engine.residual_norm import ResidualNorm

_onednn = torch.ops.onednn
# oneDNN epilogues for the activations the encoder family uses: (post-op, algorithm).
ACTIVATIONS = {"gelu": ("gelu", "none"), "gelu_new": ("gelu", "tanh"),
                "gelu_pytorch_tanh": ("gelu", "tanh"), "relu": ("relu", "")}
ACTIVATION_MODES = ("dynamic", "static")
DEFAULT_ACTIVATIONS = "static"
# Per input column (min, max) over the calibration texts: float32 [in] each.
ChannelRange = tuple[torch.Tensor, torch.Tensor]
# The linears that run int8 with one scale for a call's input. ffn_out does not: its input
# (the GELU output, in about [-0.17, 25] with most values near 0) loses the most at one
# scale per tensor. Measured on MiniLM (probe texts, smallest cosine to float32): all four
# int8 0.984 (0.946 with ffn_out smoothed), ffn_out in bf16 and the rest smoothed 0.998.
INT8_LINEARS = ("qkv", "attn_out", "ffn_in")
# ...so ffn_out runs int8 with a scale per row of its input, where int8_linear's kernel
# takes it (``per_row_runs``), else in the base dtype. XQuAD English (smallest cosine to
# float32; recall@1 float32 -> int8), ffn_out in bf16 against per row: MiniLM 0.99860,
# 88.74 -> 88.91 against 0.99713, 88.74 -> 88.40; multilingual-e5-small 0.99894,
# 93.11 -> 93.28 against 0.99897, 93.11 -> 93.28 (Zen 5; BENCHMARKS.md).
PER_ROW_LINEARS = ("ffn_out",)
# A decoder layer's linears that run int8 (``down`` stays: its input is SwiGLU's product).
DECODER_INT8_LINEARS = ("qkv", "attn_out", "gate_up")
# Which int8 linears divide their input by SmoothQuant's factors (static mode), and alpha.
SMOOTHED = ("qkv", "attn_out", "ffn_in")
SMOOTH_ALPHA = 0.5


def supported() -> bool:
    """Whether this torch build has oneDNN's quantized linear (any x86 CPU runs it)."""
    return (torch.backends.mkldnn.is_available() and hasattr(_onednn, "qlinear_pointwise")
            and hasattr(_onednn, "qlinear_prepack"))


def base_dtype() -> torch.dtype:
    """What the non-linear parts compute in: bfloat16 where oneDNN runs it natively
    (AMX-BF16 / AVX512-BF16), else float32 (bf16 emulated on AVX-512 is slower)."""
    native = torch.ops.mkldnn._is_mkldnn_bf16_supported() and (
        torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())
    return torch.bfloat16 if native else torch.float32


def int8_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight`` [out, in] -> (int8 [out, in], float32 scales [out]): symmetric, per row."""
    weight = weight.detach().float()
    scales = weight.abs().amax(dim=1).clamp_min(1e-12) / 127.0
    quantized = torch.round(weight / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return quantized, scales


class Int8Weight(nn.Module):
    """One linear layer's int8 weight in oneDNN's layout, its scales and float32 bias, and
    how its input becomes uint8: per call (dynamic), or at a fixed range (static), with
    SmoothQuant's per-column factors where ``smooth`` (see ``smoothing_factors``)."""

    multiplier: torch.Tensor
    scales: torch.Tensor
    bias: torch.Tensor
    few_rows_panels: torch.Tensor
    column_sums: torch.Tensor

    def __init__(self, linear: nn.Linear, observed: ChannelRange | None, smooth: bool = False,
                 qmax: int = int8_quantize.FULL_RANGE, few_rows: bool = True, per_row: bool = False) -> None:
        """``few_rows``: keep int8_linear's copy of the weight for calls of few rows (where
        the kernel covers it). ``per_row``: every call on int8_linear's kernel, each row of
        the input quantized on its own range (where ``per_row_runs``; no oneDNN copy)."""
        super().__init__()
        self.qmax = qmax
        weight = linear.weight.detach().float()
        out_features, in_features = weight.shape
        factors = torch.ones(in_features)
        if observed is not None and smooth:
            factors = smoothing_factors(observed, weight)
        quantized, scales = int8_per_channel(weight * factors[None, :])
        self.per_row = per_row
        if per_row:
            assert int8_linear.covers(quantized), "per-row quantization runs on int8_linear's kernel alone"
            few_rows, observed = True, None
        else:
            self.register_buffer("weight", _onednn.qlinear_prepack(quantized, None))
        self.few_rows = few_rows and int8_linear.covers(quantized)
        if self.few_rows:
            self.register_buffer("few_rows_panels", int8_linear.pack_panels(quantized))
            self.register_buffer("column_sums", int8_linear.column_sums(quantized))
        self.register_buffer("scales", scales)
        self.register_buffer("zero_points", torch.zeros(out_features, dtype=torch.int64))
        bias = linear.bias.detach().float() if linear.bias is not None else torch.zeros(out_features)
        self.register_buffer("bias", bias)
        self.static = observed is not None
        self.input_scale, self.input_zero_point = 1.0, 0
        if observed is not None:
            low, high = observed
            self.input_scale, self.input_zero_point = int8_quantize.affine_params(
                float((low / factors).min()), float((high / factors).max()), qmax)
        # x -> x / factor / scale, per column
        self.register_buffer("multiplier", (1.0 / (factors * self.input_scale)).contiguous())

    def quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, float, int]:
        # x: [T, in] float -> uint8 [T, in], scale, zero point
        if self.static:
            return int8_quantize.quantize(x, self.multiplier, self.input_zero_point, self.qmax), \
                self.input_scale, self.input_zero_point
        scale, zero_point = int8_quantize.affine_params(*int8_quantize.value_range(x), self.qmax)
        multiplier = torch.full((x.shape[1],), 1.0 / scale)
        return int8_quantize.quantize(x, multiplier, zero_point, self.qmax), scale, zero_point

    def forward(self, x: torch.Tensor, out_dtype: torch.dtype, attr: str = "none",
                algorithm: str = "") -> torch.Tensor:
        """x: [T, in] bf16 or float32 -> [T, out] in ``out_dtype``, the activation named as
        oneDNN's epilogues are (``attr``/``algorithm``) applied."""
        if self.per_row or (self.few_rows and x.shape[0] <= int8_linear.max_rows() and x.dtype == torch.bfloat16
                            and out_dtype == torch.bfloat16):
            return int8_linear.linear(x.to(torch.bfloat16), *self._kernel_operands(), attr, algorithm).to(out_dtype)
        xq, scale, zero_point = self.quantize(x)
        return _onednn.qlinear_pointwise(xq, scale, zero_point, self.weight, self.scales, self.zero_points,
                                         self.bias, 1.0, 0, out_dtype, attr, [], algorithm)

    def few_rows_call(self, activation: int, helper: bool = False) -> Callable[[int, int, int, int], None] | None:
        """The kernel's call on data pointers for loops with buffers of their own
        (int8_linear.pointer_call; ``activation``: the kernel's code; ``helper``: with
        bf16_linear's helper thread where it can), or None where this weight has no copy for it."""
        return int8_linear.pointer_call(*self._kernel_operands(), activation, helper) if self.few_rows else None

    def _kernel_operands(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                        torch.Tensor | None, float, int, int, bool]:
        # int8_linear's weight and quantization arguments (no multiplier: dynamic)
        return (self.few_rows_panels, self.column_sums, self.scales, self.bias,
                self.multiplier if self.static else None, self.input_scale, self.input_zero_point, self.qmax,
                self.per_row)


def smoothing_factors(observed: ChannelRange, weight: torch.Tensor, alpha: float = SMOOTH_ALPHA) -> torch.Tensor:
    """SmoothQuant's per-input-column factors s = max|x|^alpha / max|w|^(1 - alpha): the
    activation is divided by s and the weight's column multiplied by it (the product is
    unchanged), moving a column's outliers from the per-tensor activation scale into
    the weight's per-row scales. float32 [in]."""
    low, high = observed
    x_max = torch.maximum(low.abs(), high.abs()).clamp_min(1e-5)
    w_max = weight.abs().amax(dim=0).clamp_min(1e-5)
    return (x_max.pow(alpha) / w_max.pow(1.0 - alpha)).clamp_min(1e-5)


def per_row_runs(linear: nn.Linear) -> bool:
    """Whether an encoder's second feed-forward linear runs int8, each row of its input (the
    GELU output) quantized on its own range (``PER_ROW_LINEARS``): where int8_linear's kernel
    runs on VPDPBUSD and covers the shape. Not on AMX tiles: there oneDNN's bf16 matmul
    takes large steps, and the kernel's tiles were not measured against it."""
    return not int8_linear.tiles_available() and int8_linear.covers_shape(*linear.weight.shape)


def int8_attention_runs(modules: Iterable[nn.Module]) -> bool:
    """Whether the int8 layers among ``modules`` (a model's ``modules()``, or its layers) take
    attention's products in int8, as ``Int8Layer.forward`` asks: every one with
    ``int8_attention`` on, in bf16 and of a head size the native kernel covers, where it has
    int8 products (bf16_attention.int8_products_available: VPDPBUSD, not AMX tiles)."""
    layers = [module for module in modules if isinstance(module, Int8Layer)]
    return (bool(layers) and bf16_attention.int8_products_available()
            and all(layer.int8_attention and layer.dtype == torch.bfloat16
                    and layer.head_dim in bf16_attention.HEAD_SIZES for layer in layers))


class Int8Layer(nn.Module):
    """encoder.Layer's math (post-norm) on int8 linears; activations between them in the
    layer's base dtype (bf16 or float32)."""

    def __init__(self, layer: Layer, hidden_act: str, ranges: dict[str, ChannelRange] | None,
                 qmax: int = int8_quantize.FULL_RANGE, few_rows: bool = True) -> None:
        super().__init__()
        self.num_heads = layer.num_heads
        self.head_dim = layer.head_dim
        self.dtype = layer.qkv.weight.dtype
        self.qkv, self.attn_out, self.ffn_in = (
            Int8Weight(getattr(layer, name), None if ranges is None else ranges[name], name in SMOOTHED, qmax,
                       few_rows)
            for name in INT8_LINEARS)
        # int8 with each row's own range where ``per_row_runs``; else the base dtype, on oneDNN
        # or a native kernel (calls of few rows on AMX as FusedLayer's)
        self.ffn_out: Int8Weight | PackedWeight = (
            Int8Weight(layer.ffn_out, None, qmax=qmax, per_row=True) if per_row_runs(layer.ffn_out)
            else PackedWeight(layer.ffn_out, few_rows=True))
        self.attn_norm = ResidualNorm(layer.attn_norm)
        self.ffn_norm = ResidualNorm(layer.ffn_norm)
        self.activation = ACTIVATIONS[hidden_act]
        # attention's two products in int8 too, where the native kernel has them
        # (bf16_attention.int8_products_available); False: bf16 (bench A/B)
        self.int8_attention = True

    def forward(self, x: torch.Tensor, attend: Attend) -> torch.Tensor:
        # x: [T, hidden]
        tokens = x.shape[0]
        qkv = self.qkv(x, self.dtype).view(tokens, 3, self.num_heads, self.head_dim)   # [T, 3, heads, hd]
        context = attend(qkv[:, 0], qkv[:, 1], qkv[:, 2], quantized=self.int8_attention)   # [T, heads, hd]
        x = self.attn_norm(self.attn_out(context.reshape(tokens, -1).contiguous(), self.dtype), x)
        hidden = self.ffn_in(x, self.dtype, *self.activation)                        # [T, intermediate]
        out = (self.ffn_out(hidden, self.dtype) if isinstance(self.ffn_out, Int8Weight)
               else self.ffn_out(hidden))                                              # [T, hidden]
        return self.ffn_norm(out, x)


class Int8Linear(nn.Module):
    """An ``Int8Weight`` in an ``nn.Linear``'s place, for layers that call their linears as
    modules (the decoder's): [..., in] -> [..., out] in ``dtype``, the layer's."""

    def __init__(self, weight: Int8Weight, dtype: torch.dtype) -> None:
        super().__init__()
        self.int8 = weight
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.int8(x.reshape(-1, x.shape[-1]), self.dtype).reshape(*x.shape[:-1], -1)


def quantizable_layers(model: nn.Module) -> tuple[nn.ModuleList, tuple[str, ...]] | None:
    """The layers whose linears ``--dtype int8`` quantizes and their names: an encoder's
    (``INT8_LINEARS``) or a decoder's (``DECODER_INT8_LINEARS``); None for other families."""
    if isinstance(model, EncoderModel) and model.config.hidden_act in ACTIVATIONS:
        return model.encoder.layers, INT8_LINEARS
    if isinstance(model, decoder.DecoderModel):
        return model.layers, DECODER_INT8_LINEARS
    return None


def observe_ranges(model: nn.Module, run: Callable[[], object]) -> list[dict[str, ChannelRange]]:
    """Each layer's int8 linears' input (min, max) per column over what ``run`` computes with
    ``model`` (an encoder or decoder of ``quantizable_layers``; plain modules, before they are
    quantized)."""
    found = quantizable_layers(model)
    assert found is not None, "a model with int8 layers"
    layers, names = found
    ranges: list[dict[str, ChannelRange]] = [{} for _ in layers]
    hooks = []
    for index, layer in enumerate(layers):
        for name in names:
            def observe(_module: nn.Module, inputs: tuple[torch.Tensor, ...], _output: object,
                        seen: dict[str, ChannelRange] = ranges[index], key: str = name) -> None:
                low, high = torch.aminmax(inputs[0].detach().float().reshape(-1, inputs[0].shape[-1]), dim=0)
                old = seen.get(key, (low, high))
                seen[key] = (torch.minimum(old[0], low), torch.maximum(old[1], high))
            hooks.append(getattr(layer, name).register_forward_hook(observe))
    try:
        run()
    finally:
        for hook in hooks:
            hook.remove()
    return ranges


def quantize_layers(model: EncoderModel, ranges: Iterable[dict[str, ChannelRange]] | None = None,
                    qmax: int | None = None) -> bool:
    """Swap the encoder's layers for Int8Layers in place; False (unchanged) if unsupported.

    Call with the model in its base dtype on the CPU. ``ranges`` (static activations): per
    layer, each linear's input range (``observe_ranges``); None: dynamic activations.
    ``qmax``: the activations' largest level (None: ``int8_quantize.activation_max()``).
    """
    qmax = int8_quantize.activation_max() if qmax is None else qmax
    config = model.config
    if config.hidden_act not in ACTIVATIONS or not supported():
        return False
    layers = model.encoder.layers
    per_layer = list(ranges) if ranges is not None else [None] * len(layers)
    few_rows = int8_linear.copy_fits(_weight_elements(layers, INT8_LINEARS))
    for i, layer in enumerate(layers):
        assert isinstance(layer, Layer)
        layers[i] = Int8Layer(layer, config.hidden_act, per_layer[i], qmax, few_rows)
    return True


def quantize_decoder_layers(model: decoder.DecoderModel,
                            ranges: Iterable[dict[str, ChannelRange]] | None = None,
                            qmax: int | None = None) -> bool:
    """``quantize_layers`` for a decoder: each layer's ``DECODER_INT8_LINEARS`` become
    ``Int8Linear``s in place (smoothed where ``ranges`` are given); False if unsupported."""
    qmax = int8_quantize.activation_max() if qmax is None else qmax
    if not supported():
        return False
    layers = model.layers
    per_layer = list(ranges) if ranges is not None else [None] * len(layers)
    few_rows = int8_linear.copy_fits(_weight_elements(layers, DECODER_INT8_LINEARS))
    for layer, observed in zip(layers, per_layer, strict=True):
        for name in DECODER_INT8_LINEARS:
            linear = getattr(layer, name)
            weight = Int8Weight(linear, None if observed is None else observed[name], observed is not None, qmax,
                                few_rows)
            setattr(layer, name, Int8Linear(weight, linear.weight.dtype))
    return True


def _weight_elements(layers: nn.ModuleList, names: tuple[str, ...]) -> int:
    # the weights the named linears of every layer hold: their int8 bytes
    return sum(getattr(layer, name).weight.numel() for layer in layers for name in names)
