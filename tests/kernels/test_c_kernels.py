"""The C kernels (kernels/c/int8_products.c and int8_products_avx2.c, kernels/c/attention.c and attention_avx2.c;
attention_bf16.c in test_attention_bf16.py): equal to torch's results (int8 products bit for bit, attention within
float rounding), used by the model where they serve, and torch's path where they cannot run."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from kernels import attention, int8_layer, int8_products, int8_reference, loading
from kernels.int8_modules import Int8Linear
from kernels.quantize import quantize
from model import attention as model_attention
from model.attention import attend_on_cpu
from model.packing import Packing
from tests.conftest import random_model

PRODUCTS = int8_products.kernel()  # the one the layers use here
# Every products kernel this CPU runs: a CPU with AMX runs the VNNI and AVX2 ones too, so each is tested there
EVERY_PRODUCTS = [found for found in (choice() for choice in int8_products.kernel.choices) if found is not None]
ATTENTION = attention.kernel()  # the one the model uses here
# Every attention kernel this CPU runs: a CPU with AVX-512 runs the AVX2 one too
EVERY_ATTENTION = [found for found in (attention.avx512_kernel(), attention.avx2_kernel()) if found is not None]
each_attention_kernel = pytest.mark.parametrize("kernel", EVERY_ATTENTION, ids=lambda found: found.instruction_set)
needs_products = pytest.mark.skipif(PRODUCTS is None, reason=f"no products kernel here: {int8_products.why_not()}")
each_products_kernel = pytest.mark.parametrize("products", EVERY_PRODUCTS, ids=lambda found: found.instruction_set)
needs_attention = pytest.mark.skipif(ATTENTION is None, reason=f"no attention kernel here: {attention.why_not()}")
# Inputs of about 3: float32 rounding, summed in another order than torch's
CLOSE = dict(atol=1e-4, rtol=1e-4)


@each_products_kernel
@pytest.mark.parametrize("k, n", [(384, 1152), (1536, 384), (64, 48), (8, 200), (96, 17)])
@pytest.mark.parametrize("m", [1, 5, 6, 7, 16, 17, 34, 100])  # AMX: tiles of 16 rows, the rest as VNNI
def test_kernel_products_equal_int_mm_bit_for_bit(products, m, k, n):
    generator = torch.Generator().manual_seed(m * 7 + k + n)
    weight_t = torch.randint(-127, 128, (k, n), dtype=torch.int8, generator=generator)
    rows = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=generator)
    rows[0, :4] = torch.tensor([-128, 127, -128, 127], dtype=torch.int8)  # the extremes of both signs
    padded = torch.cat([rows, rows.new_zeros(max(0, 17 - m), k)])
    got = products.matmul(rows, products.block(weight_t))
    assert got.shape == (m, n) and got.dtype == torch.int32
    assert torch.equal(got, torch._int_mm(padded, weight_t)[:m])


@pytest.mark.skipif(int8_products.avx2_kernel() is None,
                    reason=f"no AVX2 kernel here: {int8_products.avx2_kernel.why_not()}")
@pytest.mark.parametrize("m", [1, 4, 33])
def test_the_avx2_kernel_takes_12_bit_rows_in_one_exact_product(m):
    """Its products are 16-bit ones: 12-bit values go in as they are, the extremes included, and give the exact
    integers (1,536 wide: the late-interaction feed-forward output layer's input, its largest sums)."""
    avx2 = int8_products.avx2_kernel()
    generator = torch.Generator().manual_seed(m)
    weight_t = torch.randint(-128, 128, (1536, 40), dtype=torch.int8, generator=generator)
    weight_t[:, 0], weight_t[:, 1] = 127, -128
    rows = torch.randint(-2047, 2048, (m, 1536), dtype=torch.int16, generator=generator)
    rows[0] = 2047
    got = avx2.matmul(rows, avx2.block(weight_t))
    assert torch.equal(got.long(), rows.long() @ weight_t.long())
    assert got[0, 0] == 2047 * 127 * 1536


@each_products_kernel
def test_kernel_refuses_what_it_cannot_compute(products):
    blocked = products.block(torch.ones(8, 16, dtype=torch.int8))
    with pytest.raises(ValueError, match="contiguous int8 rows of 8"):
        products.matmul(torch.ones(3, 12, dtype=torch.int8), blocked)
    with pytest.raises(ValueError, match="contiguous int8 rows"):
        products.matmul(torch.ones(8, 3, dtype=torch.int8).t(), blocked)
    with pytest.raises(ValueError, match="contiguous int8 rows"):
        products.matmul(torch.ones(3, 8, dtype=torch.int32), blocked)
    with pytest.raises(ValueError, match="multiple of 4"):
        products.block(torch.ones(6, 16, dtype=torch.int8))


@needs_products
def test_int8_model_gives_the_same_embeddings_with_and_without_the_products_kernel(tokenizer, monkeypatch):
    monkeypatch.setattr(int8_layer, "kernel", lambda: None)  # the layers' modules, each product through the kernel
    model = quantize(random_model(tokenizer.vocab_size), "per-token")
    layers = [module for module in model.modules() if isinstance(module, Int8Linear)]
    assert layers and all(layer.products_kernel is PRODUCTS for layer in layers)
    lengths = [3, 20, 9]
    ids = torch.randint(5, tokenizer.vocab_size, (sum(lengths),), generator=torch.Generator().manual_seed(1))
    packing = Packing.from_lengths(lengths)
    with torch.inference_mode():
        with_kernel, _ = model.encode_packed(ids, torch.zeros_like(ids), packing, for_heads=False)
        for layer in layers:
            layer.products_kernel = layer.blocked = None
        without, _ = model.encode_packed(ids, torch.zeros_like(ids), packing, for_heads=False)
    assert torch.equal(with_kernel, without)  # the integer products are equal, and all else is the same code


@contextmanager
def torch_threads(count: int):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@each_products_kernel
@pytest.mark.parametrize("threads", [2, 3, 8])
@pytest.mark.parametrize("m, k, n", [(1, 384, 1152), (34, 384, 384), (100, 64, 80), (13, 96, 17), (7, 1536, 384)])
def test_kernel_products_on_several_threads_equal_one_thread(products, threads, m, k, n):
    """Each thread takes a run of column blocks, and each block's row tiles too where threads outnumber blocks
    (8 threads over 80 columns: 2 blocks of 17 row tiles with VNNI's 64 columns and 6 rows, 3 of 34 with AVX2's 32
    and 3)."""
    generator = torch.Generator().manual_seed(m + k + n)
    blocked = products.block(torch.randint(-127, 128, (k, n), dtype=torch.int8, generator=generator))
    rows = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=generator)
    with torch_threads(1):
        alone = products.matmul(rows, blocked)
    with torch_threads(threads):
        assert torch.equal(products.matmul(rows, blocked), alone)


@pytest.mark.skipif(PRODUCTS is None and ATTENTION is None, reason="no C kernel here")
def test_the_kernels_share_torchs_openmp_runtime():
    """Two OpenMP thread pools on the same cores would spin against each other: the kernels' libgomp must be the
    one torch loaded."""
    assert len(loading.openmp_runtimes()) == 1, loading.openmp_runtimes()


def packed_qkv(lengths: list[int], heads: int, head_dim: int, seed: int = 0) -> tuple[torch.Tensor, Packing]:
    qkv = torch.randn(sum(lengths), 3 * heads * head_dim, generator=torch.Generator().manual_seed(seed)) * 3
    return qkv, Packing.from_lengths(lengths)


@each_attention_kernel
@pytest.mark.parametrize("heads, head_dim, lengths", [
    (12, 32, [34]), (4, 16, [1]), (4, 16, [1, 2, 15, 16, 17, 33]), (2, 64, [96, 5]), (12, 32, [40, 40, 40]),
    # blocks of 8 query rows, then 4, 2 and 1 (7, 23), and the longest the kernel takes
    (4, 16, [7, 23, 8, 9]), (2, 64, [150, 301]), (12, 32, [attention.MAX_LENGTH]),
])
def test_attention_kernel_matches_sdpa_sequence_by_sequence(kernel, heads, head_dim, lengths):
    qkv, packing = packed_qkv(lengths, heads, head_dim)
    out = torch.full((qkv.shape[0], heads * head_dim), float("nan"))
    kernel.attend(qkv, packing.starts, packing.lengths, packing.max_length, heads, head_dim, out)
    torch.testing.assert_close(out, int8_reference.sdpa_each(qkv, packing.spans, heads, head_dim), **CLOSE)


@each_attention_kernel
@pytest.mark.parametrize("threads", [2, 5])
def test_attention_kernel_on_several_threads_equals_one_thread(kernel, threads):
    """The threads split (sequence, head) pairs, each with scratch of its own: 3 sequences x 4 heads."""
    heads, head_dim = 4, 16
    qkv, packing = packed_qkv([30, 1, 17], heads, head_dim, seed=5)
    alone, together = (torch.full((qkv.shape[0], heads * head_dim), float("nan")) for _ in range(2))
    with torch_threads(1):
        kernel.attend(qkv, packing.starts, packing.lengths, packing.max_length, heads, head_dim, alone)
    with torch_threads(threads):
        kernel.attend(qkv, packing.starts, packing.lengths, packing.max_length, heads, head_dim, together)
    assert torch.equal(together, alone)


@pytest.mark.skipif(attention.avx2_kernel() is None,
                    reason=f"no AVX2 attention here: {attention.avx2_kernel.why_not()}")
def test_the_avx2_attention_kernel_refuses_heads_that_are_not_whole_vectors():
    """Eight floats a vector: heads of 8 and 24 fit it (not the AVX-512 kernel's 16), 12 does not."""
    avx2 = attention.avx2_kernel()
    assert avx2.fits(8) and avx2.fits(24) and not avx2.fits(12) and not avx2.takes(torch.bfloat16)
    qkv, packing = packed_qkv([9, 3], 2, 24)
    out = torch.empty(qkv.shape[0], 48)
    avx2.attend(qkv, packing.starts, packing.lengths, packing.max_length, 2, 24, out)
    torch.testing.assert_close(out, int8_reference.sdpa_each(qkv, packing.spans, 2, 24), **CLOSE)
    qkv, packing = packed_qkv([5], 2, 12)
    with pytest.raises(ValueError, match="heads of a multiple of 8"):
        avx2.attend(qkv, packing.starts, packing.lengths, 5, 2, 12, torch.empty(5, 24))


@needs_attention
def test_attend_on_cpu_mixes_the_kernel_for_short_sequences_with_torch_for_long_ones():
    heads, head_dim = 4, 16
    lengths = [attention.MAX_LENGTH + 30, 7, 3, attention.MAX_LENGTH + 1, 50]
    qkv, packing = packed_qkv(lengths, heads, head_dim, seed=3)
    got = attend_on_cpu(qkv, packing, heads, head_dim)
    assert got is not None  # mixed lengths: one call per sequence beats the padded call
    torch.testing.assert_close(got, int8_reference.sdpa_each(qkv, packing.spans, heads, head_dim), **CLOSE)
    # bfloat16 in, bfloat16 out (computed in float32)
    half = attend_on_cpu(qkv.bfloat16(), packing, heads, head_dim)
    assert half.dtype == torch.bfloat16


@needs_attention
@pytest.mark.skipif(attention.bfloat16_kernel() is None, reason=f"no bfloat16 attention kernel here: "
                                                                f"{attention.bfloat16_kernel.why_not()}")
@pytest.mark.parametrize("amx, tiled", [(True, True), (True, False), (False, False)])
def test_a_bfloat16_network_sends_only_sequences_past_the_kernels_longest_to_torch(monkeypatch, amx, tiled):
    """Where the CPU has AMX, torch's bfloat16 attention overtakes the AVX512-BF16 loops past about 150 tokens of
    heads of 32 and serves longer sequences in bfloat16 itself, unless the bfloat16 kernel runs on AMX's tiles too;
    elsewhere the kernel takes every length up to 512."""
    if tiled and attention.bfloat16_amx_kernel() is None:
        pytest.skip(f"no AMX bfloat16 attention here: {attention.bfloat16_amx_kernel.why_not()}")
    if not tiled:
        loops = attention.bfloat16_loops_kernel()
        monkeypatch.setattr(attention, "bfloat16_kernel", lambda: loops)
    monkeypatch.setattr(model_attention, "cpu_has_amx_bf16", lambda: amx)
    heads, head_dim = 4, 32
    limit = ATTENTION.longest(torch.bfloat16, head_dim)
    assert limit == (attention.AMX_BFLOAT16_TOKENS_BY_WIDTH // head_dim if amx and not tiled else attention.MAX_LENGTH)
    assert ATTENTION.longest(torch.float32, head_dim) == attention.MAX_LENGTH  # float32's kernel is not affected
    lengths = [limit + 20, 7, limit, 50]
    qkv, packing = packed_qkv(lengths, heads, head_dim, seed=4)
    calls, sdpa = [], model_attention.F.scaled_dot_product_attention
    monkeypatch.setattr(model_attention.F, "scaled_dot_product_attention",
                        lambda q, k, v: calls.append((q.dtype, q.shape[2])) or sdpa(q, k, v))
    got = attend_on_cpu(qkv.bfloat16(), packing, heads, head_dim)
    assert got.dtype == torch.bfloat16
    # the rest in one kernel call; without AMX torch's attention runs in float32, through copies
    assert calls == [(torch.bfloat16 if amx else torch.float32, limit + 20)]
    expected = int8_reference.sdpa_each(qkv.bfloat16().float(), packing.spans, heads, head_dim)
    torch.testing.assert_close(got.float(), expected, atol=0.05, rtol=0.02)  # bfloat16's rounding


@needs_attention
def test_attention_kernel_is_not_used_when_gradients_are_asked_for(monkeypatch):
    heads, head_dim = 4, 16
    qkv, packing = packed_qkv([5, 90, 9], heads, head_dim)

    def no_call(*args):
        raise AssertionError("the kernel has no backward")

    monkeypatch.setattr(ATTENTION, "attend", no_call)
    got = attend_on_cpu(qkv.requires_grad_(True), packing, heads, head_dim)
    assert got is not None and got.grad_fn is not None  # torch's attention, one call per sequence


def test_without_the_kernels_the_int8_model_still_runs_through_torch(monkeypatch, tokenizer):
    """What a machine without the CPU features or a compiler gets: torch's products and attention, same results."""
    monkeypatch.setattr(int8_products, "kernel", lambda: None)
    monkeypatch.setattr(int8_layer, "kernel", lambda: None)
    model_attention.use_cpu_kernel(None)  # the conftest's fixture installs it again for the next test
    model = quantize(random_model(tokenizer.vocab_size), "per-token")
    assert all(layer.products_kernel is None for layer in model.modules() if isinstance(layer, Int8Linear))
    assert not any(isinstance(layer, int8_layer.Int8FusedLayer) for layer in model.bert.encoder.layer)
    ids = torch.randint(5, tokenizer.vocab_size, (12,), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        out, _ = model.encode_packed(ids, torch.zeros_like(ids), Packing.from_lengths([12]), for_heads=False)
    assert out.shape == (12, model.config.hidden_size) and torch.isfinite(out).all()
