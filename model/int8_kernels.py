"""Fused CPU kernels around the int8 matrix product, compiled at first use by numba (LLVM, for this CPU).

In eager PyTorch each step of an int8 layer is its own pass over memory: quantizing an input row by row
takes five (smoothing multiply, row max and min, scale, round, cast) and dequantizing an output four
(cast, row scale, column scale, bias); the feed-forward's GELU and the next layer's quantization add
six more over its widest tensor, and each sublayer's residual add and LayerNorm three more. These kernels do
each group in one pass, a row at a time while the row is in L1, so the only full-size float tensors left are the
ones the model itself needs. On all-MiniLM-L6-v2 the int8 encoder runs 15-20% faster this way on one core
(BENCHMARKS.md, "Fused int8 kernels"); fusing each sublayer's residual add and LayerNorm gained up to 5% more
at 32 sentences a batch and nothing measurable at 1-4 ("One query at a time on a CPU").

Rounding is half away from zero (eager `torch.round` rounds half to even; a tie needs an exact .5 after
scaling, and either choice is within the quantization's own error). GELU is the exact (erf) one, erf by
Abramowitz & Stegun 7.1.28 (|error| <= 3e-7).

Without numba, `AVAILABLE` is False and `model.quantize.Int8Linear` keeps its eager path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

try:
    from numba import njit
except ImportError:  # the eager path serves; nothing here is called
    AVAILABLE = False
else:
    AVAILABLE = True

MIN_ROWS = 17  # torch._int_mm wants more than 16 rows; quantized inputs carry zero rows up to this


@dataclass
class QuantizedRows:
    """An activation quantized per row: `values` (max(rows, 17), cols) int8, `scale` (rows,) float32 with
    activation ~= values * scale[:, None]; `shape` the leading dims it came in with; `dtype` its type."""

    values: torch.Tensor
    scale: torch.Tensor
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def rows(self) -> int:
        return self.scale.shape[0]


def _int8_rows(rows: int, cols: int) -> torch.Tensor:
    if rows < MIN_ROWS:
        return torch.zeros(MIN_ROWS, cols, dtype=torch.int8)  # the padding rows must be zero (they are multiplied)
    return torch.empty(rows, cols, dtype=torch.int8)


Vector = torch.Tensor | np.ndarray  # a layer's float32 constants; layers pass numpy views, one conversion fewer a call


def _array(vector: Vector) -> np.ndarray:
    return vector if isinstance(vector, np.ndarray) else vector.numpy()


def quantize_rows(x: torch.Tensor, inverse_smoothing: Vector) -> QuantizedRows:
    """x (..., cols) float32 or bfloat16 -> int8 rows of x * inverse_smoothing, one scale per row (max |.| / 127)."""
    flat = x.detach().reshape(-1, x.shape[-1]).float().contiguous()  # int8 layers are inference-only
    rows, cols = flat.shape
    values, scale = _int8_rows(rows, cols), torch.empty(rows)
    _quantize_rows(flat.numpy(), _array(inverse_smoothing), values.numpy(), scale.numpy(), np.empty(cols, np.float32))
    return QuantizedRows(values, scale, tuple(x.shape[:-1]), x.dtype)


def dequantize(products: torch.Tensor, rows: QuantizedRows, column_scale: Vector, bias: Vector) -> torch.Tensor:
    """int32 (>= rows, cols) products of `rows` and int8 weights -> float32 (rows, cols), scaled, plus bias."""
    out = torch.empty(rows.rows, products.shape[1])
    _dequantize(products.numpy(), rows.scale.numpy(), _array(column_scale), _array(bias), out.numpy())
    return out


def dequantize_gelu_quantize(products: torch.Tensor, rows: QuantizedRows, column_scale: Vector, bias: Vector,
                             next_inverse_smoothing: Vector) -> QuantizedRows:
    """GELU(dequantized products + bias), quantized per row for the next int8 layer (times its smoothing),
    without writing the float activation anywhere."""
    count, cols = rows.rows, products.shape[1]
    values, scale = _int8_rows(count, cols), torch.empty(count)
    _dequantize_gelu_quantize(products.numpy(), rows.scale.numpy(), _array(column_scale), _array(bias),
                              _array(next_inverse_smoothing), values.numpy(), scale.numpy(), np.empty(cols, np.float32))
    return QuantizedRows(values, scale, rows.shape, rows.dtype)


def dequantize_residual_norm(products: torch.Tensor, rows: QuantizedRows, column_scale: Vector, bias: Vector,
                             residual: torch.Tensor, norm_weight: Vector, norm_bias: Vector,
                             eps: float) -> torch.Tensor:
    """LayerNorm(dequantized products + bias + residual): a BERT sublayer's output (post-LN) in one pass per row,
    where eager PyTorch makes three (dequantize, add, normalize). `residual` has the rows' leading shape; the
    result has the residual's shape and type. Mean and variance accumulate in float64, two passes over the row
    (it is in L1), so a row far from zero mean loses no digits."""
    dtype = residual.dtype
    flat = residual.detach().reshape(rows.rows, -1).float().contiguous()
    out = torch.empty_like(flat)
    _dequantize_residual_norm(products.numpy(), rows.scale.numpy(), _array(column_scale), _array(bias),
                              flat.numpy(), _array(norm_weight), _array(norm_bias), np.float64(eps), out.numpy())
    return out.reshape(residual.shape).to(dtype)


if AVAILABLE:
    # fastmath lets LLVM vectorize and fuse multiply-adds; error_model="numpy" drops Python's
    # division-by-zero checks, which would keep loops scalar. fastmath also promises no inf or NaN, so
    # the kernels never make one on finite input (GELU's polynomial is evaluated on a clamped argument).
    # The row maximum is taken on the floats' bit patterns with the sign bit cleared: for finite
    # non-negative floats the integer order is the float order, and LLVM vectorizes an integer max
    # where it leaves a float one scalar (0.11 vs 0.50 ms for 600 x 1536).
    _JIT = dict(nogil=True, fastmath=True, error_model="numpy")

    def _compiled(function):
        """Compiled at first call, kept on disk for the next start (NUMBA_CACHE_DIR, else next to this file
        or in the user's cache); where nothing is writable, compiled again at every start (about 1 s each)."""
        try:
            return njit(cache=True, **_JIT)(function)
        except RuntimeError:  # numba: "cannot cache function ...: no locator available"
            return njit(**_JIT)(function)

    @_compiled
    def _quantize_buffer(buffer, values_row):
        """Quantize one float32 row (already smoothed) into `values_row`; returns its scale."""
        bits = buffer.view(np.int32)
        largest = np.int32(0)
        for j in range(buffer.shape[0]):
            largest = max(largest, bits[j] & np.int32(0x7FFFFFFF))
        # Back to a float through a one-element array: a scratch array made once per call and passed in
        # measured slower (0.074-0.083 vs 0.069-0.071 ms for 600 x 384, three runs each).
        top = max(np.array([largest], np.int32).view(np.float32)[0], np.float32(1e-8))
        to_int = np.float32(127.0) / top
        for j in range(buffer.shape[0]):
            v = buffer[j] * to_int
            values_row[j] = np.int8(v + (np.float32(0.5) if v >= 0 else np.float32(-0.5)))
        return top / np.float32(127.0)

    @_compiled
    def _quantize_rows(x, inverse_smoothing, values, scale, buffer):
        for i in range(x.shape[0]):
            for j in range(x.shape[1]):
                buffer[j] = x[i, j] * inverse_smoothing[j]
            scale[i] = _quantize_buffer(buffer, values[i])

    @_compiled
    def _dequantize(products, row_scale, column_scale, bias, out):
        for i in range(out.shape[0]):
            r = row_scale[i]
            for j in range(out.shape[1]):
                out[i, j] = np.float32(products[i, j]) * (r * column_scale[j]) + bias[j]

    @_compiled
    def _dequantize_gelu_quantize(products, row_scale, column_scale, bias, next_inverse_smoothing, values, scale,
                                  buffer):
        for i in range(row_scale.shape[0]):
            r = row_scale[i]
            for j in range(products.shape[1]):
                v = np.float32(products[i, j]) * (r * column_scale[j]) + bias[j]
                # GELU(v) = v/2 (1 + erf(v / sqrt 2)) = (v + |v| erf(|v| / sqrt 2)) / 2; erf(t) for t >= 0 as
                # 1 - (1 + a1 t + ... + a6 t^6)^-16; erf(5.5) is 1 in float32, so t stops there.
                t = min(abs(v) * np.float32(0.7071067811865476), np.float32(5.5))
                p = np.float32(1.0) + t * (np.float32(0.0705230784) + t * (np.float32(0.0422820123) + t * (
                    np.float32(0.0092705272) + t * (np.float32(0.0001520143) + t * (
                        np.float32(0.0002765672) + t * np.float32(0.0000430638))))))
                p2 = p * p
                p4 = p2 * p2
                p8 = p4 * p4
                erf = np.float32(1.0) - np.float32(1.0) / (p8 * p8)
                buffer[j] = np.float32(0.5) * (v + abs(v) * erf) * next_inverse_smoothing[j]
            scale[i] = _quantize_buffer(buffer, values[i])

    @_compiled
    def _dequantize_residual_norm(products, row_scale, column_scale, bias, residual, norm_weight, norm_bias, eps,
                                  out):
        cols = out.shape[1]
        for i in range(out.shape[0]):
            r = row_scale[i]
            total = 0.0  # float64: the row's sum and squared deviations
            for j in range(cols):
                v = np.float32(products[i, j]) * (r * column_scale[j]) + bias[j] + residual[i, j]
                out[i, j] = v
                total += v
            mean = total / cols
            spread = 0.0
            for j in range(cols):
                d = out[i, j] - mean
                spread += d * d
            inverse = np.float32(1.0 / np.sqrt(spread / cols + eps))
            shift = np.float32(mean)
            for j in range(cols):
                out[i, j] = (out[i, j] - shift) * inverse * norm_weight[j] + norm_bias[j]
