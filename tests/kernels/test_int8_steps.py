"""The int8 layers' row-wise steps: the reference formulas (kernels.int8_reference) compute the textbook recipes they
stand for, numba's kernels give their bits exactly, and a model gives the same bits with numba or without (batched
equal to single, as per-token quantization promises)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from kernels import int8_numba, int8_reference, int8_rows
from kernels.int8_modules import Int8GeluIntermediate, Int8Linear, Int8ResidualNorm
from kernels.quantize import calibrate, quantize
from tests.conftest import random_model

needs_numba = pytest.mark.skipif(not int8_numba.AVAILABLE, reason="numba is not installed")


def textbook_quantize(x: torch.Tensor, input_scale: torch.Tensor, steps: int = 127) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain per-row recipe: round(x s / (max|x s| / steps)), scale max|x s| / steps."""
    smoothed = x.float() * input_scale
    scale = smoothed.abs().amax(1).clamp(min=1e-8) / steps
    return torch.round(smoothed / scale[:, None]).to(torch.int16), scale


def uneven_rows(rows: int, cols: int, seed: int) -> torch.Tensor:
    """Channels of very different sizes, as after LayerNorm, and an all-zero row."""
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed)) * torch.linspace(0.1, 9, cols)
    x[min(7, rows - 1)] = 0.0
    return x


def test_the_reference_quantization_is_the_textbook_recipe_rounding_half_away_from_zero():
    x, s = uneven_rows(40, 96, seed=0), torch.rand(96, generator=torch.Generator().manual_seed(1)) + 0.5
    values, scale = int8_reference.quantize_rows(x, s)
    want_values, want_scale = textbook_quantize(x, s)
    torch.testing.assert_close(scale, want_scale, rtol=1e-6, atol=0)
    assert (values.int() - want_values.int()).abs().max() <= 1  # only a tie (or its float neighbour) may differ
    assert (values != want_values).float().mean() < 0.001 and not values[7].any()
    ties = int8_reference.quantize_smoothed(torch.tensor([[127.0, 0.5, -0.5, 1.5, -2.5, 0.0]]))[0]
    assert ties.tolist() == [[127, 1, -1, 2, -3, 0]]  # half away from zero (torch.round would give 0, -0, 2, -2)


def test_twelve_bit_quantization_is_the_same_recipe_with_2047_steps_and_16_times_finer():
    x, s = uneven_rows(40, 96, seed=0), torch.rand(96, generator=torch.Generator().manual_seed(1)) + 0.5
    values, scale = int8_reference.quantize_rows(x, s, bits=12)
    want_values, want_scale = textbook_quantize(x, s, steps=2047)
    assert values.dtype == torch.int16 and values.abs().max() == 2047
    torch.testing.assert_close(scale, want_scale, rtol=1e-6, atol=0)
    assert (values.int() - want_values.int()).abs().max() <= 1 and not values[7].any()
    coarse_values, coarse_scale = int8_reference.quantize_rows(x, s)
    fine_error = (values * scale[:, None] - x * s).abs().amax(1)
    coarse_error = (coarse_values * coarse_scale[:, None] - x * s).abs().amax(1)
    assert (fine_error <= coarse_error / 15 + 1e-12).all()  # half of a step 2047 / 127 = 16.1 times smaller
    with pytest.raises(ValueError, match="one of"):
        int8_reference.quantize_rows(x, s, bits=16)


def test_the_reference_gelu_is_the_exact_gelu_even_far_out():
    v = torch.cat([torch.linspace(-8, 8, 2001), torch.tensor([60.0, -60.0, 1e-30, -1e-30])])
    error = (int8_reference.gelu(v) - F.gelu(v)).abs()
    assert (error <= 3e-7 * v.abs() + 1e-6).all()  # erf's approximation error, times v, plus float32 rounding


def test_the_reference_norm_is_layer_norm_and_sums_in_the_kernels_order():
    summed = torch.randn(18, 52, generator=torch.Generator().manual_seed(4)) * 4 + 30  # far from zero mean
    weight, bias = torch.rand(52) + 0.5, torch.randn(52)
    got = int8_reference.residual_norm(summed, weight, bias, 1e-12)
    torch.testing.assert_close(got, F.layer_norm(summed, (52,), weight, bias, eps=1e-12), rtol=1e-5, atol=1e-5)
    wide = summed.double()
    in_order = []
    for row in wide:  # eight interleaved partial sums, the 52 mod 8 = 4 last columns first, then the eight in order
        partials = [sum(row[u:48:8].tolist(), 0.0) for u in range(8)]
        total = sum(row[48:].tolist(), 0.0)
        for partial in partials:
            total += partial
        in_order.append(total)
    assert int8_reference.row_sums(wide).tolist() == in_order


def test_the_reference_products_are_exact():
    generator = torch.Generator().manual_seed(5)
    values = torch.randint(-127, 128, (20, 1536), dtype=torch.int8, generator=generator)
    weight_t = torch.randint(-127, 128, (1536, 40), dtype=torch.int8, generator=generator)
    assert torch.equal(int8_reference.products(values, weight_t), values.long() @ weight_t.long())


def steps_inputs(rows: int, cols: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    quantized = int8_rows.quantize_rows(uneven_rows(rows, 32, seed), torch.ones(32))
    products = torch.randint(-60000, 60000, (rows, cols), dtype=torch.int32, generator=generator)
    column_scale, bias = torch.rand(cols, generator=generator) / 300, torch.randn(cols, generator=generator)
    bias[:4] = torch.tensor([60.0, -60.0, 8.0, -8.0])  # far past where erf is 1 in float32, both signs
    return quantized, products, column_scale, bias, generator


@needs_numba
@pytest.mark.parametrize("bits", int8_reference.INPUT_BITS)
@pytest.mark.parametrize("rows, cols", [(1, 8), (5, 64), (40, 384), (33, 1536), (20, 100)])
def test_numba_gives_the_reference_bits_at_every_step(rows, cols, bits, monkeypatch):
    x = uneven_rows(rows, cols, seed=rows + cols)
    s = torch.rand(cols, generator=torch.Generator().manual_seed(cols)) + 0.5
    quantized, products, column_scale, bias, generator = steps_inputs(rows, cols, seed=rows * cols)
    residual = torch.randn(rows, cols, generator=generator) * 4 + 30
    weight, norm_bias = torch.rand(cols, generator=generator) + 0.5, torch.randn(cols, generator=generator)
    results = {}
    for numba in (True, False):
        monkeypatch.setattr(int8_rows, "USE_NUMBA", numba)
        q = int8_rows.quantize_rows(x, s, bits)
        g = int8_rows.dequantize_gelu_quantize(products, quantized, column_scale, bias, s[:1].expand(cols), bits)
        results[numba] = (q.values[:rows], q.scale, int8_rows.dequantize(products, quantized, column_scale, bias),
                          g.values[:rows], g.scale,
                          int8_rows.dequantize_residual_norm(products, quantized, column_scale, bias, residual, weight,
                                                             norm_bias, 1e-12))
    assert results[True][0].dtype == results[True][3].dtype == int8_reference.values_dtype(bits)
    for with_numba, reference in zip(results[True], results[False]):
        assert torch.equal(with_numba, reference)


def test_quantized_rows_are_padded_for_torch_int_mm_only_with_zero_rows(monkeypatch):
    x = uneven_rows(5, 96, seed=2).reshape(5, 1, 96).bfloat16()
    for numba in ((True, False) if int8_numba.AVAILABLE else (False,)):
        monkeypatch.setattr(int8_rows, "USE_NUMBA", numba)
        rows = int8_rows.quantize_rows(x, torch.ones(96))
        assert rows.rows == 5 and rows.shape == (5, 1) and rows.dtype == torch.bfloat16
        assert rows.values.shape[0] >= 5 and not rows.values[5:].any()


def test_int8_linear_computes_the_textbook_per_token_product():
    torch.manual_seed(3)
    linear = torch.nn.Linear(48, 40)
    smooth = torch.rand(48) + 0.5
    layer = Int8Linear.from_linear(linear, smooth)
    x = uneven_rows(33, 48, seed=3)
    xs = x / smooth
    x_scale = xs.abs().amax(1, keepdim=True).clamp(min=1e-8) / 127
    want = (torch.round(xs / x_scale) @ layer.weight_t.float()) * x_scale * layer.weight_scale + layer.bias
    got = layer(x)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kernel", [True, False])
def test_twelve_bit_inputs_give_the_exact_products(kernel):
    """Every value of 12 bits, the extremes included, against exact integer products, through the products kernel
    (VNNI: two int8 products; AVX2: one 16-bit product) and through torch._int_mm (two int8 products; the high part's
    products are the large ones: 1,536 wide, all at the extremes)."""
    linear = torch.nn.Linear(1536, 40)
    layer = Int8Linear.from_linear(linear, input_bits=12)
    if not kernel:
        layer.blocked = None
    elif layer.blocked is None:
        pytest.skip("no products kernel on this CPU")
    every = torch.arange(-2047, 2048, dtype=torch.int16)
    values = torch.cat([every[:1536], every[-1536:], torch.full((1, 1536), 2047, dtype=torch.int16)[0],
                        torch.full((1, 1536), -2047, dtype=torch.int16)[0]]).reshape(4, 1536)
    weight_t = layer.weight_t.clone()
    weight_t[:, 0], weight_t[:, 1] = 127, -127  # columns whose sums reach the largest magnitudes
    layer.weight_t.copy_(weight_t)
    if layer.blocked is not None:
        layer.blocked = layer.products_kernel.block(layer.weight_t)
    rows = int8_rows.QuantizedRows(values, torch.ones(4), (4,), torch.float32)
    got = layer.products(rows)[:4]
    assert torch.equal(got.long(), values.long() @ weight_t.long())
    assert got[2, 0] == 2047 * 127 * 1536


@pytest.mark.parametrize("kernel", [True, False])
def test_a_twelve_bit_int8_linear_is_the_textbook_product_and_16_times_closer_to_float(kernel):
    torch.manual_seed(3)
    linear = torch.nn.Linear(96, 40)
    layer = Int8Linear.from_linear(linear, input_bits=12)
    if not kernel:
        layer.blocked = None
    x = uneven_rows(33, 96, seed=3)
    x_scale = x.abs().amax(1, keepdim=True).clamp(min=1e-8) / 2047
    want = (torch.round(x / x_scale) @ layer.weight_t.float()) * x_scale * layer.weight_scale + layer.bias
    got = layer(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    with_weights_rounded = x @ (layer.weight_t.float() * layer.weight_scale) + layer.bias
    eight_bit = Int8Linear.from_linear(linear)
    assert (got - with_weights_rounded).abs().max() < (eight_bit(x) - with_weights_rounded).abs().max() / 8


def test_twelve_bit_inputs_too_wide_for_int32_products_are_refused():
    with pytest.raises(ValueError, match="at most 8191 features"):
        Int8Linear.from_linear(torch.nn.Linear(8192, 4), input_bits=12)
    Int8Linear.from_linear(torch.nn.Linear(8192, 4))  # 8-bit inputs: |products| <= 8192 x 128 x 128


@pytest.mark.parametrize("bits", int8_reference.INPUT_BITS)
def test_a_quantized_model_gives_the_same_bits_with_numba_and_without(bits, monkeypatch):
    model = random_model(300, hidden_size=64, intermediate_size=256)
    ids = torch.randint(5, 300, (6, 24), generator=torch.Generator().manual_seed(6))
    types = torch.zeros_like(ids)
    stats = calibrate(model, [(ids[i : i + 1], types[i : i + 1]) for i in range(len(ids))])
    monkeypatch.setattr("kernels.int8_layer.kernel", lambda: None)  # the modules: where numba would run
    quantized = quantize(copy.deepcopy(model), "per-token-smooth", stats, alpha=0.65, feed_forward_output_bits=bits)
    assert all(isinstance(layer.intermediate, Int8GeluIntermediate) and isinstance(layer.output, Int8ResidualNorm)
               and isinstance(layer.attention.output, Int8ResidualNorm) for layer in quantized.bert.encoder.layer)
    assert all(layer.output.dense.input_bits == bits and layer.attention.output.dense.input_bits == 8
               for layer in quantized.bert.encoder.layer)
    outputs = []
    with torch.no_grad():
        for numba in ((True, False) if int8_numba.AVAILABLE else (False,)):
            monkeypatch.setattr(int8_rows, "USE_NUMBA", numba)
            outputs.append(quantized.bert(ids, types)[0])
        alone = torch.cat([quantized.bert(ids[i : i + 1], types[i : i + 1])[0] for i in range(len(ids))])
        want = model.bert(ids, types)[0]
    assert all(torch.equal(out, outputs[0]) for out in outputs)
    assert F.cosine_similarity(outputs[0].flatten(0, 1), want.flatten(0, 1)).min() > 0.99
    assert torch.equal(outputs[0], alone)  # a row's result does not depend on its batch


def test_a_quantized_model_runs_outside_no_grad():
    """Its LayerNorm outputs carry autograd history there; the kernels read them all the same."""
    model = quantize(random_model(300, hidden_size=64, intermediate_size=256), "per-token")
    ids = torch.randint(5, 300, (2, 12))
    hidden = model.bert(ids, torch.zeros_like(ids))[0]
    assert hidden.shape == (2, 12, 64) and torch.isfinite(hidden).all()
