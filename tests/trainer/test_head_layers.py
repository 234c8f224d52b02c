"""--head-layers: new layers stacked on an --init-from encoder for the heads to read, the encoder frozen so
that the embeddings it serves stay exactly as they were."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file

from model.checkpoint import load_checkpoint
from tests.conftest import random_model
from tests.trainer.conftest import encoder_directory, run, tiny_run_args
from trainer.cli import main
from trainer.warm_start import stack_head_layers


def test_new_layers_start_near_the_identity():
    """The heads see at first what they saw below the new layers: a trained model keeps its answers."""
    model = random_model(300, num_hidden_layers=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    with torch.no_grad():  # a last LayerNorm of small spread and an offset, as all-MiniLM-L6-v2's (~0.26)
        model.bert.encoder.layer[-1].output.LayerNorm.weight.mul_(0.25)
        model.bert.encoder.layer[-1].output.LayerNorm.bias.add_(0.05)
    stacked = stack_head_layers(model, 2).eval()
    assert stacked.config.num_hidden_layers == 4 and stacked.config.embedding_layer == 2
    ids = torch.randint(5, 300, (4, 16), generator=torch.Generator().manual_seed(0))

    def closeness(candidate) -> tuple[float, float]:
        """(relative distance of the top layer's states, share of equal top-1 MLM answers)"""
        with torch.no_grad():
            before, after = model(ids), candidate.eval()(ids)
        distance = (after.last_hidden_state - before.last_hidden_state).norm() / before.last_hidden_state.norm()
        return float(distance), float((after.mlm_logits.argmax(-1) == before.mlm_logits.argmax(-1)).float().mean())

    with torch.no_grad():  # the embedding layer is the old last layer, bit for bit
        assert torch.equal(stacked.bert.embed(ids), model(ids).last_hidden_state)
    distance, agree = closeness(stacked)
    assert distance < 0.15 and agree > 0.9, (distance, agree)
    # new layers initialised as a new model's are not near: the test can tell
    fresh = stack_head_layers(model, 2)
    for layer in fresh.bert.encoder.layer[2:]:
        layer.apply(fresh._init_weights)
    far_distance, far_agree = closeness(fresh)
    assert far_distance > 1.0 and far_agree < agree, (far_distance, far_agree)


def test_copied_layers_repeat_the_top_layers_in_order():
    """--head-layers-start copy: the new layers are the encoder's top layers again (progressive stacking), so the
    new top computes those layers a second time over their own output."""
    model = random_model(300, num_hidden_layers=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).eval()
    stacked = stack_head_layers(model, 2, "copy").eval()
    assert stacked.config.num_hidden_layers == 5 and stacked.config.embedding_layer == 3
    layers = stacked.bert.encoder.layer
    for new, old in ((layers[3], model.bert.encoder.layer[1]), (layers[4], model.bert.encoder.layer[2])):
        new_state, old_state = new.state_dict(), old.state_dict()
        assert new_state.keys() == old_state.keys()
        assert all(torch.equal(new_state[k], old_state[k]) for k in old_state)
        assert new.output.dense.weight.data_ptr() != old.output.dense.weight.data_ptr()  # copies, not shared
    ids = torch.randint(5, 300, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        below = model(ids).last_hidden_state
        again = model.bert.encoder(below, None, start=1)  # the old top two layers once more, over their own output
        assert torch.equal(stacked.bert.embed(ids), below)
        top = stacked(ids).last_hidden_state
    torch.testing.assert_close(top, again, atol=1e-5, rtol=1e-5)
    assert (top - below).norm() > 0.1 * below.norm()  # unlike the identity start, the new layers transform


def test_a_run_with_head_layers_trains_only_the_new_top(tmp_path, tokenizer, small_corpus, small_eval_corpus, caplog):
    start = encoder_directory(tmp_path / "start", tokenizer)  # 2 layers, no heads (a sentence-transformers layout)
    output = tmp_path / "out"
    args = {"--init-from": start, "--head-layers": 1, "--max-steps": 4, "--save-every": 2, "--eval-every": 4,
            "--lr": 3e-3}
    with caplog.at_level("INFO", logger="trainer"):
        assert main(tiny_run_args(small_corpus, small_eval_corpus, output, tmp_path / "cache", **args)) == 0
    assert "1 new layer(s) on top for the heads, near the identity; the embeddings stay those of layer 2" in caplog.text
    before, after = load_file(start / "model.safetensors"), load_file(output / "model.safetensors")
    below = [n for n in after if n.startswith(("bert.embeddings.", "bert.encoder.layer.0.", "bert.encoder.layer.1."))]
    assert below and all(torch.equal(after[n], before[n.removeprefix("bert.")]) for n in below)
    top = [n for n in after if n.startswith("bert.encoder.layer.2.")]
    assert top and not torch.equal(after["bert.encoder.layer.2.attention.output.dense.weight"],
                                   torch.zeros_like(after["bert.encoder.layer.2.attention.output.dense.weight"]))
    config = json.loads((output / "config.json").read_text())
    assert config["num_hidden_layers"] == 3 and config["embedding_layer"] == 2
    metadata = json.loads((output / "training_metadata.json").read_text())
    assert "1 layer(s) on top that only the heads read" in " ".join(metadata["warm_start"]["new_parts"])
    evaluation = metadata["eval"]  # the served embeddings are the starting encoder's, exactly
    assert evaluation["embedding_nn_agreement"] == 1.0 and evaluation["embedding_mean_cosine"] > 0.9999
    reference = transformers.BertForPreTraining.from_pretrained(output)  # transformers opens it with every head
    assert reference.config.num_hidden_layers == 3

    # --resume keeps the layers below frozen: they are frozen because the checkpoint has an embedding layer
    assert main(tiny_run_args(small_corpus, small_eval_corpus, output, tmp_path / "cache",
                              **{**args, "--max-steps": 8, "--resume": True})) == 0
    resumed = load_file(output / "model.safetensors")
    assert all(torch.equal(resumed[n], before[n.removeprefix("bert.")]) for n in below)
    assert not torch.equal(resumed["bert.encoder.layer.2.output.dense.weight"], after["bert.encoder.layer.2.output.dense.weight"])

    from trainer.export import export

    card = (export(output, tmp_path / "exported", torch.float16) / "README.md").read_text()
    assert "layer 2" in card and "3 layers" in card


@pytest.mark.parametrize(("extra", "expected"), [
    ({"--head-layers": 1}, "--head-layers needs --init-from"),
    ({"--head-layers": -1, "--init-from": "START"}, "--head-layers must be 0 (off) or more"),
    ({"--head-layers": 1, "--init-from": "START", "--preserve-embeddings": 10}, "leave out --preserve-embeddings"),
    ({"--head-layers": 1, "--init-from": "STACKED"}, "already has layers above its embedding layer (2)"),
    ({"--head-layers-start": "copy", "--init-from": "START"}, "--head-layers-start needs --head-layers"),
    ({"--head-layers": 3, "--head-layers-start": "copy", "--init-from": "START"}, "has 2 layers to copy, not 3"),
])
def test_bad_head_layer_requests_fail_in_one_line_before_anything_is_written(tmp_path, tokenizer, small_corpus,
                                                                            small_eval_corpus, extra, expected):
    start = encoder_directory(tmp_path / "start", tokenizer)
    stacked = tmp_path / "stacked"
    from model.checkpoint import save_checkpoint

    save_checkpoint(stacked, stack_head_layers(load_checkpoint(start).model, 1), load_checkpoint(start).tokenizer)
    extra = {k: {"START": start, "STACKED": stacked}.get(v, v) if isinstance(v, str) else v for k, v in extra.items()}
    output, cache = tmp_path / "out", tmp_path / "cache"
    result = run(tiny_run_args(small_corpus, small_eval_corpus, output, cache, **extra))
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert expected in errors[0], errors[0]
    assert not output.exists() and not (cache / "sentences").exists()


def test_a_second_stage_with_head_layers_reports_the_first_stages_retention(tmp_path, tokenizer, small_corpus,
                                                                           small_eval_corpus):
    """make train-default's shape: a warm start that moves the encoder, then layers stacked on it. The second run
    measures its embeddings against the first run's (unchanged: 1.0); the card must still say how they compare with
    the foreign model they came from, which is the first run's figure."""
    from trainer.export import export

    start = encoder_directory(tmp_path / "start", tokenizer)
    first, second, cache = tmp_path / "first", tmp_path / "second", tmp_path / "cache"
    assert main(tiny_run_args(small_corpus, small_eval_corpus, first, cache, **{
        "--init-from": start, "--max-steps": 6, "--eval-every": 6, "--lr": 3e-3})) == 0
    assert main(tiny_run_args(small_corpus, small_eval_corpus, second, cache, **{
        "--init-from": first, "--head-layers": 1, "--max-steps": 2, "--eval-every": 2})) == 0
    first_eval = json.loads((first / "training_metadata.json").read_text())["eval"]
    second_eval = json.loads((second / "training_metadata.json").read_text())["eval"]
    assert second_eval["embedding_nn_agreement"] == 1.0 and first_eval["embedding_mean_cosine"] < 0.9999
    card = (export(second, tmp_path / "exported", torch.float16) / "README.md").read_text()
    assert "Trained in 2 runs" in card
    row = next(line for line in card.splitlines() if "mean cosine to the starting encoder's vectors" in line)
    assert f"{first_eval['embedding_mean_cosine']:.3f}" in row, row
