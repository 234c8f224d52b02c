"""The int8 layers' matrix products on CPUs with AVX512-VNNI (`model/int8_vnni.c`), faster than `torch._int_mm` at
every row count, most at the few rows of a query.

Built and loaded at first use (`model.native`). Before first use, its products are checked against
`torch._int_mm` on shapes that exercise every row and column tail; they must be equal bit for bit.
`kernel()` is None (and `torch._int_mm` serves, with the same results) where it cannot run: not x86-64 Linux,
no AVX512-VNNI, no compiler, a failed build or check. `why_not()` then says which.

When it runs: always, on torch's thread count (OpenMP, torch's own pool: see the C file). Against `torch._int_mm` on
the shapes of all-MiniLM-L6-v2's 24 products (BENCHMARKS.md, "One query at a time on a CPU"): on one thread 0.24x
its time at 1 row, 0.76x at 34, 0.93x at 256, 0.99x at 2048; on two threads 0.51x at 34, 0.81x at 256, 0.96x at 2048
(BERT-base's shapes: 0.74x at 34 rows, 0.92x at 1024). Each layer keeps both the packed copy and `_int_mm`'s (the
path where the kernel cannot run, and the layer's saved state), so int8 weights take twice their size (21 MB for
all-MiniLM-L6-v2's encoder instead of 11).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from model import native

SOURCE_NAME = "int8_vnni.c"


@dataclass(frozen=True)
class PackedWeights:
    """A (k, n) int8 weight matrix in the kernel's layout, with the correction its unsigned inputs need."""

    packed: torch.Tensor  # int8, packed_size(k, n) bytes
    correction: torch.Tensor  # (n,) int32
    in_features: int
    out_features: int


class Kernel:
    """The loaded library."""

    def __init__(self, library: ctypes.CDLL):
        pointer, size = ctypes.c_void_p, ctypes.c_int64
        self._packed_size = library.packed_size
        self._packed_size.argtypes, self._packed_size.restype = [size, size], size
        self._pack = library.pack_weights
        self._pack.argtypes, self._pack.restype = [pointer, size, size, pointer, pointer], None
        self._matmul = library.matmul_packed
        self._matmul.argtypes, self._matmul.restype = [pointer, size, size, pointer, pointer, size, pointer, size], None

    @staticmethod
    def fits(in_features: int) -> bool:
        """Whether a layer with this many inputs can use the kernel (it reads them four at a time)."""
        return in_features % 4 == 0

    def pack(self, weight_t: torch.Tensor) -> PackedWeights:
        """weight_t (k, n) int8, as `torch._int_mm` takes it -> the packed form."""
        weight_t = weight_t.contiguous()
        k, n = weight_t.shape
        if not self.fits(k):
            raise ValueError(f"the VNNI kernel needs a multiple of 4 input features, not {k}")
        packed = torch.empty(self._packed_size(k, n), dtype=torch.int8)
        correction = torch.empty(n, dtype=torch.int32)
        self._pack(weight_t.data_ptr(), k, n, packed.data_ptr(), correction.data_ptr())
        return PackedWeights(packed, correction, k, n)

    def matmul(self, rows: torch.Tensor, weights: PackedWeights) -> torch.Tensor:
        """rows (m, k) int8, contiguous -> (m, n) int32 products, equal to torch._int_mm(rows, weight_t), on torch's
        thread count. ctypes lets go of the GIL for the call, as torch's own kernels do."""
        m, k = rows.shape
        if k != weights.in_features or rows.dtype != torch.int8 or not rows.is_contiguous():
            raise ValueError(f"the VNNI kernel takes contiguous int8 rows of {weights.in_features}, "
                             f"not {tuple(rows.shape)} {rows.dtype}")
        out = torch.empty(m, weights.out_features, dtype=torch.int32)
        self._matmul(rows.data_ptr(), m, k, weights.packed.data_ptr(), weights.correction.data_ptr(),
                     weights.out_features, out.data_ptr(), torch.get_num_threads())
        return out


def _check(candidate: Kernel) -> None:
    """Every row tail (1-6, 7-13) and column tail (16, 48, 80 columns) against torch._int_mm, whose input needs
    more than 16 rows (it is given zero rows beyond the ones compared)."""
    generator = torch.Generator().manual_seed(0)
    for k, n in ((4, 16), (64, 48), (384, 80), (96, 200)):
        weight_t = torch.randint(-128, 128, (k, n), dtype=torch.int8, generator=generator)
        packed = candidate.pack(weight_t)
        for m in (1, 2, 3, 4, 5, 6, 7, 13, 17, 40):
            rows = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=generator)
            padded = torch.cat([rows, rows.new_zeros(max(0, 17 - m), k)])
            if not torch.equal(candidate.matmul(rows, packed), torch._int_mm(padded, weight_t)[:m]):
                raise native.NativeUnavailable(
                    f"the VNNI kernel's products differ from torch._int_mm's at {m} x {k} x {n}")


# The kernel, built and checked at the first call (None where it cannot run); why_not() says why not.
kernel = native.FirstUse(SOURCE_NAME, Kernel, _check, "int8 products: torch._int_mm")
why_not = kernel.why_not
