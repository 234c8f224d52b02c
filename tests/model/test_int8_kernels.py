"""The fused int8 kernels compute what the eager int8 steps compute, and the model gives the same answers
with them as without them (batched equal to single, as per-token quantization promises)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from model import int8_kernels
from model.int8_kernels import dequantize, dequantize_gelu_quantize, dequantize_residual_norm, quantize_rows
from model.quantize import Int8GeluIntermediate, Int8Linear, Int8ResidualNorm, calibrate, quantize
from tests.conftest import random_model

pytest.importorskip("numba")


def eager_quantize(x: torch.Tensor, inverse_smoothing: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The textbook per-row recipe: round(x s / (max|x s| / 127)), scale max|x s| / 127."""
    smoothed = x.float() * inverse_smoothing
    scale = smoothed.abs().amax(1).clamp(min=1e-8) / 127
    return torch.round(smoothed / scale[:, None]).to(torch.int8), scale


def test_quantize_rows_is_the_per_row_recipe_and_pads_short_inputs_with_zero_rows():
    torch.manual_seed(0)
    x = torch.randn(40, 96) * torch.linspace(0.1, 9, 96)  # uneven channels, as after LayerNorm
    x[7] = 0.0  # an all-zero row: scale 1e-8 / 127, values 0, nothing divides by zero
    s = torch.rand(96) + 0.5
    got = quantize_rows(x, s)
    values, scale = eager_quantize(x, s)
    torch.testing.assert_close(got.scale, scale, rtol=1e-6, atol=0)
    assert (got.values.int() - values.int()).abs().max() <= 1  # only an exact .5 may round the other way
    assert (got.values != values).float().mean() < 0.001
    assert got.shape == (40,) and got.dtype == torch.float32 and not got.values[7].any()

    short = quantize_rows(x[:5].reshape(5, 1, 96).bfloat16(), s)  # 5 rows: _int_mm needs 17, zeros below
    assert short.values.shape == (17, 96) and not short.values[5:].any()
    assert short.shape == (5, 1) and short.dtype == torch.bfloat16 and short.rows == 5


def test_dequantize_scales_rows_and_columns_and_adds_the_bias():
    torch.manual_seed(1)
    rows = quantize_rows(torch.randn(20, 32), torch.ones(32))
    products = torch.randint(-40000, 40000, (20, 48), dtype=torch.int32)
    column_scale, bias = torch.rand(48) / 100, torch.randn(48)
    want = products.float() * rows.scale[:, None] * column_scale + bias
    torch.testing.assert_close(dequantize(products, rows, column_scale, bias), want, rtol=1e-6, atol=1e-6)


def test_dequantize_gelu_quantize_is_gelu_then_quantize_even_far_out():
    torch.manual_seed(2)
    rows = quantize_rows(torch.randn(30, 16), torch.ones(16))
    products = torch.randint(-3000, 3000, (30, 64), dtype=torch.int32)
    column_scale, bias = torch.rand(64) / 200, torch.randn(64) * 3
    bias[:4] = torch.tensor([60.0, -60.0, 8.0, -8.0])  # far past where erf is 1 in float32, both signs
    next_scale = torch.rand(64) + 0.5
    got = dequantize_gelu_quantize(products, rows, column_scale, bias, next_scale)
    activation = F.gelu(products.float() * rows.scale[:, None] * column_scale + bias)
    values, scale = eager_quantize(activation, next_scale)
    assert torch.isfinite(got.scale).all()
    torch.testing.assert_close(got.scale, scale, rtol=2e-6, atol=0)
    assert (got.values.int() - values.int()).abs().max() <= 1


def test_dequantize_residual_norm_is_layer_norm_of_product_bias_and_residual():
    torch.manual_seed(4)
    rows = quantize_rows(torch.randn(2, 9, 32), torch.ones(32))  # 18 rows, in a (2, 9) layout
    products = torch.randint(-30000, 30000, (18, 48), dtype=torch.int32)
    column_scale, bias = torch.rand(48) / 100, torch.randn(48)
    residual = torch.randn(2, 9, 48) * 4 + 30  # far from zero mean: a one-pass variance would lose digits here
    weight, norm_bias = torch.rand(48) + 0.5, torch.randn(48)
    summed = (products.float() * rows.scale[:, None] * column_scale + bias).reshape(2, 9, 48) + residual
    want = F.layer_norm(summed, (48,), weight, norm_bias, eps=1e-12)
    got = dequantize_residual_norm(products, rows, column_scale, bias, residual, weight, norm_bias, 1e-12)
    assert got.shape == (2, 9, 48) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    as_bf16 = dequantize_residual_norm(products, rows, column_scale, bias, residual.bfloat16(), weight, norm_bias, 1e-12)
    assert as_bf16.dtype == torch.bfloat16



def test_int8_linear_gives_the_same_result_with_and_without_the_kernels(monkeypatch):
    torch.manual_seed(3)
    linear = torch.nn.Linear(64, 80)
    layer = Int8Linear.from_linear(linear, torch.rand(64) + 0.5)
    x = torch.randn(3, 11, 64)
    with torch.no_grad():
        fused = layer(x)
        monkeypatch.setattr(int8_kernels, "AVAILABLE", False)
        eager = layer(x)
    assert fused.shape == eager.shape == (3, 11, 80)
    torch.testing.assert_close(fused, eager, rtol=1e-4, atol=1e-4)


def test_a_quantized_model_answers_alike_with_and_without_the_kernels(monkeypatch):
    model = random_model(300, hidden_size=64, intermediate_size=256)
    ids = torch.randint(5, 300, (6, 24))
    types = torch.zeros_like(ids)
    stats = calibrate(model, [(ids[i : i + 1], types[i : i + 1]) for i in range(len(ids))])
    fused = quantize(copy.deepcopy(model), "per-token-smooth", stats, alpha=0.65)
    assert all(isinstance(layer.intermediate, Int8GeluIntermediate) and isinstance(layer.output, Int8ResidualNorm)
               and isinstance(layer.attention.output, Int8ResidualNorm) for layer in fused.bert.encoder.layer)
    monkeypatch.setattr(int8_kernels, "AVAILABLE", False)
    eager = quantize(copy.deepcopy(model), "per-token-smooth", stats, alpha=0.65)
    assert not any(isinstance(layer.intermediate, Int8GeluIntermediate) or isinstance(layer.output, Int8ResidualNorm)
                   for layer in eager.bert.encoder.layer)
    with torch.no_grad():
        want = eager.bert(ids, types)[0]
        monkeypatch.setattr(int8_kernels, "AVAILABLE", True)
        got = fused.bert(ids, types)[0]
        alone = torch.cat([fused.bert(ids[i : i + 1], types[i : i + 1])[0] for i in range(len(ids))])
    assert F.cosine_similarity(got.flatten(0, 1), want.flatten(0, 1)).min() > 0.999
    torch.testing.assert_close(got, alone, rtol=1e-5, atol=1e-5)  # a row's result does not depend on its batch


def test_a_quantized_model_runs_outside_no_grad():
    """Its LayerNorm outputs carry autograd history there; the kernels read them all the same."""
    model = quantize(random_model(300, hidden_size=64, intermediate_size=256), "per-token")
    ids = torch.randint(5, 300, (2, 12))
    hidden = model.bert(ids, torch.zeros_like(ids))[0]
    assert hidden.shape == (2, 12, 64) and torch.isfinite(hidden).all()
