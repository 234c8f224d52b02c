"""ColBERT checkpoints load in PyLate's and colbert-ai's layouts with their settings and projection, and the ones this
server cannot serve faithfully are refused at load with one line naming the file and the problem."""

from __future__ import annotations

import json
import string

import pytest
import torch
from safetensors.torch import save_file

from model.checkpoint import CheckpointError, load_checkpoint
from model.checkpoint_files import load_checkpoint_files
from model.late_interaction import read_late_interaction
from tests.colbert_checkpoints import colbert_ai_checkpoint, pylate_checkpoint


def test_pylate_layout_with_its_settings_and_a_projection_of_two_biased_layers(tmp_path, tokenizer):
    directory = pylate_checkpoint(tmp_path / "pylate", tokenizer, dims=(48, 24), bias=True, query_length=16,
                                  document_length=40, attend_to_expansion_tokens=True, skiplist_words=[".", ","])
    checkpoint = load_checkpoint(directory)
    recipe = checkpoint.late_interaction
    assert (recipe.format, recipe.dim, recipe.query_length, recipe.document_length) == ("pylate", 24, 16, 40)
    assert (recipe.query_prefix, recipe.document_prefix, recipe.skiplist_words) == ("[Q] ", "[D] ", (".", ","))
    assert recipe.do_query_expansion and recipe.attend_to_expansion_tokens
    layers = checkpoint.model.projection.layers
    assert [(layer.in_features, layer.out_features, layer.bias is not None) for layer in layers] == \
        [(64, 48, True), (48, 24, True)]
    from safetensors.torch import load_file

    assert torch.equal(layers[1].weight, load_file(str(directory / "2_Dense" / "model.safetensors"))["linear.weight"])
    # the front ends read the same recipe without the weights
    assert load_checkpoint_files(directory).late_interaction == recipe


def test_pylate_defaults_where_its_config_is_silent(tmp_path, tokenizer):
    directory = pylate_checkpoint(tmp_path / "pylate", tokenizer)
    settings = json.loads((directory / "config_sentence_transformers.json").read_text())
    del settings["skiplist_words"]
    (directory / "config_sentence_transformers.json").write_text(json.dumps(settings))
    recipe = read_late_interaction(directory)
    # pylate/models/colbert.py, ColBERT.__init__: 32, 180, expansion on, expansion tokens not attended, punctuation
    assert (recipe.query_length, recipe.document_length, recipe.do_query_expansion,
            recipe.attend_to_expansion_tokens) == (32, 180, True, False)
    assert recipe.skiplist_words == tuple(string.punctuation)


def test_colbert_ai_layout_its_linear_beside_the_encoder(tmp_path, tokenizer):
    directory = colbert_ai_checkpoint(tmp_path / "colbert-ai", tokenizer, dim=20, query_maxlen=12, doc_maxlen=30,
                                      mask_punctuation=False, attend_to_mask_tokens=True)
    checkpoint = load_checkpoint(directory)
    recipe = checkpoint.late_interaction
    assert (recipe.format, recipe.dim, recipe.query_length, recipe.document_length) == ("colbert-ai", 20, 12, 30)
    assert (recipe.query_prefix, recipe.document_prefix) == ("[unused0]", "[unused1]")
    assert recipe.skiplist_words == () and recipe.attend_to_expansion_tokens
    assert checkpoint.model.projection.layers[0].weight.shape == (20, 64)
    # without artifact.metadata, colbert-ai's own defaults (colbert/infra/config/settings.py)
    (directory / "artifact.metadata").unlink()
    recipe = read_late_interaction(directory)
    assert (recipe.query_length, recipe.document_length, recipe.skiplist_words) == (32, 220, tuple(string.punctuation))


def test_a_dense_module_saved_with_pickle_loads_tensors_only(tmp_path, tokenizer):
    directory = pylate_checkpoint(tmp_path / "pylate", tokenizer, pickled_dense=True)
    assert load_checkpoint(directory).model.projection.out_features == 24
    # weights_only=True: a file that would run code on unpickling is refused, not run
    (directory / "1_Dense" / "pytorch_model.bin").unlink()
    torch.save({"linear.weight": torch.zeros(24, 64), "hook": print}, directory / "1_Dense" / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="projection's weights cannot be read"):
        load_checkpoint(directory)


def test_a_projection_narrower_or_wider_than_the_encoder_is_refused_in_one_line(tmp_path, tokenizer):
    directory = pylate_checkpoint(tmp_path / "pylate", tokenizer)
    config = json.loads((directory / "1_Dense" / "config.json").read_text())
    (directory / "1_Dense" / "config.json").write_text(json.dumps({**config, "in_features": 32}))
    save_file({"linear.weight": torch.zeros(24, 32)}, str(directory / "1_Dense" / "model.safetensors"))
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(directory)
    assert "reads 32-wide vectors but the encoder's hidden_size is 64" in str(refused.value)
    assert "\n" not in str(refused.value)
    ai = colbert_ai_checkpoint(tmp_path / "colbert-ai", tokenizer)
    from safetensors.torch import load_file

    tensors = load_file(str(ai / "model.safetensors"))
    tensors["linear.weight"] = torch.zeros(20, 48)
    save_file(tensors, str(ai / "model.safetensors"))
    with pytest.raises(CheckpointError, match="reads 48-wide vectors but the encoder's hidden_size is 64"):
        load_checkpoint(ai)


@pytest.mark.parametrize("change, problem", [
    ({"activation_function": "torch.nn.modules.activation.Tanh"}, "activation_function"),
    ({"use_residual": True}, "use_residual"),
    ({"out_features": 30}, r"linear.weight should be \[30, 64\]"),
    ({"bias": True}, "the config says bias True"),
])
def test_a_dense_module_this_server_would_not_compute_as_pylate_does_is_refused(tmp_path, tokenizer, change, problem):
    directory = pylate_checkpoint(tmp_path / "pylate", tokenizer)
    config = json.loads((directory / "1_Dense" / "config.json").read_text())
    (directory / "1_Dense" / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError, match=problem):
        load_checkpoint(directory)


def test_markers_missing_from_the_vocabulary_are_refused(tmp_path, tokenizer):
    directory = pylate_checkpoint(tmp_path / "pylate", tokenizer)
    settings = json.loads((directory / "config_sentence_transformers.json").read_text())
    (directory / "config_sentence_transformers.json").write_text(json.dumps({**settings, "query_prefix": "[QQ]"}))
    with pytest.raises(CheckpointError, match=r"markers \['\[QQ\]'\] are not tokens of its tokenizer"):
        load_checkpoint_files(directory)


def test_a_sentence_transformers_model_with_a_dense_module_but_no_colbert_settings_is_no_colbert(tmp_path, tokenizer):
    directory = pylate_checkpoint(tmp_path / "pylate", tokenizer)
    (directory / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {}}))
    assert read_late_interaction(directory) is None
    (directory / "modules.json").unlink()
    assert read_late_interaction(directory) is None
