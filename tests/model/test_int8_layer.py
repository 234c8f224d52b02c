"""Whole int8 layers in one C call (model/int8_layer.c): the same outputs as the layer's own int8 modules (to float
rounding), at any length; batched equal to single and several threads equal to one (bit for bit); and the modules
wherever the call cannot take the input."""

from __future__ import annotations

import pytest
import torch

from model import attention_kernel, int8_layer
from model.bert import BertLayer
from model.packing import Packing
from model.quantize import quantize
from tests.conftest import random_model

LAYER = int8_layer.kernel()
pytestmark = pytest.mark.skipif(LAYER is None, reason=f"no int8 layer kernel here: {int8_layer.why_not()}")


def int8_model(tokenizer, monkeypatch=None, fused: bool = True):
    if not fused:
        monkeypatch.setattr(int8_layer, "kernel", lambda: None)
    return quantize(random_model(tokenizer.vocab_size), "per-token")


def packed_input(lengths: list[int], hidden: int = 64, seed: int = 0) -> tuple[torch.Tensor, Packing]:
    x = torch.randn(sum(lengths), hidden, generator=torch.Generator().manual_seed(seed)) * 2
    return x, Packing.from_lengths(lengths)


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def test_quantize_fuses_every_layer_and_keeps_the_parameter_names(tokenizer, monkeypatch):
    fused = int8_model(tokenizer)
    assert all(isinstance(layer, int8_layer.Int8FusedLayer) for layer in fused.bert.encoder.layer)
    plain = int8_model(tokenizer, monkeypatch, fused=False)
    assert not any(isinstance(layer, int8_layer.Int8FusedLayer) for layer in plain.bert.encoder.layer)
    assert fused.state_dict().keys() == plain.state_dict().keys()


@pytest.mark.parametrize("lengths", [[1], [34], [40, 1, 17, 5], [attention_kernel.MAX_LENGTH + 30, 2],
                                     [120, 90, 3]])  # the last: two chunks of rows, a sequence across their boundary
@pytest.mark.parametrize("count", [1, 3])
def test_the_c_layer_matches_the_layers_modules(tokenizer, threads, lengths, count):
    layer = int8_model(tokenizer).bert.encoder.layer[0]
    x, packing = packed_input(lengths)
    threads(count)
    with torch.inference_mode():
        got, expected = layer(x, packing), BertLayer.forward(layer, x, packing)
    # Outputs are LayerNorm'd; the two sum in different orders, and a value within rounding of a quantization
    # step may round to the neighbouring one.
    assert got.shape == expected.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, atol=int8_layer.CHECK_TOLERANCE, rtol=0)
    assert (got - expected).abs().median() < 1e-5


def test_several_threads_and_batching_change_no_bit(tokenizer, threads):
    layer = int8_model(tokenizer).bert.encoder.layer[0]
    lengths = [30, 1, 17, 120, 5, 100, 64]  # 337 rows: two chunks
    x, packing = packed_input(lengths, seed=1)
    with torch.inference_mode():
        threads(1)
        alone = layer(x, packing)
        for count in (2, 3, 7):
            threads(count)
            assert torch.equal(layer(x, packing), alone)
        for (start, length) in packing.spans:  # each sequence by itself
            single = layer(x[start:start + length], Packing.from_lengths([length]))
            assert torch.equal(single, alone[start:start + length])


def test_a_whole_int8_model_gives_the_embeddings_of_its_modules(tokenizer, monkeypatch):
    fused = int8_model(tokenizer)
    ids = torch.randint(5, tokenizer.vocab_size, (60,), generator=torch.Generator().manual_seed(3))
    packing = Packing.from_lengths([25, 9, 26])
    with torch.inference_mode():
        got, _ = fused.encode_packed(ids, torch.zeros_like(ids), packing, for_heads=False)
        plain = int8_model(tokenizer, monkeypatch, fused=False)
        expected, _ = plain.encode_packed(ids, torch.zeros_like(ids), packing, for_heads=False)
    assert torch.nn.functional.cosine_similarity(got, expected).min() > 0.999


@pytest.mark.parametrize("case", ["selected rows", "bfloat16", "padded input", "gradients"])
def test_the_modules_take_what_the_c_layer_does_not(tokenizer, monkeypatch, case):
    layer = int8_model(tokenizer).bert.encoder.layer[1]

    def refuse(*args):
        raise AssertionError("the C layer was called")

    monkeypatch.setattr(LAYER, "run", refuse)
    x, packing = packed_input([12, 7])
    keep = None
    if case == "selected rows":
        x, packing, keep = x.view(1, 19, 64)[:, :12], None, torch.ones(1, 12, dtype=torch.bool)
    elif case == "bfloat16":
        x = x.bfloat16()
    elif case == "padded input":
        x, packing = x.view(1, 19, 64), None
    elif case == "gradients":
        x.requires_grad_(True)
    out = layer(x, packing, keep)
    assert torch.isfinite(out.float()).all()


def test_run_refuses_what_it_cannot_compute(tokenizer):
    layer = int8_model(tokenizer).bert.encoder.layer[0]
    x, packing = packed_input([5])
    with pytest.raises(ValueError, match=r"packed float32 \(5, 64\) rows"):
        LAYER.run(layer.weights, x.double(), packing)
    with pytest.raises(ValueError, match=r"not \(6, 64\)"):
        LAYER.run(layer.weights, torch.zeros(6, 64), packing)
