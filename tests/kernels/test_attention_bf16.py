"""The bfloat16 attention kernels (kernels/c/attention_bf16.c, and attention_bf16_amx.c on AMX's tiles): each as close
to float32 SDPA on the same bfloat16 inputs as torch's own bfloat16 SDPA, the same bits on any number of threads, and
what a bfloat16 network's CPU attention runs where the CPU has AVX512-BF16 (no copy to float32 and back)."""

from __future__ import annotations

import pytest
import torch

from kernels import attention, int8_reference
from model.attention import attend_on_cpu
from model.packing import Packing

BFLOAT16 = attention.bfloat16_kernel()
needs_bfloat16 = pytest.mark.skipif(BFLOAT16 is None,
                                    reason=f"no bfloat16 attention kernel here: {attention.bfloat16_kernel.why_not()}")
# Every bfloat16 kernel this CPU runs: one with AMX runs the AVX512-BF16 loops too, so each is tested there
EACH_KERNEL = pytest.mark.parametrize("kernel", [
    pytest.param(loaded, id=loaded.instruction_set)
    for loaded in (attention.bfloat16_amx_kernel(), attention.bfloat16_loops_kernel()) if loaded is not None])


def packed_bfloat16(lengths: list[int], heads: int, head_dim: int, seed: int = 0) -> tuple[torch.Tensor, Packing]:
    generator = torch.Generator().manual_seed(seed)
    qkv = torch.randn(sum(lengths), 3 * heads * head_dim, generator=generator) * 3
    return qkv.bfloat16(), Packing.from_lengths(lengths)


def attend(qkv: torch.Tensor, packing: Packing, heads: int, head_dim: int, threads: int = 2, kernel=None
           ) -> torch.Tensor:
    out = torch.full((qkv.shape[0], heads * head_dim), float("nan"), dtype=torch.bfloat16)
    (kernel or BFLOAT16).attend(qkv, packing.starts, packing.lengths, packing.max_length, heads, head_dim, out, threads)
    return out


def assert_as_close_as_torchs(kernel, qkv: torch.Tensor, packing: Packing, heads: int, head_dim: int) -> None:
    """The kernel's attention against float32 SDPA on the same bfloat16 inputs, as close as torch's bfloat16 SDPA."""
    exact = int8_reference.sdpa_each(qkv.float(), packing.spans, heads, head_dim)
    got = attend(qkv, packing, heads, head_dim, kernel=kernel).float()
    torchs = int8_reference.sdpa_each(qkv, packing.spans, heads, head_dim).float()
    assert torch.isfinite(got).all()
    error, torchs_error = (got - exact).abs(), (torchs - exact).abs()
    # Both are mostly the output's rounding to bfloat16: within 5% on average (the tiles' one pass, from 112 tokens,
    # rounds each row's largest weight too, which two passes make exactly 1: 4% more error on these random scores,
    # whose rows a few keys dominate; the loops and two passes stay within 2%). Each output is within that rounding
    # (half a step, 2^-8 of it) and the weights' (2^-9 each, so 2^-9 of the largest value at most).
    assert float(error.mean()) <= 1.05 * float(torchs_error.mean())
    largest_value = float(qkv[:, 2 * heads * head_dim:].float().abs().max())
    assert bool((error <= 2 ** -8 * exact.abs() + 2 ** -9 * largest_value).all())


@needs_bfloat16
@pytest.mark.parametrize("heads, head_dim, lengths", [
    (12, 32, [34]), (4, 16, [1]), (4, 16, [1, 2, 15, 16, 17, 33]), (2, 64, [96, 5]),
    # blocks of 8 query rows, then 4, 2 and 1 (7, 23); odd lengths (the last pair of values is half zeros)
    (4, 16, [7, 23, 8, 9]), (2, 64, [150, 301]), (12, 32, [130, 255, 256]), (12, 32, [attention.MAX_LENGTH]),
    # AMX: tiles from 16 tokens (15 to the loops), blocks of 16 query rows with a partial last one, keys padded to
    # 32; heads of 128 take two passes of 64 dimensions; heads of 16 (not a multiple of 32) the loops
    (12, 32, [15, 16, 17, 31, 32, 33, 47, 79]), (2, 128, [40, 16, 200]), (4, 64, [64, 65, 500]),
])
@EACH_KERNEL
def test_bfloat16_kernel_is_as_close_to_float32_attention_as_torchs_bfloat16_attention(kernel, heads, head_dim,
                                                                                        lengths):
    qkv, packing = packed_bfloat16(lengths, heads, head_dim)
    assert_as_close_as_torchs(kernel, qkv, packing, heads, head_dim)


@EACH_KERNEL
@pytest.mark.parametrize("head_dim", [32, 64])
def test_a_key_far_from_the_others_in_a_direction_no_query_takes_is_still_exact(kernel, head_dim):
    """The tiles' one pass subtracts a bound on each row's largest score (the keys' mean and farthest distance from
    it): one key 1,000 away along a dimension every query has 0 in puts that bound thousands of powers of two above
    every score, so the weights underflow and those rows must be computed again in two passes. Without that, they
    would come out NaN (and the kernel's first-use check, whose random heads of 64 take that path too, would refuse
    it: test_build_and_load's test_a_kernel_is_missing_only_where_it_cannot_run)."""
    heads, lengths = 2, [200, 300]
    qkv, packing = packed_bfloat16(lengths, heads, head_dim, seed=6)
    hidden = heads * head_dim
    for h in range(heads):
        qkv[:, h * head_dim] = 0  # every query's first dimension
        qkv[[7, 250], hidden + h * head_dim] = 1000.0  # one key of each sequence, along it
    assert_as_close_as_torchs(kernel, qkv, packing, heads, head_dim)


@EACH_KERNEL
@pytest.mark.parametrize("head_dim", [16, 32])
def test_a_wrong_weight_would_show(kernel, head_dim):
    """The check above can fail: attention with one sequence's keys shifted by a row is far off."""
    heads = 4
    qkv, packing = packed_bfloat16([40, 40], heads, head_dim, seed=4)
    shifted = qkv.clone()
    shifted[1:40, heads * head_dim:2 * heads * head_dim] = qkv[0:39, heads * head_dim:2 * heads * head_dim]
    exact = int8_reference.sdpa_each(qkv.float(), packing.spans, heads, head_dim)
    wrong = attend(shifted, packing, heads, head_dim, kernel=kernel).float()
    torchs = int8_reference.sdpa_each(qkv, packing.spans, heads, head_dim).float()
    assert float((wrong - exact).abs().mean()) > 5 * float((torchs - exact).abs().mean())


@EACH_KERNEL
@pytest.mark.parametrize("threads", [2, 5])
@pytest.mark.parametrize("head_dim", [16, 32])
def test_bfloat16_kernel_on_several_threads_equals_one_thread(kernel, threads, head_dim):
    heads = 4
    qkv, packing = packed_bfloat16([30, 1, 17, 70], heads, head_dim, seed=5)
    assert torch.equal(attend(qkv, packing, heads, head_dim, threads, kernel),
                       attend(qkv, packing, heads, head_dim, 1, kernel))


@needs_bfloat16
def test_a_bfloat16_networks_attention_runs_in_bfloat16_without_the_float32_kernel(monkeypatch):
    heads, head_dim = 12, 32
    qkv, packing = packed_bfloat16([34, 7, 130], heads, head_dim, seed=6)
    float32_kernel = attention.kernel()

    def no_float32(*args):
        raise AssertionError("a bfloat16 batch went to the float32 kernel")

    monkeypatch.setattr(float32_kernel, "_attend", no_float32)
    got = attend_on_cpu(qkv, packing, heads, head_dim)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, attend(qkv, packing, heads, head_dim, torch.get_num_threads()))


@needs_bfloat16
def test_without_the_bfloat16_kernel_a_bfloat16_network_gets_the_float32_kernel_between_copies(monkeypatch):
    heads, head_dim = 4, 16
    qkv, packing = packed_bfloat16([12, 5], heads, head_dim, seed=7)
    monkeypatch.setattr(attention, "bfloat16_kernel", lambda: None)
    got = attend_on_cpu(qkv, packing, heads, head_dim)
    expected = int8_reference.sdpa_each(qkv.float(), packing.spans, heads, head_dim).bfloat16()
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, expected, atol=0, rtol=2 ** -8)  # float32 attention, rounded once
