"""Whole int8 layers in one C call (kernels/c/int8_layer.c, int8_layer_amx.c where the CPU has AMX, or
int8_layer_avx2.c where it has AVX2 alone): the
reference formulas' bits, and the layer's own int8 modules' wherever both run the same attention; batched equal to
single and several threads equal to one (bit for bit); the modules wherever the call cannot take the input; and no
cast or move of the model that would leave the C layer reading stale constants."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from devkit.paths import REPO_ROOT

from kernels import attention, int8_layer, int8_reference
from kernels.quantize import quantize
from model.bert import BertLayer
from model.config import BertConfig
from model.packing import Packing
from tests.conftest import random_model

LAYER = int8_layer.kernel()
pytestmark = pytest.mark.skipif(LAYER is None, reason=f"no int8 layer kernel here: {int8_layer.why_not()}")


def int8_model(tokenizer, monkeypatch=None, fused: bool = True, bits: int = 8):
    """`bits`: the feed-forward output layers' inputs' (8, or 12 as a late-interaction model's)."""
    if not fused:
        monkeypatch.setattr(int8_layer, "kernel", lambda: None)
    return quantize(random_model(tokenizer.vocab_size), "per-token", feed_forward_output_bits=bits)


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


@pytest.mark.parametrize("lengths", [[1], [34], [40, 1, 17, 5], [attention.MAX_LENGTH + 30, 2],
                                     [120, 90, 3]])  # the last: two chunks of rows, a sequence across their boundary
@pytest.mark.parametrize("count", [1, 3])
@pytest.mark.parametrize("bits", int8_reference.INPUT_BITS)
def test_the_c_layer_gives_the_reference_bits_and_the_modules_bits(tokenizer, threads, lengths, count, bits):
    layer = int8_model(tokenizer, bits=bits).bert.encoder.layer[0]
    assert isinstance(layer, int8_layer.Int8FusedLayer) and layer.output.dense.input_bits == bits
    x, packing = packed_input(lengths)
    threads(count)
    with torch.inference_mode():
        got, modules = layer(x, packing), BertLayer.forward(layer, x, packing)
        constants = int8_layer.layer_constants(layer)
        reference = int8_reference.layer_forward(constants, x, packing.spans, attention.kernel().attend_spans)
        with_torch_attention = int8_reference.layer_forward(constants, x, packing.spans)
    assert got.shape == x.shape and got.dtype == torch.float32
    assert torch.equal(got, reference)  # the same formulas and attention: the same bits
    for start, length in packing.spans:
        if length <= attention.MAX_LENGTH:  # the modules run the same attention kernel there: the same bits
            assert torch.equal(got[start:start + length], modules[start:start + length])
        else:  # torch's attention there: its rounding, which a quantization step may amplify to one step
            torch.testing.assert_close(got[start:start + length], modules[start:start + length], atol=0.05, rtol=0)
    # against torch's attention at every length: within the rounding of attention, amplified the same way
    torch.testing.assert_close(got, with_torch_attention, atol=0.05, rtol=0)
    assert (got - with_torch_attention).abs().median() < 1e-5


@pytest.mark.skipif(int8_layer.amx_kernel() is None or int8_layer.vnni_kernel() is None,
                    reason=f"no AMX C layer here: {int8_layer.amx_kernel.why_not()}")
@pytest.mark.parametrize("bits", int8_reference.INPUT_BITS)
def test_the_amx_layer_gives_the_vnni_layers_bits_at_minilms_shape(threads, bits):
    """AMX's tiles take 16 rows and 64 inputs at a time; the rows left over run on VNNI's loops: every row count
    below is a different split, and all-MiniLM-L6-v2's widths (384, 1,536) the tiles' real work."""
    config = BertConfig(vocab_size=64, hidden_size=384, num_hidden_layers=1, num_attention_heads=12,
                        intermediate_size=1536, max_position_embeddings=512)
    layer = int8_layer.random_int8_layer(config, torch.Generator().manual_seed(2), contract_input_bits=bits)
    weights = int8_layer.LayerWeights(layer)
    amx, vnni = int8_layer.amx_kernel(), int8_layer.vnni_kernel()
    for lengths in ([1], [15], [16], [40, 7, 33], [200, 9]):  # 200 + 9: a chunk of 192 rows and a tail
        x, packing = packed_input(lengths, hidden=384, seed=len(lengths))
        for count in (1, 2):
            assert torch.equal(amx.run(weights, x, packing, count), vnni.run(weights, x, packing, count)), lengths


@pytest.mark.parametrize("bits", int8_reference.INPUT_BITS)
def test_several_threads_and_batching_change_no_bit(tokenizer, threads, bits):
    layer = int8_model(tokenizer, bits=bits).bert.encoder.layer[0]
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


@pytest.mark.parametrize("bits", int8_reference.INPUT_BITS)
def test_a_whole_int8_model_gives_the_embeddings_of_its_modules(tokenizer, monkeypatch, bits):
    fused = int8_model(tokenizer, bits=bits)
    ids = torch.randint(5, tokenizer.vocab_size, (60,), generator=torch.Generator().manual_seed(3))
    packing = Packing.from_lengths([25, 9, 26])
    with torch.inference_mode():
        got, _ = fused.encode_packed(ids, torch.zeros_like(ids), packing, for_heads=False)
        plain = int8_model(tokenizer, monkeypatch, fused=False, bits=bits)
        expected, _ = plain.encode_packed(ids, torch.zeros_like(ids), packing, for_heads=False)
    assert torch.equal(got, expected)  # short sequences: the same attention kernel, the same formulas


@pytest.mark.parametrize("case", ["selected rows", "bfloat16", "padded input", "gradients"])
@pytest.mark.parametrize("bits", int8_reference.INPUT_BITS)
def test_the_modules_take_what_the_c_layer_does_not(tokenizer, monkeypatch, case, bits):
    layer = int8_model(tokenizer, bits=bits).bert.encoder.layer[1]

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


@pytest.mark.parametrize("cast", ["bfloat16", "float64"])
def test_a_cast_of_the_model_reaches_what_the_c_layer_reads(tokenizer, cast):
    """A cast gives the LayerNorms new tensors; the C layer must read those, as the modules do, not the old ones."""
    model = int8_model(tokenizer)
    layer = model.bert.encoder.layer[0]
    x, packing = packed_input([20, 7])
    with torch.inference_mode():
        before = layer(x, packing)
        model.to(getattr(torch, cast))
        after, modules = layer(x, packing), BertLayer.forward(layer, x, packing)
    assert torch.equal(after, modules)  # float32 input: the C layer, and the modules, on the cast parameters
    assert not torch.equal(after, before) if cast == "bfloat16" else torch.equal(after, before)


def test_a_copy_of_the_model_reads_its_own_constants(tokenizer):
    model = int8_model(tokenizer)
    copied = copy.deepcopy(model)
    x, packing = packed_input([20, 7])
    with torch.inference_mode():
        before = copied.bert.encoder.layer[0](x, packing)
        model.bert.encoder.layer[0].output.LayerNorm.weight.add_(1.0)  # the original changes in place
        after = copied.bert.encoder.layer[0](x, packing)
        changed = model.bert.encoder.layer[0](x, packing)
    assert torch.equal(after, before) and not torch.equal(changed, before)


@pytest.mark.parametrize("move, message", [(lambda m: m.to("meta"), "computes on a CPU only"),
                                           (lambda m: m.type(torch.float16), "keeps int8 weights")])
def test_moving_an_int8_model_off_the_cpu_is_refused_before_anything_moves(tokenizer, move, message):
    model = int8_model(tokenizer)
    layer = model.bert.encoder.layer[1]
    with pytest.raises(ValueError, match=f"Int8FusedLayer {message}"):
        move(layer)
    x, packing = packed_input([9])
    with torch.inference_mode():
        assert torch.equal(layer(x, packing), BertLayer.forward(layer, x, packing))  # still whole and in agreement


def test_the_c_layer_runs_without_numba(tmp_path):
    """numba serves only the modules' row steps: a host without it still runs every layer as one C call."""
    code = """
import sys
sys.modules["numba"] = None  # `import numba` now fails, as where it is not installed
from kernels import int8_layer, int8_numba, int8_path
from kernels.quantize import quantize
from tests.conftest import random_model
model = quantize(random_model(300), "per-token")
print(int8_numba.AVAILABLE, all(isinstance(l, int8_layer.Int8FusedLayer) for l in model.bert.encoder.layer))
print(int8_path.describe())
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["False True", f"each layer in one C call ({LAYER.products} products)"]
