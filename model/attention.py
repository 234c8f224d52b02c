"""Attention over a packed batch (see model.packing): which kernel runs where, and the two that need code of
their own. The padded path (one SDPA call over the (B, T) layout with a key mask) stays in model.bert.

- CUDA, bfloat16/float16, PyTorch >= 2.10: `torch.nn.attention.varlen.varlen_attn`, FlashAttention over the
  packed sequences with their cumulative lengths. No padding, no mask: one 300-piece sentence no longer pads
  60 short ones, so the batcher may mix lengths freely (`attention_pads` is False).
- CPU at inference: a kernel for short sequences where one is installed (`use_cpu_kernel`; the `kernels` package
  has one in C for AVX-512 CPUs, in bfloat16 too where the CPU has AVX512-BF16) for every sequence of at most its
  `longest` tokens, all in one call, in the network's dtype where the kernel takes it; then one
  SDPA call per longer sequence when that costs less than one padded call (Packing.attend_each_on_cpu), in
  float32 or, where the CPU has AMX, bfloat16 (`torch_attention_dtype`). The network
  itself computes with torch alone, and knows no kernel package.
- Elsewhere (float32 on CUDA, older torch, training with attention dropout): the padded call. Padding costs
  attention work there, and the batcher's padding cap (max_padding_fraction) keeps long and short apart.

Shapes: N packed tokens, H hidden size, nh heads, hd head size, L one sequence's length.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F

from model.device import cpu_has_amx_bf16
from model.packing import Packing

_NOT_IMPORTED = object()
# torch's varlen_attn, imported on first use (varlen_kernel): importing torch.nn.attention.varlen brings in
# torch._dynamo, some 2 s of every process's start-up on a CPU where it never runs. Tests set this name to stand-ins.
varlen_attn: Callable | None | object = _NOT_IMPORTED


def varlen_kernel() -> Callable | None:
    """`torch.nn.attention.varlen.varlen_attn` (PyTorch >= 2.10), or None in an older torch: the padded path
    everywhere on CUDA."""
    global varlen_attn
    if varlen_attn is _NOT_IMPORTED:
        try:
            from torch.nn.attention.varlen import varlen_attn as imported
        except ImportError:
            imported = None
        varlen_attn = imported
    return varlen_attn

# FlashAttention computes in half precision only, on head sizes that are multiples of 8 up to 256.
VARLEN_DTYPES = (torch.bfloat16, torch.float16)
VARLEN_MAX_HEAD_DIM = 256


class ShortSequenceKernel(Protocol):
    """Attention of short packed sequences on a CPU, in one call for the whole batch."""

    def longest(self, dtype: torch.dtype, head_dim: int) -> int:
        """The longest sequence it takes in `dtype` at this head size (torch's attention serves longer ones)."""

    def fits(self, head_dim: int) -> bool: ...

    def takes(self, dtype: torch.dtype) -> bool:
        """Whether `attend` takes qkv, and writes out, in `dtype` as they are (float32 always)."""

    def attend(self, qkv: torch.Tensor, starts: torch.Tensor, lengths: torch.Tensor, longest: int, num_heads: int,
               head_dim: int, out: torch.Tensor) -> None:
        """Each sequence's (rows starts[i] .. starts[i] + lengths[i] - 1 of the packed (N, 3H) qkv, of a dtype it
        `takes`) attention to itself alone, into the same rows of out (N, H) of the same dtype."""


def _no_kernel() -> ShortSequenceKernel | None:
    return None


_cpu_kernel: Callable[[], ShortSequenceKernel | None] = _no_kernel


def use_cpu_kernel(provider: Callable[[], ShortSequenceKernel | None] | None) -> None:
    """Install `provider` (called at each packed batch on a CPU; it gives the kernel, or None where it cannot run),
    or remove it (None)."""
    global _cpu_kernel
    _cpu_kernel = provider or _no_kernel


def cpu_kernel() -> ShortSequenceKernel | None:
    """The installed CPU attention kernel, where one is installed and can run here."""
    return _cpu_kernel()


def torch_attention_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype torch's CPU attention runs in for a network in `dtype`. float32 (in and out through copies) except
    where the CPU has AMX: torch's bfloat16 attention costs more than float32's with the copies elsewhere (a bfloat16
    model 241 -> 249 seq/s on one core with them, issue #15), and much less on AMX, whose tile products its flash
    attention takes (2 cores of a Sapphire Rapids, 12 heads of 32, 256 tokens: 14.8 ms, against 35.1 for the float32
    C kernel between the copies, itself faster than torch's float32; heads of 64: 20.4 against 64.0; `python -m
    bench.peak.attention --dtype bfloat16 --lengths ...`)."""
    return torch.bfloat16 if dtype == torch.bfloat16 and cpu_has_amx_bf16() else torch.float32


def runs_varlen(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether packed attention on `device` in `dtype` runs as FlashAttention over the packed sequences."""
    return (torch.device(device).type == "cuda" and dtype in VARLEN_DTYPES
            and head_dim % 8 == 0 and head_dim <= VARLEN_MAX_HEAD_DIM and varlen_kernel() is not None)


def attention_pads(device: torch.device, dtype: torch.dtype, head_dim: int = 64) -> bool:
    """Whether packed attention (at inference) may compute padding on this device and dtype: what the
    batcher prices. False where varlen runs: a batch of any mix of lengths wastes nothing. True elsewhere;
    on CPU `Packing.attend_each_on_cpu` then decides batch by batch whether the padded call runs."""
    return not runs_varlen(device, dtype, head_dim)


def attend_varlen(qkv: torch.Tensor, packing: Packing, num_heads: int, head_dim: int) -> torch.Tensor:
    """Packed (N, 3H) query | key | value -> (N, H), each sequence attending to itself alone (to its first
    `key_lengths` tokens where the packing restricts them)."""
    tokens = qkv.shape[0]
    # Three strided (N, nh, hd) views, no copies: FlashAttention needs only the last dimension contiguous.
    q, k, v = qkv.view(tokens, 3, num_heads, head_dim).unbind(1)
    cu_keys, most_keys = packing.cu_seqlens, packing.max_length
    if packing.key_lengths is not None:  # the keys of each sequence, packed on their own
        k, v, cu_keys, most_keys = k[packing.key_rows], v[packing.key_rows], packing.cu_keys, max(packing.key_lengths)
    # Positional arguments only: 2.10 has `is_causal` after max_k, 2.11+ keyword-only options.
    out = varlen_kernel()(q, k, v, packing.cu_seqlens, cu_keys, packing.max_length, most_keys)
    return out.reshape(tokens, num_heads * head_dim)


def attend_on_cpu(qkv: torch.Tensor, packing: Packing, num_heads: int, head_dim: int) -> torch.Tensor | None:
    """Packed (N, 3H) query | key | value -> (N, H) on a CPU at inference, each sequence attending to itself alone;
    None off the CPU, and where one padded SDPA call is the cheaper way (the caller makes it)."""
    if qkv.device.type != "cpu":
        return None
    # The kernel has no backward: a caller asking for gradients gets torch's attention.
    kernel = None if qkv.requires_grad else cpu_kernel()
    kernel = kernel if kernel is not None and kernel.fits(head_dim) else None
    if (kernel is not None and packing.max_length <= kernel.longest(qkv.dtype, head_dim)) or \
            packing.attend_each_on_cpu(num_heads * head_dim):
        return attend_each(qkv, packing, num_heads, head_dim, kernel)
    return None


def attend_each(qkv: torch.Tensor, packing: Packing, num_heads: int, head_dim: int,
                kernel: ShortSequenceKernel | None = None) -> torch.Tensor:
    """Packed (N, 3H) query | key | value -> (N, H), one attention call per sequence, unpadded.

    On CPU, padded attention costs B * T^2 where the sequences need only the sum of their L^2: for 20
    wiki.test sentences one layer's padded call took 5.1 ms on one core, 20 per-sequence calls 1.5 ms
    (Packing.attend_each_on_cpu weighs the two). On a GPU one padded call wins (launch costs).
    """
    hidden = num_heads * head_dim
    limit = kernel.longest(qkv.dtype, head_dim) if kernel is not None else 0  # the kernel's longest sequence
    if kernel is not None and kernel.takes(qkv.dtype) and packing.max_length <= limit and \
            packing.key_lengths is None:  # every sequence in one kernel call, in the network's dtype
        out = _output_rows(qkv, hidden, packing)
        kernel.attend(qkv.contiguous(), packing.starts, packing.lengths, packing.max_length, num_heads, head_dim, out)
        return out
    # Both the kernel and torch in the dtype torch's attention runs fastest in (float32 through copies, or the
    # network's bfloat16 where the kernel takes it too).
    dtype = qkv.dtype
    work = torch_attention_dtype(dtype)
    if kernel is not None and not kernel.takes(work):
        work = torch.float32
    qkv = qkv.to(work)
    out = _output_rows(qkv, hidden, packing)
    keys = packing.key_lengths or tuple(length for _, length in packing.spans)
    spans = [(start, length, attended) for (start, length), attended in zip(packing.spans, keys)]
    if kernel is not None:  # the short sequences in one kernel call, torch the rest
        if packing.max_length <= limit and packing.key_lengths is None:
            starts, lengths, longest, spans = packing.starts, packing.lengths, packing.max_length, ()  # all of them
        else:  # the kernel attends each sequence to all of itself: those that restrict their keys go to torch
            short = [(start, length) for start, length, attended in spans
                     if length <= limit and attended == length]
            starts, lengths = torch.tensor([start for start, _ in short]), torch.tensor([n for _, n in short])
            longest = max((n for _, n in short), default=0)
            spans = [span for span in spans if span[1] > limit or span[2] != span[1]]
        if longest:
            qkv = qkv.contiguous()
            kernel.attend(qkv, starts, lengths, longest, num_heads, head_dim, out)
    for start, length, attended in spans:
        # (L, 3H) -> three strided (1, nh, L, hd) views of it, no copies; the keys and values of its first `attended`.
        q, k, v = qkv[start:start + length].view(1, length, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4)
        k, v = k[:, :, :attended], v[:, :, :attended]
        out[start:start + length] = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(length, hidden)
    return out.to(dtype)


def _output_rows(qkv: torch.Tensor, hidden: int, packing: Packing) -> torch.Tensor:
    """Attention's (N, hidden) output, to be written sequence by sequence; zeros in the spare rows, which no sequence
    writes (left as they were, they could hold anything, NaN included, for the layers after to compute on)."""
    out = qkv.new_empty(qkv.shape[0], hidden)
    if packing.spare_rows:
        out[packing.tokens:].zero_()
    return out
