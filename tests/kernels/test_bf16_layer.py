"""Whole bfloat16 layers in one C call on AMX (kernels/bf16_layer.py, kernels/c/bf16_layer_amx.c): within bfloat16's
rounding of the layer's own modules, a sequence the same bits alone or in any batch and on any thread count, the
modules wherever the call does not serve, and what a bfloat16 model served on a CPU runs."""

from __future__ import annotations

import copy

import pytest
import torch

from kernels import bf16_layer, bf16_linear
from model.config import BertConfig
from model.fuse import fuse_attention_projections
from model.packing import Packing
from service.engine.precision import Precision, prepare_model
from tests.conftest import random_model

FUSED = bf16_layer.kernel()
needs_fused = pytest.mark.skipif(FUSED is None, reason=f"no bfloat16 C layer here: {bf16_layer.why_not()}")


def layer_and_rows(lengths: list[int], heads: int = 4, head_dim: int = 32, spare_rows: int = 0, seed: int = 0,
                   hidden_act: str = "gelu"):
    config = BertConfig(vocab_size=64, hidden_size=heads * head_dim, num_hidden_layers=1, num_attention_heads=heads,
                        intermediate_size=4 * heads * head_dim, max_position_embeddings=520, hidden_act=hidden_act)
    generator = torch.Generator().manual_seed(seed)
    layer = bf16_layer.random_layer(config, generator)
    packing = Packing.from_lengths(lengths, spare_rows=spare_rows)
    x = (torch.randn(packing.tokens + spare_rows, config.hidden_size, generator=generator) * 2).bfloat16()
    return layer, packing, x, config


def modules_and_fused(layer, packing, x, threads=None):
    with torch.no_grad():
        expected = layer(x, packing)
        got = FUSED.run(bf16_layer.LayerWeights(layer), x, packing, threads)
    return expected, got


@needs_fused
@pytest.mark.parametrize("lengths, heads, head_dim, spare_rows", [
    ([21], 12, 32, 3), ([1, 5, 16, 17, 40], 4, 32, 0), ([130, 2, 256], 6, 64, 8), ([512], 2, 32, 0),
])
def test_the_c_layer_is_its_modules_within_bfloat16_rounding(lengths, heads, head_dim, spare_rows):
    layer, packing, x, _ = layer_and_rows(lengths, heads, head_dim, spare_rows)
    expected, got = modules_and_fused(layer, packing, x)
    difference = (got.float() - expected.float()).abs()
    # the outputs are LayerNorm's, about 1 in size, a bfloat16 step 2^-8 of that: a few steps at most
    assert float(difference.mean()) < 2 ** -8 and float(difference.max()) < 2 ** -4
    assert bool(torch.isfinite(got).all())


@needs_fused
def test_a_wrong_wiring_would_show():
    """The check above can fail: the layer's LayerNorms swapped move the outputs by their own size."""
    layer, packing, x, _ = layer_and_rows([40, 7])
    expected, _ = modules_and_fused(layer, packing, x)
    swapped = copy.deepcopy(layer)
    first, second = swapped.attention.output.LayerNorm, swapped.output.LayerNorm
    with torch.no_grad():
        first.weight.copy_(layer.output.LayerNorm.weight)
        second.weight.copy_(layer.attention.output.LayerNorm.weight)
        first.bias.copy_(layer.output.LayerNorm.bias)
        second.bias.copy_(layer.attention.output.LayerNorm.bias)
    _, wrong = modules_and_fused(swapped, packing, x)
    assert float((wrong.float() - expected.float()).abs().max()) > 2 ** -3


@needs_fused
@pytest.mark.parametrize("threads", [1, 2, 5])
def test_a_sequence_gets_the_same_bits_alone_in_a_batch_and_on_any_thread_count(threads):
    lengths = [30, 1, 70, 17]
    layer, packing, x, _ = layer_and_rows(lengths, spare_rows=2)
    weights = bf16_layer.LayerWeights(layer)
    batched = FUSED.run(weights, x, packing, threads)
    for (start, length) in packing.spans:
        alone = FUSED.run(weights, x[start:start + length], Packing.from_lengths([length]), 1)
        assert torch.equal(batched[start:start + length], alone)


@needs_fused
def test_the_fused_layer_runs_the_call_only_where_it_serves(monkeypatch):
    layer, packing, x, _ = layer_and_rows([20, 9])
    fused = bf16_layer.BFloat16FusedLayer(layer, FUSED)
    calls = []
    monkeypatch.setattr(FUSED, "run", lambda *args: calls.append(args) or layer(args[1], args[2]))
    with torch.no_grad():
        fused(x, packing)
        assert len(calls) == 1  # packed bfloat16 rows on a CPU
        fused(x, Packing.from_lengths([20, 9], keys=[20, 5]))  # a packing that restricts keys
        big = Packing.from_lengths([bf16_linear.MOST_ROWS + 1])
        fused(torch.zeros(bf16_linear.MOST_ROWS + 1, x.shape[1], dtype=torch.bfloat16), big)  # a bulk batch
    fused(x, packing)  # gradients may be asked for: the modules
    assert len(calls) == 1
    with torch.no_grad():
        fused.float()(x.float(), packing)  # float32
    assert len(calls) == 1


@needs_fused
def test_a_fused_layer_follows_its_parameters_and_copies():
    layer, packing, x, _ = layer_and_rows([12, 3])
    fused = bf16_layer.BFloat16FusedLayer(layer, FUSED)
    with torch.no_grad():
        before = fused(x, packing)
        copied = copy.deepcopy(fused)
        fused.output.LayerNorm.bias.add_(1.0)  # a changed parameter is read again
        assert torch.allclose(fused(x, packing).float(), before.float() + 1.0, atol=0.05)
        assert torch.equal(copied(x, packing), before)  # the copy kept its own


def test_layers_the_c_layer_does_not_compute_stay_modules(tokenizer):
    model = random_model(tokenizer.vocab_size, hidden_act="gelu_new")  # GELU's tanh approximation
    prepared = prepare_model(model, Precision("bfloat16", torch.bfloat16), tokenizer, torch.device("cpu"))
    assert not any(isinstance(m, bf16_layer.BFloat16FusedLayer) for m in prepared.modules())


@needs_fused
def test_a_bfloat16_model_served_on_a_cpu_runs_each_layer_in_one_call(tokenizer):
    model = prepare_model(random_model(tokenizer.vocab_size), Precision("bfloat16", torch.bfloat16), tokenizer,
                          torch.device("cpu"))
    layers = list(model.bert.encoder.layer)
    assert all(isinstance(layer, bf16_layer.BFloat16FusedLayer) for layer in layers)
    served_as_before = fuse_attention_projections(random_model(tokenizer.vocab_size))
    assert model.state_dict().keys() == served_as_before.state_dict().keys()  # the same parameters, the same names


@needs_fused
def test_a_bfloat16_model_on_the_tiles_gets_batches_the_one_call_takes(tokenizer):
    """cpu_batch_tokens auto: a batch of more than bf16_linear.MOST_ROWS rows would run the modules, slower."""
    from service.engine.engine import Engine
    from service.engine.loader import batch_tokens_on_cpu
    from service.engine.options import EngineOptions

    cpu, options = torch.device("cpu"), EngineOptions(checkpoint="unused")
    for dtype, expected in ((torch.bfloat16, bf16_linear.MOST_ROWS), (torch.float32, 8192)):
        precision = Precision(str(dtype).removeprefix("torch."), dtype)
        engine = Engine(prepare_model(random_model(tokenizer.vocab_size), precision, tokenizer, cpu), cpu, dtype)
        # a 128-wide feed-forward alone would give 6 MiB / (128 x 2 or 4 bytes), capped at max_batch_tokens
        assert batch_tokens_on_cpu(options, engine, tokenizer, precision) == expected
