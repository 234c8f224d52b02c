"""The bundled default model: small, half precision, servable, and its card tells the truth."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from devkit.paths import REPO_ROOT
from model import load_checkpoint
from service.settings import DEFAULT_CHECKPOINT
from trainer.model_card import retention_evaluation, training_stages, warm_start_of


def test_bundled_model_is_compact_half_precision_and_loads():
    weights = DEFAULT_CHECKPOINT / "model.safetensors"
    assert weights.stat().st_size < 50 * 1024 * 1024
    with safe_open(str(weights), "pt") as handle:
        assert {handle.get_tensor(k).dtype for k in handle.keys()} == {torch.float16}
    checkpoint = load_checkpoint(DEFAULT_CHECKPOINT)
    assert checkpoint.model.has_mlm_head and checkpoint.model.has_nsp_head
    # all-MiniLM-L6-v2's shape and vocabulary: the warm start it was trained from (no layers stacked for the heads)
    config = checkpoint.config
    assert (config.num_hidden_layers, config.embedding_layer, config.hidden_size, config.vocab_size) == \
        (6, None, 384, 30522)


def test_model_card_reports_the_measured_metrics_and_attribution():
    metadata = json.loads((DEFAULT_CHECKPOINT / "training_metadata.json").read_text())
    card = (DEFAULT_CHECKPOINT / "README.md").read_text()
    evaluation = metadata["eval"]
    assert f"| masked-token accuracy (15% of tokens masked) | {evaluation['mlm_accuracy']:.1%} |" in card
    assert f"| next-sentence accuracy | {evaluation['nsp_accuracy']:.1%} |" in card
    assert f"| whole-word fill-mask accuracy, top-1 | {evaluation['whole_word_accuracy']:.1%} |" in card
    trained_on = [Path(source["path"]).name for source in metadata["data"]["train"]]
    assert trained_on and all(name.startswith(("enwiki-", "brown", "austen")) for name in trained_on)
    assert Path(metadata["data"]["eval"]).name == "wiki.test.tokens"  # held out: no training file contains it
    assert "CC BY-SA 3.0" in card and "Wikipedia contributors" in card and "python -m trainer" in card
    warm_start = warm_start_of(training_stages(metadata))  # the first of the runs that made it
    assert (warm_start["name"], warm_start["licence"].lower()) == ("all-MiniLM-L6-v2", "apache-2.0")
    assert f"Starting weights: `all-MiniLM-L6-v2`, licence {warm_start['licence']}" in card


def test_readme_states_the_bundled_models_measured_accuracy():
    metadata = json.loads((DEFAULT_CHECKPOINT / "training_metadata.json").read_text())
    evaluation = metadata["eval"]
    # agreement with all-MiniLM-L6-v2: measured by the run that started from it (the stacked run froze those layers)
    kept = retention_evaluation(training_stages(metadata), evaluation)
    readme = (REPO_ROOT / "README.md").read_text()
    assert f"**{evaluation['mlm_accuracy']:.1%} masked-token accuracy** (perplexity {evaluation['mlm_perplexity']:.0f})" \
        in readme
    assert f"{evaluation['nsp_accuracy']:.1%} next-sentence accuracy" in readme
    assert f"{evaluation['whole_word_accuracy']:.1%} whole-word fill-mask accuracy" in readme
    assert f"{kept['embedding_nn_agreement']:.2f} nearest-neighbour agreement" in readme
