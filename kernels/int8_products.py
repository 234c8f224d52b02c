"""The int8 layers' matrix products in C: on CPUs with AVX512-VNNI (`kernels/c/int8_products.c`), faster than
`torch._int_mm` at every row count, most at the few rows of a query; on CPUs with AMX as well
(`kernels/c/int8_products_amx.c`), the same with sixteen rows at a time on AMX's tiles; on CPUs with AVX2 alone
(`kernels/c/int8_products_avx2.c`), where `torch._int_mm` runs about 30x slower than float32's product.

Built and loaded at first use (`kernels.loading`): the AMX kernel where the CPU and Linux allow it, else the VNNI one,
else the AVX2 one. Before first use, its products are checked against the exact products on shapes that exercise every
row and column tail (and, for the AVX2 kernel, 12-bit inputs); they must be equal bit for bit, so which one runs
changes no result. `kernel()` is None (and `torch._int_mm` serves, with the same results) where none can run: not
x86-64 Linux, no AVX2, no compiler, a failed build or check. `why_not()` then says which.

When it runs: always, on torch's thread count (OpenMP, torch's own pool: see the C files); BENCHMARKS.md ("One query at
a time on a CPU") has the VNNI kernel's times against `torch._int_mm`, `python -m bench.peak.int8_products` the AVX2
kernel's against float32's product. Each layer keeps both the blocked copy and `_int_mm`'s (the path where no kernel can
run, and the layer's saved state), so int8 weights take twice their size (three times with the AVX2 kernel's 16-bit
copy).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels import int8_reference
from kernels.loading import FirstOf, FirstUse, KernelUnavailable, ask_for_amx

SOURCE_NAME = "int8_products.c"
AVX2_SOURCE_NAME = "int8_products_avx2.c"
AMX_SOURCE_NAME = "int8_products_amx.c"


@dataclass(frozen=True)
class BlockedWeights:
    """A (k, n) int8 weight matrix in the kernel's blocked layout (64 output columns a block, four consecutive
    inputs a column), with the correction its unsigned inputs need."""

    blocked: torch.Tensor  # int8, blocked_size(k, n) bytes
    correction: torch.Tensor  # (n,) int32
    in_features: int
    out_features: int


def _declared(function, argtypes: list, restype=None):
    function.argtypes, function.restype = argtypes, restype
    return function


_POINTER, _SIZE = ctypes.c_void_p, ctypes.c_int64


class Kernel:
    """The loaded VNNI library."""

    instruction_set = "VNNI"  # what /info and the log name it by
    layout = "VNNI"  # the blocked weights' layout, which the C layers read too (AMX's kernel shares VNNI's)
    takes_16_bits = False  # whether `matmul` takes 12-bit rows (int16) in one product

    def __init__(self, library: ctypes.CDLL):
        self._blocked_size = _declared(library.blocked_size, [_SIZE, _SIZE], _SIZE)
        self._block = _declared(library.block_weights, [_POINTER, _SIZE, _SIZE, _POINTER, _POINTER])
        self._matmul = self._declared_matmul(library)

    @staticmethod
    def _declared_matmul(library: ctypes.CDLL):
        return _declared(library.matmul_blocked, [_POINTER, _SIZE, _SIZE, _POINTER, _POINTER, _SIZE, _POINTER, _SIZE])

    @staticmethod
    def fits(in_features: int) -> bool:
        """Whether a layer with this many inputs can use the kernel (it reads them four at a time)."""
        return in_features % 4 == 0

    def blocked_bytes(self, in_features: int, out_features: int) -> int:
        """Bytes of a layer's weights in the kernel's blocked layout (held beside the int8 weights themselves)."""
        return self._blocked_size(in_features, out_features)

    def block(self, weight_t: torch.Tensor) -> BlockedWeights:
        """weight_t (k, n) int8, as `torch._int_mm` takes it -> the kernel's blocked layout."""
        weight_t = weight_t.contiguous()
        k, n = weight_t.shape
        if not self.fits(k):
            raise ValueError(f"the {self.instruction_set} kernel needs a multiple of 4 input features, not {k}")
        blocked = torch.empty(self._blocked_size(k, n), dtype=torch.int8)
        correction = torch.empty(n, dtype=torch.int32)
        self._block(weight_t.data_ptr(), k, n, blocked.data_ptr(), correction.data_ptr())
        return BlockedWeights(blocked, correction, k, n)

    def matmul(self, rows: torch.Tensor, weights: BlockedWeights) -> torch.Tensor:
        """rows (m, k) int8, contiguous -> (m, n) int32 products, equal to torch._int_mm(rows, weight_t), on torch's
        thread count. ctypes lets go of the GIL for the call, as torch's own kernels do."""
        m, k = rows.shape
        if k != weights.in_features or rows.dtype != torch.int8 or not rows.is_contiguous():
            raise ValueError(f"the {self.instruction_set} kernel takes contiguous int8 rows of {weights.in_features}, "
                             f"not {tuple(rows.shape)} {rows.dtype}")
        out = torch.empty(m, weights.out_features, dtype=torch.int32)
        self._matmul(rows.data_ptr(), m, k, weights.blocked.data_ptr(), weights.correction.data_ptr(),
                     weights.out_features, out.data_ptr(), torch.get_num_threads())
        return out


class AmxKernel(Kernel):
    """The loaded AMX library: the VNNI kernel's layout and calls, sixteen rows at a time on AMX's tiles. Linux must
    first let this process use the tiles (Linux 5.16 and later); where it does not, the kernel cannot run."""

    instruction_set = "AMX"

    def __init__(self, library: ctypes.CDLL):
        ask_for_amx(library)
        super().__init__(library)


class Avx2Kernel(Kernel):
    """The loaded AVX2 library: the same weight calls (its own layout), 16-bit rows: int8 ones are widened first,
    12-bit ones go in as they are, in one product."""

    instruction_set = "AVX2"
    layout = "AVX2"
    takes_16_bits = True

    @staticmethod
    def _declared_matmul(library: ctypes.CDLL):
        return _declared(library.matmul_blocked_16, [_POINTER, _SIZE, _SIZE, _POINTER, _SIZE, _POINTER, _SIZE])

    def matmul(self, rows: torch.Tensor, weights: BlockedWeights) -> torch.Tensor:
        """rows (m, k) int8, or int16 of at most 12 bits, contiguous -> (m, n) int32 products, exactly, on torch's
        thread count."""
        m, k = rows.shape
        if k != weights.in_features or rows.dtype not in (torch.int8, torch.int16) or not rows.is_contiguous():
            raise ValueError(f"the AVX2 kernel takes contiguous int8 rows of {weights.in_features} (or 12-bit int16 "
                             f"ones), not {tuple(rows.shape)} {rows.dtype}")
        wide = rows.to(torch.int16)
        out = torch.empty(m, weights.out_features, dtype=torch.int32)
        self._matmul(wide.data_ptr(), m, k, weights.blocked.data_ptr(), weights.out_features, out.data_ptr(),
                     torch.get_num_threads())
        return out


LOW_BITS = 4  # a 12-bit value v = 16 * high + low, high in -128..127 and low in 0..15: both int8
TWELVE_BIT_MAX_INPUTS = 8191  # 8,191 x 128 x 128 x 16 < 2^31


def twelve_bit_products(values: torch.Tensor, int8_products: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """(rows, k) int16 values of 12 bits (-2,047..2,047) times int8 weights, exactly, from two int8 products:
    `int8_products` maps (rows, k) int8 to their (rows, n) int32 products with the weights. The high part's products
    are at most k x 128 x 128 in size: 16 times that fits an int32 below TWELVE_BIT_MAX_INPUTS inputs."""
    high = torch.bitwise_right_shift(values, LOW_BITS).to(torch.int8)  # an arithmetic shift: floor(v / 16)
    low = torch.bitwise_and(values, (1 << LOW_BITS) - 1).to(torch.int8)
    return int8_products(high) * (1 << LOW_BITS) + int8_products(low)


def _check(candidate: Kernel) -> None:
    """Every row tail (1-6, 7-13; past whole tiles of 16 rows: 17, 33, 40) and column tail (16, 48, 80 columns)
    against the exact products, for int8 rows (random ones and their extreme) and, where the kernel takes them, 12-bit
    ones at their extremes."""
    generator = torch.Generator().manual_seed(0)
    for k, n in ((4, 16), (64, 48), (384, 80), (96, 200)):
        weight_t = torch.randint(-128, 128, (k, n), dtype=torch.int8, generator=generator)
        blocked = candidate.block(weight_t)
        for m in (1, 2, 3, 4, 5, 6, 7, 13, 16, 17, 32, 33, 40):
            inputs = [torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=generator),
                      torch.full((m, k), -128, dtype=torch.int8)]
            if candidate.takes_16_bits:
                inputs.append(torch.randint(-2047, 2048, (m, k), dtype=torch.int16, generator=generator))
                inputs.append(torch.full((m, k), -2047, dtype=torch.int16))
            for rows in inputs:
                if not torch.equal(candidate.matmul(rows, blocked), int8_reference.products(rows, weight_t)):
                    raise KernelUnavailable(f"the {candidate.instruction_set} kernel's products differ from the exact "
                                            f"ones at {m} x {k} x {n} ({rows.dtype} rows)")


# Each kernel, built and checked at its first call (None where it cannot run), and the one the layers use: AMX where
# it runs, else VNNI, else AVX2 (None where none can run; why_not() says why not).
amx_kernel = FirstUse(AMX_SOURCE_NAME, AmxKernel, _check, "int8 products: the VNNI or AVX2 kernel or torch._int_mm")
vnni_kernel = FirstUse(SOURCE_NAME, Kernel, _check, "int8 products: the AVX2 kernel or torch._int_mm")
avx2_kernel = FirstUse(AVX2_SOURCE_NAME, Avx2Kernel, _check, "int8 products: torch._int_mm")
kernel = FirstOf(amx_kernel, vnni_kernel, avx2_kernel)
why_not = kernel.why_not


def kernel_for(in_features: int) -> Kernel | None:
    """The products kernel a layer with this many inputs uses here (None: torch._int_mm's products)."""
    found = kernel()
    return found if found is not None and found.fits(in_features) else None
