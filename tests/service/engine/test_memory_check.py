"""The start-up memory check's estimate of a model's weights against what the built model holds: in float32, and in
int8 (one byte a Linear weight plus the products kernel's blocked copy), for checkpoints whose keys carry a model
prefix (`bert.encoder.layer...`, ours and BertForPreTraining's) and whose keys do not (BertModel's, as
all-MiniLM-L6-v2 ships)."""

from __future__ import annotations

import pytest
import torch

from model.checkpoint import load_checkpoint
from model.checkpoint_files import load_config
from service.engine.loader import build_engine
from service.engine.memory_check import model_need, quantized_in_int8, tensor_shapes
from service.engine.precision import choose, for_model
from tests.optional import MINILM, required_or_skip


def held_bytes(model: torch.nn.Module) -> int:
    """Bytes of every tensor the built model keeps (parameters, buffers and tensors held as attributes, such as an
    int8 Linear's blocked weights), each storage once."""
    storages: dict[int, int] = {}

    def add(tensor):
        if isinstance(tensor, torch.Tensor):
            storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()

    for module in model.modules():
        for _, tensor in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            add(tensor)
        for value in vars(module).values():
            add(value)
            add(getattr(value, "blocked", None))
    return sum(storages.values())


def built_and_estimated(directory, dtype: str) -> tuple[int, int]:
    checkpoint = load_checkpoint(directory, device="cpu")
    precision = for_model(choose(dtype, torch.device("cpu")), checkpoint.late_interaction is not None)
    engine = build_engine(checkpoint, torch.device("cpu"), precision)
    need = model_need("m", directory, dtype, load_config(directory), batch_tokens=1, on_gpu=False)
    return held_bytes(engine.model), need.weight_bytes


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_the_estimate_matches_what_the_built_model_holds(tiny_checkpoint, dtype):
    held, estimated = built_and_estimated(tiny_checkpoint, dtype)
    assert abs(estimated - held) <= 0.03 * held, (estimated, held)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_the_estimate_matches_for_a_checkpoint_without_a_model_prefix(dtype):
    directory = required_or_skip(*MINILM).MODEL_DIR
    assert any(key.startswith("encoder.layer.") for key in tensor_shapes(directory))  # BertModel's keys
    held, estimated = built_and_estimated(directory, dtype)
    assert abs(estimated - held) <= 0.01 * held, (estimated, held)


def test_only_encoder_layer_linear_weights_count_as_int8():
    assert quantized_in_int8("bert.encoder.layer.0.attention.self.query.weight", (64, 64))
    assert quantized_in_int8("encoder.layer.5.output.dense.weight", (384, 1536))
    assert not quantized_in_int8("encoder.layer.5.output.LayerNorm.weight", (384,))
    assert not quantized_in_int8("encoder.layer.5.output.dense.bias", (384,))
    assert not quantized_in_int8("embeddings.word_embeddings.weight", (30522, 384))
    assert not quantized_in_int8("pooler.dense.weight", (384, 384))


def test_on_a_gpu_each_stream_a_models_batches_may_use_counts_its_activations_again(tiny_checkpoint):
    """The graphs' pool beside the eager pass's, and with --gpu-express-lane the express stream's cached blocks too;
    the weights do not change."""
    config = load_config(tiny_checkpoint)
    cpu, gpu, lane = (model_need("m", tiny_checkpoint, "bfloat16", config, 4096, on_gpu, streams)
                      for on_gpu, streams in ((False, 1), (True, 1), (True, 2)))
    assert cpu.weight_bytes == gpu.weight_bytes == lane.weight_bytes
    assert gpu.activation_bytes == 2 * cpu.activation_bytes and lane.activation_bytes == 3 * cpu.activation_bytes
