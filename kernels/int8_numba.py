"""The int8 layers' row-wise steps as CPU kernels compiled at first use by numba (LLVM, for this CPU): the modules'
path where the C layer does not run (a CPU without AVX512-VNNI, selected rows for the heads).

In eager PyTorch each step of an int8 layer is its own pass over memory: quantizing an input row by row
takes five (smoothing multiply, row max and min, scale, round, cast) and dequantizing an output four
(cast, row scale, column scale, bias); the feed-forward's GELU and the next layer's quantization add
six more over its widest tensor, and each sublayer's residual add and LayerNorm three more. These kernels do
each group in one pass, a row at a time while the row is in L1, so the only full-size float tensors left are the
ones the model itself needs.

Each computes kernels/int8_reference.py's formula, operation for operation, and gives its bits: LLVM may vectorize
but not reorder or fuse float operations (no fastmath beyond "no NaN or inf", which these finite inputs keep), and
sums go in the reference's eight interleaved partial sums. Without numba, `AVAILABLE` is False and
kernels.int8_rows runs the reference itself.
"""

from __future__ import annotations

import numpy as np

try:
    from numba import njit
except ImportError:  # the reference serves; nothing here is called
    AVAILABLE = False
else:
    AVAILABLE = True


if AVAILABLE:
    # "nnan" and "ninf" only: contracting a multiply and an add into one rounding, reassociating a sum or replacing
    # a division by a reciprocal would each change bits. error_model="numpy" drops Python's division-by-zero
    # checks, which would keep loops scalar. The row maximum is taken on the floats' bit patterns with the sign bit
    # cleared: for finite non-negative floats the integer order is the float order, and LLVM vectorizes an integer
    # max where it leaves a float one scalar.
    _JIT = dict(nogil=True, fastmath={"nnan", "ninf"}, error_model="numpy")

    def _compiled(function):
        """Compiled at first call, kept on disk for the next start (NUMBA_CACHE_DIR, else next to this file
        or in the user's cache); where nothing is writable, compiled again at every start (about 1 s each)."""
        try:
            return njit(cache=True, **_JIT)(function)
        except RuntimeError:  # numba: "cannot cache function ...: no locator available"
            return njit(**_JIT)(function)

    @_compiled
    def _quantize_buffer(buffer, values_row, steps):
        """Quantize one float32 row (already smoothed) to `steps` a side (float32: 127 for int8, 2,047 for 12 bits)
        into `values_row` (int8, or int16 for 12 bits); returns its scale."""
        bits = buffer.view(np.int32)
        largest = np.int32(0)
        for j in range(buffer.shape[0]):
            largest = max(largest, bits[j] & np.int32(0x7FFFFFFF))
        # Back to a float through a one-element array: a scratch array made once per call and passed in
        # measured slower.
        top = max(np.array([largest], np.int32).view(np.float32)[0], np.float32(1e-8))
        to_int = steps / top
        for j in range(buffer.shape[0]):
            v = buffer[j] * to_int
            # (truncated to an int32, then narrowed: exact, the value fits the row's type)
            values_row[j] = np.int32(v + (np.float32(0.5) if v >= 0 else np.float32(-0.5)))
        return top / steps

    @_compiled
    def quantize_rows(x, input_scale, values, scale, buffer, steps):
        for i in range(x.shape[0]):
            for j in range(x.shape[1]):
                buffer[j] = x[i, j] * input_scale[j]
            scale[i] = _quantize_buffer(buffer, values[i], steps)

    @_compiled
    def dequantize(products, row_scale, column_scale, bias, out):
        for i in range(out.shape[0]):
            r = row_scale[i]
            for j in range(out.shape[1]):
                out[i, j] = np.float32(products[i, j]) * (r * column_scale[j]) + bias[j]

    @_compiled
    def dequantize_gelu_quantize(products, row_scale, column_scale, bias, next_input_scale, values, scale, buffer,
                                 steps):
        for i in range(row_scale.shape[0]):
            r = row_scale[i]
            for j in range(products.shape[1]):
                v = np.float32(products[i, j]) * (r * column_scale[j]) + bias[j]
                t = min(abs(v) * np.float32(0.7071067811865476), np.float32(5.5))
                p = np.float32(1.0) + t * (np.float32(0.0705230784) + t * (np.float32(0.0422820123) + t * (
                    np.float32(0.0092705272) + t * (np.float32(0.0001520143) + t * (
                        np.float32(0.0002765672) + t * np.float32(0.0000430638))))))
                p2 = p * p
                p4 = p2 * p2
                p8 = p4 * p4
                erf = np.float32(1.0) - np.float32(1.0) / (p8 * p8)
                buffer[j] = np.float32(0.5) * (v + abs(v) * erf) * next_input_scale[j]
            scale[i] = _quantize_buffer(buffer, values[i], steps)

    @_compiled
    def _row_sum(row):
        """The float64 sum of a float32 row in the reference's order: eight interleaved partial sums, the tail first."""
        cols = row.shape[0]
        whole = cols // 8 * 8
        s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
        for j in range(0, whole, 8):
            s0 += np.float64(row[j])
            s1 += np.float64(row[j + 1])
            s2 += np.float64(row[j + 2])
            s3 += np.float64(row[j + 3])
            s4 += np.float64(row[j + 4])
            s5 += np.float64(row[j + 5])
            s6 += np.float64(row[j + 6])
            s7 += np.float64(row[j + 7])
        total = 0.0
        for j in range(whole, cols):
            total += np.float64(row[j])
        return total + s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7

    @_compiled
    def dequantize_residual_norm(products, row_scale, column_scale, bias, residual, norm_weight, norm_bias, eps, out):
        cols = out.shape[1]
        whole = cols // 8 * 8
        for i in range(out.shape[0]):
            r = row_scale[i]
            row = out[i]
            for j in range(cols):
                row[j] = np.float32(products[i, j]) * (r * column_scale[j]) + bias[j] + residual[i, j]
            mean = _row_sum(row) / cols
            s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
            for j in range(0, whole, 8):
                d0, d1 = np.float64(row[j]) - mean, np.float64(row[j + 1]) - mean
                d2, d3 = np.float64(row[j + 2]) - mean, np.float64(row[j + 3]) - mean
                d4, d5 = np.float64(row[j + 4]) - mean, np.float64(row[j + 5]) - mean
                d6, d7 = np.float64(row[j + 6]) - mean, np.float64(row[j + 7]) - mean
                s0 += d0 * d0
                s1 += d1 * d1
                s2 += d2 * d2
                s3 += d3 * d3
                s4 += d4 * d4
                s5 += d5 * d5
                s6 += d6 * d6
                s7 += d7 * d7
            spread = 0.0
            for j in range(whole, cols):
                d = np.float64(row[j]) - mean
                spread += d * d
            spread = spread + s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7
            inverse = np.float32(1.0 / np.sqrt(spread / cols + eps))
            shift = np.float32(mean)
            for j in range(cols):
                row[j] = (row[j] - shift) * inverse * norm_weight[j] + norm_bias[j]
