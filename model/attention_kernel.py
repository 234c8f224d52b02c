"""Attention for short packed sequences on CPUs with AVX-512 (`model/attention_cpu.c`), where torch's CPU attention
costs several times its arithmetic.

Built and loaded at first use (`model.native`), then checked against `F.scaled_dot_product_attention` on sequences
of several lengths (within 1e-4; the two differ in summation order and in exp). `kernel()` is None where it cannot
run (`why_not()` says why), and `model.attention.attend_each` keeps torch's attention, one call per sequence.

Which sequences: one layer of all-MiniLM-L6-v2 (12 heads of 32), one core, against one SDPA call per sequence
(BENCHMARKS.md, "One query at a time on a CPU"): 35 vs 58 us at 34 tokens, 11 vs 21 at 8, 76 vs 118 at 64, 179 vs
234 at 96, 427 vs 385 at 128. So it takes the sequences of at most `MAX_LENGTH` tokens, torch the longer ones.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from model import native

SOURCE_NAME = "attention_cpu.c"
MAX_LENGTH = 96  # measured: faster than SDPA up to 96 tokens, slower from 128
LANES = 16  # the kernel's vector width in floats: head sizes must be multiples of it


class Kernel:
    def __init__(self, library: ctypes.CDLL):
        pointer, size = ctypes.c_void_p, ctypes.c_int64
        self._attend = library.attend_packed
        self._attend.argtypes = [pointer, pointer, pointer, size, size, size, ctypes.c_float, pointer, pointer, size,
                                 size]
        self._attend.restype = None

    @staticmethod
    def fits(head_dim: int) -> bool:
        return head_dim % LANES == 0

    def attend(self, qkv: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, longest: int, num_heads: int,
               head_dim: int, out: torch.Tensor) -> None:
        """Writes attention's output for each sequence (rows starts[i] .. starts[i] + lengths[i] - 1, int64
        tensors; `longest` the largest length) of the packed (N, 3H) float32 qkv into the same rows of out (N, H),
        each sequence attending to itself alone."""
        if qkv.dtype != torch.float32 or not qkv.is_contiguous() or not out.is_contiguous() or \
                qkv.shape[1] != 3 * num_heads * head_dim or not self.fits(head_dim) or \
                starts.dtype != torch.int64 or lengths.dtype != torch.int64:
            raise ValueError(f"the attention kernel takes contiguous float32 (N, 3H) rows with heads of a multiple "
                             f"of {LANES}, not {tuple(qkv.shape)} {qkv.dtype} with {num_heads} x {head_dim}")
        threads = torch.get_num_threads()
        per_thread = (head_dim + 1) * (-(-longest // LANES) * LANES)
        scratch = torch.empty(threads * per_thread)
        self._attend(qkv.data_ptr(), starts.data_ptr(), lengths.data_ptr(), len(starts), num_heads, head_dim,
                     head_dim ** -0.5, out.data_ptr(), scratch.data_ptr(), per_thread, threads)


def _check(candidate: Kernel) -> None:
    generator = torch.Generator().manual_seed(0)
    for num_heads, head_dim, lengths in ((2, 16, (1, 5, 16, 17)), (12, 32, (34, 3, 96)), (4, 64, (40, 2))):
        hidden = num_heads * head_dim
        spans, start = [], 0
        for length in lengths:
            spans.append((start, length))
            start += length
        qkv = torch.randn(start, 3 * hidden, generator=generator) * 3
        out = torch.empty(start, hidden)
        candidate.attend(qkv, torch.tensor([first for first, _ in spans]), torch.tensor(lengths), max(lengths),
                         num_heads, head_dim, out)
        for first, length in spans:
            q, k, v = qkv[first:first + length].view(1, length, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4)
            expected = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(length, hidden)
            if not torch.allclose(out[first:first + length], expected, atol=1e-4, rtol=1e-4):
                raise native.NativeUnavailable(f"the attention kernel differs from torch's at {length} tokens, "
                                               f"{num_heads} heads of {head_dim}")


# The kernel, built and checked at the first call (None where it cannot run); why_not() says why not.
kernel = native.FirstUse(SOURCE_NAME, Kernel, _check, "CPU attention: torch's")
why_not = kernel.why_not
