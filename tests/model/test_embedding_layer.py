"""A checkpoint whose heads read layers stacked above its embedding layer (`config.embedding_layer`, made by
the trainer's --head-layers): the embedding routes serve that layer, the heads the top, and both equal what
`transformers` computes from the same directory (`hidden_states[embedding_layer]`, `prediction_logits`)."""

from __future__ import annotations

import json

import pytest
import torch
import transformers

from model import ConfigError, load_checkpoint, save_checkpoint
from model.config import BertConfig
from model.packing import Packing
from tests.conftest import random_model, tiny_config


@pytest.mark.parametrize("value", [0, 5, True, "2", 2.0])
def test_an_embedding_layer_outside_the_encoder_is_refused(value):
    with pytest.raises(ConfigError, match="embedding_layer"):
        tiny_config(300, num_hidden_layers=4, embedding_layer=value)


def test_config_json_names_the_embedding_layer_only_when_set(tmp_path, tokenizer):
    assert "embedding_layer" not in tiny_config(300).to_dict()  # a plain BERT's config.json is unchanged
    save_checkpoint(tmp_path / "stacked", random_model(tokenizer.vocab_size, num_hidden_layers=3, embedding_layer=2),
                    tokenizer)
    assert json.loads((tmp_path / "stacked" / "config.json").read_text())["embedding_layer"] == 2
    assert load_checkpoint(tmp_path / "stacked").config.embedding_layer == 2
    assert BertConfig.from_dict({**tiny_config(300).to_dict(), "embedding_layer": 1}).served_embedding_layer == 1


@pytest.fixture(scope="module")
def stacked(tmp_path_factory, tokenizer):
    directory = tmp_path_factory.mktemp("stacked") / "ckpt"
    save_checkpoint(directory, random_model(tokenizer.vocab_size, seed=5, num_hidden_layers=4, embedding_layer=2),
                    tokenizer)
    return directory


def test_embeddings_and_heads_equal_transformers_layer_by_layer(stacked):
    ours = load_checkpoint(stacked)
    reference = transformers.BertForPreTraining.from_pretrained(stacked).eval()
    assert reference.config.embedding_layer == 2  # transformers keeps the field as an attribute
    texts = ["the river flows to the sea", "a crane is flying over the old town hall", "it rained"]
    encoded = [ours.tokenizer.encode(text) for text in texts]
    ids = torch.tensor([token for e in encoded for token in e.ids])
    packing = Packing.from_lengths([len(e.ids) for e in encoded])
    with torch.no_grad():
        embedded, top = ours.model.encode_packed(ids, torch.zeros_like(ids), packing)
        alone, none = ours.model.encode_packed(ids, torch.zeros_like(ids), packing, for_heads=False)
        start = 0
        for e in encoded:
            row = torch.tensor([e.ids])
            want = reference(input_ids=row, output_hidden_states=True)
            span = slice(start, start + len(e.ids))
            torch.testing.assert_close(embedded[span], want.hidden_states[2][0], rtol=0, atol=1e-5)
            torch.testing.assert_close(top[span], want.hidden_states[4][0], rtol=0, atol=1e-5)
            torch.testing.assert_close(ours.model.mlm_logits(top[span]), want.prediction_logits[0], rtol=0, atol=1e-4)
            torch.testing.assert_close(ours.model.bert.embed(row)[0], want.hidden_states[2][0], rtol=0, atol=1e-5)
            start += len(e.ids)
    assert none is None and torch.equal(alone, embedded)  # embeddings alone: the top layers are not run
    assert not torch.allclose(embedded, top, atol=1e-3)  # (the two layers differ: the test can tell them apart)
