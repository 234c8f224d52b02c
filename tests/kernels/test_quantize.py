"""int8 Linear layers: close to float, batch-invariant per token, and SmoothQuant leaves the function unchanged."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from kernels.int8_modules import Int8Linear
from kernels.quantize import SCHEMES, InputScale, calibrate, quantize, smoothing
from tests.conftest import random_model


def test_int8_linear_is_close_to_float_and_its_rows_do_not_depend_on_the_batch():
    torch.manual_seed(0)
    linear = nn.Linear(64, 96)
    x = torch.randn(40, 64)
    x[:, 3] *= 30  # an outlier channel, as LayerNorm outputs have
    quantized = Int8Linear.from_linear(linear)
    with torch.no_grad():
        want, got = linear(x), quantized(x)
        alone = torch.cat([quantized(x[i : i + 1]) for i in range(len(x))])
    assert torch.equal(got, alone)  # per-token scales: a row's result is the same in any batch
    assert ((got - want).norm() / want.norm()).item() < 0.02


def test_fused_int8_linear_equals_its_parts_side_by_side_and_follows_bfloat16_input():
    torch.manual_seed(2)
    parts = [nn.Linear(64, 32) for _ in range(3)]
    x = torch.randn(24, 64)
    fused = Int8Linear.fused(parts)
    with torch.no_grad():
        got = fused(x)
        # One quantization of x for the three: the same as three layers quantizing the same x.
        torch.testing.assert_close(got, torch.cat([Int8Linear.from_linear(p)(x) for p in parts], -1))
        want = torch.cat([p(x) for p in parts], -1)
        assert ((got - want).norm() / want.norm()).item() < 0.02
        in_bf16 = fused(x.bfloat16())
    assert in_bf16.dtype == torch.bfloat16
    assert ((in_bf16.float() - want).norm() / want.norm()).item() < 0.03


def test_casting_a_quantized_model_to_bfloat16_leaves_the_int8_constants_exact():
    model = quantize(random_model(300), "per-token")
    layer = model.bert.encoder.layer[0].attention.self.fused_qkv
    scale = layer.weight_scale.clone()
    model.to(torch.bfloat16)
    assert layer.weight_t.dtype == torch.int8 and layer.weight_scale.dtype == torch.float32
    assert torch.equal(layer.weight_scale, scale)
    assert model.bert.encoder.layer[0].output.LayerNorm.weight.dtype == torch.bfloat16


def test_smoothing_moves_scale_into_the_weights_without_changing_the_function():
    torch.manual_seed(1)
    linear = nn.Linear(32, 16)
    x = torch.randn(8, 32) * torch.linspace(0.1, 20, 32)
    s = smoothing(x.abs().amax(0), linear.weight, alpha=0.5)
    smoothed = nn.Linear(32, 16)
    with torch.no_grad():
        smoothed.weight.copy_(linear.weight * s)
        smoothed.bias.copy_(linear.bias)
        torch.testing.assert_close(smoothed(InputScale(1 / s)(x)), linear(x), rtol=1e-5, atol=1e-5)
    # ... and the smoothed input's channels are far more even
    spread = lambda t: (t.abs().amax(0).max() / t.abs().amax(0).min()).item()  # noqa: E731
    assert spread(x / s) < spread(x) / 5


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_keeps_a_models_embeddings(scheme):
    model = random_model(300, hidden_size=64, intermediate_size=256)
    ids = torch.randint(5, 300, (6, 24))
    types = torch.zeros_like(ids)
    with torch.no_grad():
        want = model.bert(ids, types)[0].mean(1)
    stats = calibrate(model, [(ids[i : i + 1], types[i : i + 1]) for i in range(len(ids))])
    quantized = quantize(copy.deepcopy(model), scheme, stats)
    with torch.no_grad():
        got = quantized.bert(ids, types)[0].mean(1)
    assert torch.nn.functional.cosine_similarity(got, want).min() > 0.995
    linears = [m for m in quantized.bert.encoder.modules() if isinstance(m, nn.Linear)]
    assert linears == []  # every encoder Linear was replaced
    assert quantized.cls.predictions.decoder.weight.dtype == torch.float32  # the heads stay float
    if not scheme.startswith("per-token"):
        return  # per-tensor scales depend on what else is in the tensor, so the check below is per-token's only
    # fill-mask's path (queries only for the kept tokens) gives what the full pass gives for them
    keep = torch.zeros_like(ids, dtype=torch.bool)
    keep[:, 3] = True
    with torch.no_grad():
        torch.testing.assert_close(quantized.bert.encoder(quantized.bert.embeddings(ids, types), None, keep_last=keep),
                                   quantized.bert(ids, types)[0][:, 3], rtol=1e-4, atol=1e-4)


def test_keep_leaves_named_layers_in_float_and_smoothing_needs_statistics():
    model = random_model(300)
    kept = quantize(copy.deepcopy(model), "per-token", keep=("output.dense",))
    floats = [name for name, m in kept.bert.encoder.named_modules() if isinstance(m, nn.Linear)]
    assert len(floats) == 2 * 2 and all(name.endswith("output.dense") for name in floats)  # FFN and attention outputs, 2 layers
    with pytest.raises(ValueError, match="needs calibration"):
        quantize(copy.deepcopy(model), "per-token-smooth")
    with pytest.raises(ValueError, match="unknown int8 scheme"):
        quantize(copy.deepcopy(model), "int4")
