"""Attention for packed sequences of up to 512 tokens on CPUs with AVX-512 (`kernels/c/attention.c`) or AVX2
(`kernels/c/attention_avx2.c`), where torch's CPU attention costs several times its arithmetic.

Built and loaded at first use (`kernels.loading`), then checked against `F.scaled_dot_product_attention` on sequences
of several lengths (within 1e-4; the two differ in summation order and in exp). `kernel()` is None where it cannot
run (`why_not()` says why), and `model.attention.attend_each` keeps torch's attention, one call per sequence.

The network knows nothing of this package: `install()` hands the kernel to `model.attention`, which asks for it at
each packed batch on a CPU (the service's start-up installs it, for every precision).

Which sequences: all of at most `MAX_LENGTH` tokens, torch the longer ones. The kernel attends 8 query rows at a time
(one key or value vector loaded for 8 multiply-adds, 8 independent sums). On 64 sequences of 150 tokens, 12 heads of
32, two threads, it takes 0.49x the time of one SDPA call per sequence (17.2 against 35.4 ms; 0.43x at 12 heads of
64), and 0.69x at 512 tokens (`python -m bench.peak.attention`). Row by row it would be slower than torch's from 128
tokens (kernels/c/attention_float32.c says why).

Where the CPU has AVX2 and FMA but no AVX-512, `kernels/c/attention_avx2.c` serves instead: the same algorithm
(`attention_float32.c`, written once over each instruction set's vector vocabulary) and call, eight floats a vector
(head sizes a multiple of 8), checked the same way, for sequences of up to 256 tokens (`Avx2Kernel.max_length` says
why). Its sums run in another order, so its outputs differ from the AVX-512 kernel's
in the last bits (kernels.int8_path tells the two apart).

A bfloat16 network's qkv goes to `kernels/c/attention_bf16.c` as it is, where the CPU has AVX512-BF16: the same
algorithm in vdpbf16ps, bfloat16 in and out, so no layer copies qkv to float32 and its output back: 0.37-0.54x the
time of the float32 kernel between those copies, two threads, 32 to 512 tokens (`python -m bench.peak.attention
--dtype bfloat16`). Checked against SDPA in float32 on the same bfloat16 inputs (within bfloat16's rounding of the
output). Elsewhere the float32 kernel serves it, between the two copies.

Where the CPU has AMX, `kernels/c/attention_bf16_amx.c` serves bfloat16 instead: the same call, both products on
AMX's tiles (TDPBF16PS) for heads of a multiple of 32 and sequences of 16 tokens or more, the loops above for the rest,
and from 112 tokens (160 at heads of 64) one pass over the keys (its file says how). Two threads of a Sapphire
Rapids-class Xeon, 12 heads of 32: 0.36x the loops' time at 117 tokens, 0.25x at 256, 0.40x and 0.32x torch's own
bfloat16 SDPA (itself on AMX) at 256 and 512. Without it (AMX but not these tiles, or heads it does not tile), torch's
bfloat16 attention overtakes the loops past about 150 tokens of heads of 32, and `Kernel.longest` hands it those.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

from kernels import int8_reference
from kernels.loading import FirstOf, FirstUse, KernelUnavailable, ask_for_amx
from model import attention as model_attention

SOURCE_NAME = "attention.c"
AVX2_SOURCE_NAME = "attention_avx2.c"
MAX_LENGTH = 512  # the longest measured: faster than SDPA at every length up to it (module docstring)
# On a CPU with AMX, torch's bfloat16 attention (model.attention.torch_attention_dtype) overtakes the bfloat16 kernel
# once a sequence's tokens x head size passes about this many (two threads of a Sapphire Rapids-class Xeon, 12 heads,
# kernel / torch ms: of 32, 12.8 / 14.1 at 128 tokens, 15.0 / 13.6 at 160, 22.0 / 14.8 at 256; of 64, 13.3 / 11.2 at
# 96, 42.9 / 20.4 at 256: `python -m bench.peak.attention --dtype bfloat16 --threads 2 --lengths ...`)
AMX_BFLOAT16_TOKENS_BY_WIDTH = 150 * 32


def _declared(attend, scratch_size) -> tuple:
    """A library's attention call and its scratch size, with the C signatures both kernels share: attend(qkv, starts,
    lengths, count, heads, head_dim, scale, out, scratch, scratch per thread, threads); scratch(head_dim, longest)."""
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    attend.argtypes = [pointer, pointer, pointer, size, size, size, ctypes.c_float, pointer, pointer, size, size]
    attend.restype = None
    scratch_size.argtypes, scratch_size.restype = [size, size], size
    return attend, scratch_size


class Kernel:
    """The loaded AVX-512 library."""

    max_length = MAX_LENGTH
    instruction_set = "AVX-512"  # what kernels.int8_path names it by
    lanes = 16  # the kernel's vector width in floats: head sizes must be multiples of it

    def __init__(self, library: ctypes.CDLL):
        self._attend, self._scratch_floats = _declared(library.attend_packed, library.attention_scratch_floats)

    def fits(self, head_dim: int) -> bool:
        return head_dim % self.lanes == 0

    def longest(self, dtype: torch.dtype, head_dim: int) -> int:
        """The longest sequence it takes in `dtype` at this head size: torch's attention is faster above it."""
        if dtype == torch.bfloat16 and model_attention.torch_attention_dtype(dtype) == torch.bfloat16:
            tiled = bfloat16_kernel()
            if tiled is None or not tiled.on_tiles(head_dim):
                return min(self.max_length, AMX_BFLOAT16_TOKENS_BY_WIDTH // head_dim)
        return self.max_length

    def takes(self, dtype: torch.dtype) -> bool:
        """Whether `attend` takes qkv, and writes out, in `dtype` as they are."""
        return dtype == torch.float32 or (dtype == torch.bfloat16 and bfloat16_kernel() is not None)

    def attend(self, qkv: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, longest: int, num_heads: int,
               head_dim: int, out: torch.Tensor, threads: int | None = None) -> None:
        """Writes attention's output for each sequence (rows starts[i] .. starts[i] + lengths[i] - 1, int64
        tensors; `longest` the largest length) of the packed (N, 3H) qkv into the same rows of out (N, H), each
        sequence attending to itself alone, on `threads` threads (torch's count unless given). float32, or
        bfloat16 where `takes` it: qkv and out of the same dtype."""
        if not self.takes(qkv.dtype) or out.dtype != qkv.dtype or not qkv.is_contiguous() or \
                not out.is_contiguous() or qkv.shape[1] != 3 * num_heads * head_dim or not self.fits(head_dim) or \
                starts.dtype != torch.int64 or lengths.dtype != torch.int64:
            raise ValueError(f"the attention kernel takes contiguous (N, 3H) rows of float32 (or bfloat16 where the "
                             f"CPU has AVX512-BF16) with heads of a multiple of {self.lanes}, not {tuple(qkv.shape)} "
                             f"{qkv.dtype} with {num_heads} x {head_dim}, out {out.dtype}")
        threads = torch.get_num_threads() if threads is None else threads
        if qkv.dtype == torch.bfloat16:
            bfloat16_kernel().attend(qkv, starts, lengths, longest, num_heads, head_dim, out, threads)
            return
        per_thread = self._scratch_floats(head_dim, longest)
        scratch = torch.empty(threads * per_thread)
        self._attend(qkv.data_ptr(), starts.data_ptr(), lengths.data_ptr(), len(starts), num_heads, head_dim,
                     head_dim ** -0.5, out.data_ptr(), scratch.data_ptr(), per_thread, threads)

    def attend_spans(self, qkv: torch.Tensor, spans: Sequence[tuple[int, int]], num_heads: int, head_dim: int,
                     threads: int | None = None) -> torch.Tensor:
        """`attend` for the sequences at (start, length) `spans` of qkv, into a new (N, H) tensor (the signature
        of kernels.int8_reference's `Attention`: the C layer's attention, at any length)."""
        starts = torch.tensor([start for start, _ in spans], dtype=torch.int64)
        lengths = torch.tensor([length for _, length in spans], dtype=torch.int64)
        out = qkv.new_empty(qkv.shape[0], num_heads * head_dim)
        self.attend(qkv.contiguous(), starts, lengths, int(lengths.max()), num_heads, head_dim, out, threads)
        return out


class Avx2Kernel(Kernel):
    """The loaded AVX2 library: the same call, eight floats a vector, float32 only."""

    instruction_set = "AVX2"
    lanes = 8
    # 0.3-0.8x torch's time up to 224 tokens, 0.9-1.0x at 256 and level or slower at 512 on a Zen 3 (python -m
    # bench.peak.attention --lengths ...): its key rows and scores outgrow the 32 KiB L1 there; torch's above
    max_length = 256

    def takes(self, dtype: torch.dtype) -> bool:
        return dtype == torch.float32  # a bfloat16 network's qkv comes in as float32 copies (model.attention)


class BFloat16Kernel:
    """The bfloat16 library's own call (attention_bf16.c); `Kernel.attend` hands it bfloat16 qkv."""

    instruction_set = "AVX512-BF16"

    def __init__(self, library: ctypes.CDLL):
        self._attend, self._scratch_bytes = _declared(library.attend_packed_bf16, library.attention_bf16_scratch_bytes)

    def on_tiles(self, head_dim: int) -> bool:
        """Whether its products run on AMX's tiles at this head size (then it is faster than torch's at any length)."""
        return False

    def attend(self, qkv: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, longest: int, num_heads: int,
               head_dim: int, out: torch.Tensor, threads: int) -> None:
        per_thread = self._scratch_bytes(head_dim, longest)
        scratch = torch.empty(threads * per_thread, dtype=torch.uint8)
        self._attend(qkv.data_ptr(), starts.data_ptr(), lengths.data_ptr(), len(starts), num_heads, head_dim,
                     head_dim ** -0.5, out.data_ptr(), scratch.data_ptr(), per_thread, threads)


class BFloat16AmxKernel(BFloat16Kernel):
    """attention_bf16_amx.c: the same call, both products on AMX's tiles for heads of a multiple of 32 and sequences of
    16 tokens or more; attention_bf16.c's loops take the rest, faster there (a tile of 16 rows by 32 keys would hold
    mostly padding: at 12 tokens, heads of 32, the tiles took 1.11x the loops' time, at 16 0.91x, at 32 0.62x)."""

    instruction_set = "AMX"

    def __init__(self, library: ctypes.CDLL):
        ask_for_amx(library)
        self._attend, self._scratch_bytes = _declared(library.attend_packed_bf16_amx,
                                                      library.attention_bf16_amx_scratch_bytes)

    def on_tiles(self, head_dim: int) -> bool:
        return head_dim % 32 == 0


CHECKED_SHAPES = ((2, 16, (1, 5, 15, 16, 17)), (12, 32, (34, 3, 96)), (4, 64, (40, 2, 200)), (2, 128, (33, 1)))


def _check(candidate: Kernel) -> None:
    generator = torch.Generator().manual_seed(0)
    for num_heads, head_dim, lengths in CHECKED_SHAPES:
        spans = [(sum(lengths[:index]), length) for index, length in enumerate(lengths)]
        qkv = torch.randn(sum(lengths), 3 * num_heads * head_dim, generator=generator) * 3
        got = candidate.attend_spans(qkv, spans, num_heads, head_dim)
        expected = int8_reference.sdpa_each(qkv, spans, num_heads, head_dim)
        for first, length in spans:
            if not torch.allclose(got[first:first + length], expected[first:first + length], atol=1e-4, rtol=1e-4):
                raise KernelUnavailable(f"the attention kernel differs from torch's at {length} tokens, "
                                        f"{num_heads} heads of {head_dim}")


def _check_bfloat16(candidate: BFloat16Kernel) -> None:
    """Against SDPA in float32 on the same bfloat16 inputs: each output within what bfloat16 rounding may move it,
    2^-8 of its size (the output's rounding) and 2^-8 of the largest value's (the weights' rounding, 2^-9 each),
    with a factor of two to spare. torch's own bfloat16 SDPA lands as far off (tests/kernels/test_attention_bf16.py)."""
    generator = torch.Generator().manual_seed(0)
    for num_heads, head_dim, lengths in CHECKED_SHAPES:
        spans = [(sum(lengths[:index]), length) for index, length in enumerate(lengths)]
        qkv = (torch.randn(sum(lengths), 3 * num_heads * head_dim, generator=generator) * 3).bfloat16()
        starts = torch.tensor([start for start, _ in spans], dtype=torch.int64)
        counts = torch.tensor(lengths, dtype=torch.int64)
        got = qkv.new_empty(qkv.shape[0], num_heads * head_dim)
        candidate.attend(qkv, starts, counts, max(lengths), num_heads, head_dim, got, 2)
        expected = int8_reference.sdpa_each(qkv.float(), spans, num_heads, head_dim)
        largest_value = float(qkv[:, 2 * num_heads * head_dim:].float().abs().max())
        tolerance = 2 ** -7 * expected.abs() + 2 ** -8 * largest_value
        for first, length in spans:
            if not bool(((got[first:first + length].float() - expected[first:first + length]).abs()
                         <= tolerance[first:first + length]).all()):
                raise KernelUnavailable(f"the bfloat16 attention kernel differs from torch's at {length} tokens, "
                                        f"{num_heads} heads of {head_dim}")


# The kernels, built and checked at the first call (None where they cannot run); why_not() says why not. `kernel`:
# AVX-512's where it runs, else AVX2's.
avx512_kernel = FirstUse(SOURCE_NAME, Kernel, _check, "CPU attention: the AVX2 kernel or torch's")
avx2_kernel = FirstUse(AVX2_SOURCE_NAME, Avx2Kernel, _check, "CPU attention: torch's")
kernel = FirstOf(avx512_kernel, avx2_kernel)
why_not = kernel.why_not
bfloat16_loops_kernel = FirstUse("attention_bf16.c", BFloat16Kernel, _check_bfloat16,
                                 "CPU attention of bfloat16 networks: the float32 kernel's, with copies to float32 and "
                                 "back")
bfloat16_amx_kernel = FirstUse("attention_bf16_amx.c", BFloat16AmxKernel, _check_bfloat16,
                               "CPU attention of bfloat16 networks: the AVX512-BF16 kernel's")
bfloat16_kernel = FirstOf(bfloat16_amx_kernel, bfloat16_loops_kernel)


def install() -> None:
    """Make `model.attention` ask this package for its CPU attention kernel (built and checked at its first use)."""
    model_attention.use_cpu_kernel(kernel)
