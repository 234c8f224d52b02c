"""The int8 encoder layer's formulas, in plain torch: the one definition the other implementations are held to.

Per-token int8 (see kernels.quantize): each row of a Linear layer's input is quantized with a scale of its own, the
weights with one scale per output column, the product runs in integers, and dequantization applies both scales.
A layer's input may be quantized to 12 bits instead of 8 (`Dense.input_bits`; the feed-forward output layer's, in a
late-interaction model): the same formulas with 2,047 steps a side instead of 127, the weights still int8.
Three implementations compute these steps: this file (where numba is missing), the numba kernels
(kernels/int8_numba.py) and the C layer (kernels/c/int8_layer_body.c). All three do the same float32 operations in the
same order, with the same rounding, so they give the same bits (tests/kernels/test_int8_steps.py and
test_int8_layer.py check it); the products are exact integers on every path. Attention is not among these steps:
it is float32 attention (torch's, or kernels.attention's C kernel, which agree to float rounding).

The formulas, for one row (float32 unless said):
- quantize x with the input scale s (SmoothQuant's 1 / smoothing; ones without) to S = 127 steps a side (2,047 at
  12 bits): b = x * s; top = max(max |b|, 1e-8); v = b * (S / top); q = trunc(v + 0.5) for v >= 0, trunc(v - 0.5)
  below (half away from zero); scale = top / S.
- dequantize the int32 product p with the row's scale r and the column's c: p * (r * c) + bias.
- GELU, exact (erf): v = dequantized; erf(|v| / sqrt 2) by Abramowitz & Stegun 7.1.28 (|error| <= 3e-7), its
  argument capped at 5.5 where erf is 1 in float32; GELU(v) = 0.5 * (v + |v| * erf), times the next layer's input
  scale, then quantized as above.
- residual and LayerNorm: v = (dequantized + residual); mean and variance in float64, each a sum of eight
  interleaved partial sums (column j goes to sum j mod 8; the last cols mod 8 columns summed first, then the eight
  added in order), which keeps them exact to float64 rounding and lets C sum in one vector register;
  out = (v - float(mean)) * float(1 / sqrt(variance + eps)) * weight + bias.

Python scalars never divide a tensor here: torch computes `127.0 / t` as reciprocal(t) * 127, two roundings.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

ROW_FLOOR = 1e-8  # the largest |x| an all-zero row is given, so that nothing divides by zero
INPUT_BITS = (8, 12)  # what a layer's input may be quantized to: int8, or 12 bits held in int16
# erf(t) = 1 - (1 + a1 t + ... + a6 t^6)^-16 for t >= 0 (Abramowitz & Stegun 7.1.28)
ERF_COEFFICIENTS = (0.0705230784, 0.0422820123, 0.0092705272, 0.0001520143, 0.0002765672, 0.0000430638)
ERF_ARGUMENT_CAP = 5.5
INVERSE_SQRT_2 = 0.7071067811865476
PARTIAL_SUMS = 8


def steps(bits: int) -> float:
    """The largest magnitude a `bits`-bit input is quantized to: 127 for int8, 2,047 for 12 bits."""
    if bits not in INPUT_BITS:
        raise ValueError(f"an int8 layer's input is quantized to one of {INPUT_BITS} bits, not {bits}")
    return float(2 ** (bits - 1) - 1)


def values_dtype(bits: int) -> torch.dtype:
    """What holds a `bits`-bit quantized input."""
    return torch.int8 if bits == 8 else torch.int16


def quantize_smoothed(buffer: torch.Tensor, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows already multiplied by their input scale, (rows, cols) float32 -> (values, (rows,) float32 scales): int8
    values, or 12-bit ones in int16."""
    most = steps(bits)
    top = buffer.abs().amax(dim=1).clamp(min=ROW_FLOOR)
    to_int = torch.div(torch.full_like(top, most), top)
    v = buffer * to_int[:, None]
    values = torch.trunc(v + torch.where(v >= 0, 0.5, -0.5).to(v.dtype)).to(values_dtype(bits))
    return values, torch.div(top, most)


def quantize_rows(x: torch.Tensor, input_scale: torch.Tensor, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) float32 -> the quantized rows of x * input_scale and their scales."""
    return quantize_smoothed(x.float() * input_scale, bits)


def products(values: torch.Tensor, weight_t: torch.Tensor) -> torch.Tensor:
    """(rows, k) int8 or 12-bit int16 times (k, n) int8 -> (rows, n) int32, exactly (float64 holds every such sum:
    1,536 x 2,047 x 128 < 2^29)."""
    return (values.double() @ weight_t.double()).to(torch.int32)


def dequantize(products: torch.Tensor, row_scale: torch.Tensor, column_scale: torch.Tensor,
               bias: torch.Tensor) -> torch.Tensor:
    """(rows, cols) int32 -> float32: p * (r * c) + bias. `products` may carry extra (padding) rows."""
    rows = row_scale.shape[0]
    return products[:rows].float() * (row_scale[:, None] * column_scale) + bias


def gelu(v: torch.Tensor) -> torch.Tensor:
    """Exact GELU, erf by Abramowitz & Stegun 7.1.28, in the order the kernels evaluate it."""
    t = (v.abs() * INVERSE_SQRT_2).clamp(max=ERF_ARGUMENT_CAP)
    a1, a2, a3, a4, a5, a6 = ERF_COEFFICIENTS
    p = 1.0 + t * (a1 + t * (a2 + t * (a3 + t * (a4 + t * (a5 + t * a6)))))
    p2 = p * p
    p4 = p2 * p2
    p8 = p4 * p4
    erf = 1.0 - torch.div(torch.ones_like(p8), p8 * p8)
    return 0.5 * (v + v.abs() * erf)


def dequantize_gelu_quantize(products: torch.Tensor, row_scale: torch.Tensor, column_scale: torch.Tensor,
                             bias: torch.Tensor, next_input_scale: torch.Tensor,
                             next_input_bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """GELU of the dequantized products, times the next layer's input scale, quantized per row to its bits."""
    return quantize_smoothed(gelu(dequantize(products, row_scale, column_scale, bias)) * next_input_scale,
                             next_input_bits)


def row_sums(values: torch.Tensor) -> torch.Tensor:
    """(rows, cols) float64 -> (rows,) sums in the kernels' order: eight interleaved partial sums (cumsum adds in
    order), the last cols mod 8 columns first, then the eight partials one after another."""
    rows, cols = values.shape
    whole = cols // PARTIAL_SUMS * PARTIAL_SUMS
    total = values.new_zeros(rows)
    for j in range(whole, cols):
        total = total + values[:, j]
    if whole:
        partials = values[:, :whole].reshape(rows, -1, PARTIAL_SUMS).cumsum(dim=1)[:, -1]
        for u in range(PARTIAL_SUMS):
            total = total + partials[:, u]
    return total


def residual_norm(summed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm of (rows, cols) float32 rows, its statistics in float64 (`row_sums`)."""
    cols = summed.shape[1]
    wide = summed.double()
    mean = row_sums(wide) / cols
    deviation = wide - mean[:, None]
    variance = row_sums(deviation * deviation) / cols
    inverse = torch.div(torch.ones_like(variance), torch.sqrt(variance + eps)).float()
    return (summed - mean.float()[:, None]) * inverse[:, None] * weight + bias


def dequantize_residual_norm(products: torch.Tensor, row_scale: torch.Tensor, column_scale: torch.Tensor,
                             bias: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                             norm_bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm(dequantized products + residual), `residual` (rows, cols) float32: a BERT sublayer's output."""
    summed = dequantize(products, row_scale, column_scale, bias) + residual.float()
    return residual_norm(summed, norm_weight, norm_bias, eps)


@dataclass(frozen=True)
class Dense:
    """An int8 Linear layer's constants: y = dequantize(quantize(x * input_scale) @ weight_t) + bias."""

    weight_t: torch.Tensor  # (in, out) int8
    weight_scale: torch.Tensor  # (out,) float32
    bias: torch.Tensor  # (out,) float32
    input_scale: torch.Tensor  # (in,) float32
    input_bits: int = 8  # what the input is quantized to (INPUT_BITS)

    @property
    def in_features(self) -> int:
        return self.weight_t.shape[0]

    @property
    def out_features(self) -> int:
        return self.weight_t.shape[1]


@dataclass(frozen=True)
class Norm:
    weight: torch.Tensor  # (hidden,) float32
    bias: torch.Tensor
    eps: float


@dataclass(frozen=True)
class Layer:
    """One int8 encoder layer of BERT (post-LN): its four int8 products, its two LayerNorms, its heads."""

    qkv: Dense
    attention_output: Dense
    expand: Dense
    contract: Dense
    norm1: Norm
    norm2: Norm
    heads: int
    head_dim: int


# (N, 3H) float32 query | key | value of packed sequences, their (start, length) spans, heads, head size -> (N, H)
Attention = Callable[[torch.Tensor, Sequence[tuple[int, int]], int, int], torch.Tensor]


def sdpa_each(qkv: torch.Tensor, spans: Sequence[tuple[int, int]], heads: int, head_dim: int) -> torch.Tensor:
    """torch's attention, one sequence at a time, each attending to itself alone."""
    out = qkv.new_empty(qkv.shape[0], heads * head_dim)
    for start, length in spans:
        q, k, v = qkv[start:start + length].view(1, length, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
        attended = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        out[start:start + length] = attended.transpose(1, 2).reshape(length, -1)
    return out


def linear(dense: Dense, x: torch.Tensor) -> torch.Tensor:
    values, scale = quantize_rows(x, dense.input_scale, dense.input_bits)
    return dequantize(products(values, dense.weight_t), scale, dense.weight_scale, dense.bias)


def layer_forward(layer: Layer, x: torch.Tensor, spans: Sequence[tuple[int, int]],
                  attend: Attention = sdpa_each) -> torch.Tensor:
    """The layer applied to packed float32 rows x (N, hidden), the sequences at `spans`, attention by `attend`."""
    qkv = linear(layer.qkv, x)
    attended = attend(qkv, spans, layer.heads, layer.head_dim)
    dense = layer.attention_output
    values, scale = quantize_rows(attended, dense.input_scale, dense.input_bits)
    middle = dequantize_residual_norm(products(values, dense.weight_t), scale, dense.weight_scale, dense.bias, x,
                                      layer.norm1.weight, layer.norm1.bias, layer.norm1.eps)
    expand, contract = layer.expand, layer.contract
    values, scale = quantize_rows(middle, expand.input_scale, expand.input_bits)
    values, scale = dequantize_gelu_quantize(products(values, expand.weight_t), scale, expand.weight_scale,
                                             expand.bias, contract.input_scale, contract.input_bits)
    return dequantize_residual_norm(products(values, contract.weight_t), scale, contract.weight_scale, contract.bias,
                                    middle, layer.norm2.weight, layer.norm2.bias, layer.norm2.eps)
