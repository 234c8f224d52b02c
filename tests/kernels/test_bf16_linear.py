"""bfloat16 Linear layers on AMX's tiles (kernels/bf16_linear.py, kernels/c/bf16_products_amx.c): each output within
its bfloat16 rounding of float32 products of the same numbers, at every row tail and column tail; a row's result the
same bits whatever rows come with it; `TiledLinear` the same module as the Linear it replaces, falling back to torch
wherever the tiles do not serve; and what a bfloat16 model served on a CPU runs."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from kernels import bf16_linear
from service.engine.precision import Precision, prepare_model
from tests.conftest import random_model

TILES = bf16_linear.kernel()
needs_tiles = pytest.mark.skipif(TILES is None, reason=f"no bfloat16 tile products here: {bf16_linear.why_not()}")


def exact_and_tolerance(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 products of the same bfloat16 numbers, and how far a bfloat16 result may be: half a bfloat16 step of
    the value (2^-9 of it, with a factor of two to spare) and float32's summation error."""
    exact = x.float() @ weight.float().T + bias
    return exact, 2 ** -8 * exact.abs() + 1e-5 * (x.float().abs() @ weight.float().abs().T + bias.abs())


@needs_tiles
@pytest.mark.parametrize("rows", [1, 2, 15, 16, 17, 31, 33, 130, 300])
@pytest.mark.parametrize("inputs, outputs", [(384, 1152), (1536, 384), (32, 10), (64, 70), (96, 16)])
def test_tile_products_are_float32_products_rounded_to_bfloat16(rows, inputs, outputs):
    generator = torch.Generator().manual_seed(rows * 7 + outputs)
    x = torch.randn(rows, inputs, generator=generator).bfloat16()
    weight = (torch.randn(outputs, inputs, generator=generator) / inputs ** 0.5).bfloat16()
    bias = torch.randn(outputs, generator=generator)
    got = TILES.linear(x, TILES.block(weight), bias, outputs).float()
    exact, tolerance = exact_and_tolerance(x, weight, bias)
    assert bool(((got - exact).abs() <= tolerance).all())


@needs_tiles
def test_a_wrong_layout_would_show():
    """The check above can fail: weights laid out for another input width are far off."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(20, 64, generator=generator).bfloat16()
    weight = torch.randn(48, 64, generator=generator).bfloat16()
    bias = torch.zeros(48)
    wrong = TILES.block(weight.reshape(96, 32)).view(-1)  # the same numbers, blocked as a (96, 32) matrix
    got = TILES.linear(x, wrong, bias, 48).float()
    exact, tolerance = exact_and_tolerance(x, weight, bias)
    assert not bool(((got - exact).abs() <= tolerance).all())


@needs_tiles
@pytest.mark.parametrize("threads", [1, 2, 5])
def test_a_rows_result_does_not_depend_on_the_batch_or_the_threads(threads):
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(70, 384, generator=generator).bfloat16()
    weight, bias = torch.randn(200, 384, generator=generator).bfloat16(), torch.randn(200, generator=generator)
    blocked = TILES.block(weight)
    batched = TILES.linear(x, blocked, bias, 200, threads)
    for first, count in ((0, 1), (3, 16), (17, 20), (69, 1)):
        alone = TILES.linear(x[first:first + count], blocked, bias, 200, 1)
        assert torch.equal(batched[first:first + count], alone)


@needs_tiles
def test_the_kernel_refuses_what_it_cannot_take():
    blocked = TILES.block(torch.zeros(16, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="multiple of 32"):
        TILES.block(torch.zeros(16, 40, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="bfloat16 rows"):
        TILES.linear(torch.zeros(3, 64), blocked, torch.zeros(16), 16)
    with pytest.raises(ValueError, match="float32 bias of 16"):
        TILES.linear(torch.zeros(3, 64, dtype=torch.bfloat16), blocked, torch.zeros(15), 16)


@needs_tiles
def test_tiled_linear_is_the_linear_it_replaces():
    torch.manual_seed(0)
    linear = nn.Linear(64, 70).bfloat16()
    tiled = bf16_linear.TiledLinear(linear, TILES)
    assert tiled.state_dict().keys() == linear.state_dict().keys() and tiled.weight is linear.weight
    x = torch.randn(2, 9, 64).bfloat16()
    with torch.no_grad():
        got, expected = tiled(x), linear(x)
    assert got.shape == expected.shape == (2, 9, 70)
    exact, tolerance = exact_and_tolerance(x.reshape(-1, 64), linear.weight, linear.bias.float())
    assert bool(((got.reshape(-1, 70).float() - exact).abs() <= tolerance).all())
    # a changed weight is laid out again
    with torch.no_grad():
        linear.weight.mul_(-1)
        assert torch.allclose(tiled(x).float(), -got.float() + 2 * linear.bias.float(), atol=0.05, rtol=0.02)


@needs_tiles
def test_a_copy_of_a_tiled_linear_lays_out_its_own_weights():
    torch.manual_seed(2)
    tiled = bf16_linear.TiledLinear(nn.Linear(64, 16).bfloat16(), TILES)
    x = torch.randn(3, 64).bfloat16()
    with torch.no_grad():
        before = tiled(x)
        copied = copy.deepcopy(tiled)
        tiled.weight.zero_()  # the original changes; the copy keeps its own weights
        assert torch.equal(copied(x), before)
        assert not torch.equal(tiled(x), before)


@needs_tiles
def test_tiled_linear_falls_back_to_torch_where_the_tiles_do_not_serve(monkeypatch):
    torch.manual_seed(1)
    tiled = bf16_linear.TiledLinear(nn.Linear(64, 16).bfloat16(), TILES)

    def no_tiles(*args):
        raise AssertionError("the tiles ran")

    monkeypatch.setattr(TILES, "linear", no_tiles)
    x = torch.randn(4, 64).bfloat16()
    assert tiled(x.requires_grad_()).requires_grad  # gradients asked for
    with torch.no_grad():
        tiled(torch.randn(bf16_linear.MOST_ROWS + 1, 64).bfloat16())  # a bulk batch: torch's products
        tiled.float()
        assert tiled(torch.randn(4, 64)).dtype == torch.float32  # float32


@needs_tiles
def test_a_bfloat16_model_served_on_a_cpu_runs_its_encoder_linears_on_the_tiles(tokenizer):
    model = prepare_model(random_model(tokenizer.vocab_size), Precision("bfloat16", torch.bfloat16), tokenizer,
                          torch.device("cpu"))
    tiled = [m for m in model.modules() if isinstance(m, bf16_linear.TiledLinear)]
    assert len(tiled) == 2 * 4  # fused qkv, attention output, intermediate, output: each layer
    assert all(m in set(model.bert.encoder.modules()) for m in tiled)  # the heads keep torch's Linear


@pytest.mark.parametrize("dtype, device", [(torch.float32, "cpu"), (torch.bfloat16, "cuda")])
def test_other_precisions_and_devices_keep_torchs_linear(tokenizer, dtype, device):
    name = str(dtype).removeprefix("torch.")
    model = prepare_model(random_model(tokenizer.vocab_size), Precision(name, dtype), tokenizer, torch.device(device))
    assert not any(isinstance(m, bf16_linear.TiledLinear) for m in model.modules())


@needs_tiles
def test_a_tiled_bfloat16_model_answers_as_the_untiled_one(tokenizer):
    plain = random_model(tokenizer.vocab_size).bfloat16()
    tiled = prepare_model(random_model(tokenizer.vocab_size), Precision("bfloat16", torch.bfloat16), tokenizer,
                          torch.device("cpu")).bfloat16()
    ids = torch.randint(5, tokenizer.vocab_size, (3, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = plain.bert(ids)[0].float()
        got = tiled.bert(ids)[0].float()
    assert torch.nn.functional.cosine_similarity(got.reshape(-1, 64), expected.reshape(-1, 64)).min() > 0.999
