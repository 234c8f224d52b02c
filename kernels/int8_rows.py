"""The int8 layers' row-wise steps as the modules call them: numba's fused kernels where numba is installed, else the
reference formulas in torch; the two give the same bits (kernels/int8_reference.py says what they compute).

Activations travel between steps as `QuantizedRows`, so that a step whose output only the next int8 product reads
(the feed-forward's GELU) never writes the float activation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kernels import int8_numba, int8_reference

USE_NUMBA = int8_numba.AVAILABLE
MIN_ROWS = 17  # torch._int_mm wants more than 16 rows; numba's quantized rows carry zero rows up to this


@dataclass
class QuantizedRows:
    """An activation quantized per row: `values` (at least rows, cols) int8, or int16 holding 12 bits, `scale`
    (rows,) float32 with activation ~= values * scale[:, None]; `shape` the leading dims it came in with; `dtype` its
    type. Rows of `values` past `rows` are zero."""

    values: torch.Tensor
    scale: torch.Tensor
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def rows(self) -> int:
        return self.scale.shape[0]


Vector = torch.Tensor | np.ndarray  # a layer's float32 constants; layers pass numpy views, one conversion fewer a call


def _array(vector: Vector) -> np.ndarray:
    return vector if isinstance(vector, np.ndarray) else vector.numpy()


def _tensor(vector: Vector) -> torch.Tensor:
    return torch.from_numpy(vector) if isinstance(vector, np.ndarray) else vector


def _value_rows(rows: int, cols: int, bits: int) -> torch.Tensor:
    dtype = int8_reference.values_dtype(bits)
    if rows < MIN_ROWS:
        return torch.zeros(MIN_ROWS, cols, dtype=dtype)  # the padding rows must be zero (they are multiplied)
    return torch.empty(rows, cols, dtype=dtype)


def quantize_rows(x: torch.Tensor, input_scale: Vector, bits: int = 8) -> QuantizedRows:
    """x (..., cols) float32 or bfloat16 -> `bits`-bit rows of x * input_scale, one scale per row."""
    flat = x.detach().reshape(-1, x.shape[-1]).float().contiguous()  # int8 layers are inference-only
    if not USE_NUMBA:
        values, scale = int8_reference.quantize_rows(flat, _tensor(input_scale), bits)
        return QuantizedRows(values, scale, tuple(x.shape[:-1]), x.dtype)
    rows, cols = flat.shape
    values, scale = _value_rows(rows, cols, bits), torch.empty(rows)
    int8_numba.quantize_rows(flat.numpy(), _array(input_scale), values.numpy(), scale.numpy(),
                             np.empty(cols, np.float32), np.float32(int8_reference.steps(bits)))
    return QuantizedRows(values, scale, tuple(x.shape[:-1]), x.dtype)


def dequantize(products: torch.Tensor, rows: QuantizedRows, column_scale: Vector, bias: Vector) -> torch.Tensor:
    """int32 (>= rows, cols) products of `rows` and int8 weights -> float32 (rows, cols), scaled, plus bias."""
    if not USE_NUMBA:
        return int8_reference.dequantize(products, rows.scale, _tensor(column_scale), _tensor(bias))
    out = torch.empty(rows.rows, products.shape[1])
    int8_numba.dequantize(products.numpy(), rows.scale.numpy(), _array(column_scale), _array(bias), out.numpy())
    return out


def dequantize_gelu_quantize(products: torch.Tensor, rows: QuantizedRows, column_scale: Vector, bias: Vector,
                             next_input_scale: Vector, next_input_bits: int = 8) -> QuantizedRows:
    """GELU(dequantized products + bias), quantized per row for the next int8 layer (times its input scale, to its
    input's bits), without writing the float activation anywhere."""
    if not USE_NUMBA:
        values, scale = int8_reference.dequantize_gelu_quantize(products, rows.scale, _tensor(column_scale),
                                                                _tensor(bias), _tensor(next_input_scale),
                                                                next_input_bits)
        return QuantizedRows(values, scale, rows.shape, rows.dtype)
    count, cols = rows.rows, products.shape[1]
    values, scale = _value_rows(count, cols, next_input_bits), torch.empty(count)
    int8_numba.dequantize_gelu_quantize(products.numpy(), rows.scale.numpy(), _array(column_scale), _array(bias),
                                        _array(next_input_scale), values.numpy(), scale.numpy(),
                                        np.empty(cols, np.float32), np.float32(int8_reference.steps(next_input_bits)))
    return QuantizedRows(values, scale, rows.shape, rows.dtype)


def dequantize_residual_norm(products: torch.Tensor, rows: QuantizedRows, column_scale: Vector, bias: Vector,
                             residual: torch.Tensor, norm_weight: Vector, norm_bias: Vector,
                             eps: float) -> torch.Tensor:
    """LayerNorm(dequantized products + bias + residual): a BERT sublayer's output (post-LN) in one pass per row,
    where eager PyTorch makes three (dequantize, add, normalize). `residual` has the rows' leading shape; the
    result has the residual's shape and type."""
    dtype = residual.dtype
    flat = residual.detach().reshape(rows.rows, -1).float().contiguous()
    if not USE_NUMBA:
        out = int8_reference.dequantize_residual_norm(products, rows.scale, _tensor(column_scale), _tensor(bias), flat,
                                                      _tensor(norm_weight), _tensor(norm_bias), eps)
    else:
        out = torch.empty_like(flat)
        int8_numba.dequantize_residual_norm(products.numpy(), rows.scale.numpy(), _array(column_scale),
                                            _array(bias), flat.numpy(), _array(norm_weight), _array(norm_bias),
                                            np.float64(eps), out.numpy())
    return out.reshape(residual.shape).to(dtype)
