"""--init-from any BERT encoder: heads created where absent, the encoder's sentence embeddings kept on
request (--preserve-embeddings), the retention measure, and bad starting checkpoints refused up front."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from tests.conftest import random_model
from tests.trainer.conftest import encoder_directory, run, tiny_run_args
from trainer.cli import main
from trainer.forward import first_segments, mean_pooled, pretraining_logits
from trainer.retention import retention_metrics

VOCAB_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@pytest.mark.parametrize("kind", ["BertModel", "BertForMaskedLM"])
def test_init_from_an_encoder_creates_the_missing_heads(tmp_path, tokenizer, small_corpus, small_eval_corpus, kind,
                                                        caplog):
    start = encoder_directory(tmp_path / "start", tokenizer, kind)
    output = tmp_path / "out"
    with caplog.at_level("INFO", logger="trainer"):
        assert main(tiny_run_args(small_corpus, small_eval_corpus, output, tmp_path / "cache", **{
            "--init-from": start, "--max-steps": 4, "--eval-every": 4})) == 0
    said = " ".join(r.getMessage() for r in caplog.records if "--init-from" in r.getMessage())
    assert "next-sentence head" in said
    assert ("masked-LM head" in said) == (kind == "BertModel")
    metadata = json.loads((output / "training_metadata.json").read_text())
    assert metadata["warm_start"]["licence"] == "apache-2.0"
    assert metadata["warm_start"]["architectures"] == [kind]
    # transformers opens the result with every head, the decoder tied to the word embeddings
    config = json.loads((output / "config.json").read_text())
    assert config["architectures"] == ["BertForPreTraining"] and "_name_or_path" not in config
    model = transformers.BertForPreTraining.from_pretrained(output)
    assert model.cls.predictions.decoder.weight.data_ptr() == model.bert.embeddings.word_embeddings.weight.data_ptr()
    # the vocabulary is the starting checkpoint's, and the retention of its embeddings was measured
    assert (output / "vocab.txt").read_text() == (start / "vocab.txt").read_text()
    evaluation = metadata["eval"]
    assert 0 <= evaluation["embedding_nn_agreement"] <= 1 and evaluation["embedding_sentences"] > 3
    assert evaluation["embedding_mean_cosine"] > 0.5  # four small steps leave the encoder near where it was
    from trainer.export import export

    card = (export(output, tmp_path / "exported", torch.float16) / "README.md").read_text()
    assert "continued by this project's trainer from `an encoder`" in card and "licence: apache-2.0" in card
    assert "Starting weights: `an encoder`, licence apache-2.0" in card
    assert "sentence embeddings vs `an encoder`'s: nearest-neighbour agreement" in card
    assert f"find {evaluation['embedding_nn_agreement']:.0%} of the same nearest neighbours as `an encoder`'s" in card
    assert "--init-from <an encoder directory>" in card and str(start) not in card  # not this machine's path


def test_preserving_embeddings_keeps_the_encoder_closer(tmp_path, tokenizer, small_corpus, small_eval_corpus):
    """The same run with and without the term: the term must hold the sentence vectors nearer the start."""
    start = encoder_directory(tmp_path / "start", tokenizer)
    cosines = {}
    for weight, over in ((0, "all"), (20, "all"), (20, "clean")):
        output = tmp_path / f"out-{weight}-{over}"
        args = {"--init-from": start, "--max-steps": 12, "--eval-every": 12, "--lr": 3e-3, "--dropout": 0}
        if weight:
            args |= {"--preserve-embeddings": weight, "--preserve-over": over}
        assert main(tiny_run_args(small_corpus, small_eval_corpus, output, tmp_path / "cache", **args)) == 0
        evaluation = json.loads((output / "training_metadata.json").read_text())["eval"]
        cosines[weight, over] = evaluation["embedding_mean_cosine"]
        rows = [json.loads(line) for line in (output / "metrics.jsonl").read_text().splitlines()]
        assert all(("embedding_drift" in r) == bool(weight) for r in rows if "loss" in r)
    assert cosines[20, "all"] > cosines[0, "all"] + 0.02, cosines
    assert cosines[20, "clean"] > cosines[0, "all"] + 0.02, cosines


def test_sentence_vectors_of_the_training_step_equal_the_full_forward():
    model = random_model(300, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ids = torch.randint(5, 300, (3, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    types = torch.zeros_like(ids)
    positions = torch.zeros_like(ids, dtype=torch.bool)
    positions[:, 2] = True
    full = model(ids, types, mask, mlm_positions=positions)
    mlm, nsp, vectors = pretraining_logits(model, ids, types, mask, positions, sentence_vectors="all")
    torch.testing.assert_close(mlm, full.mlm_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(nsp, full.nsp_logits, rtol=0, atol=1e-5)
    row = full.last_hidden_state[1, :8].mean(0)  # the padded row: a mean over its 8 real tokens only
    torch.testing.assert_close(vectors[1], row, rtol=0, atol=1e-5)
    torch.testing.assert_close(vectors, mean_pooled(full.last_hidden_state, mask))
    # --preserve-over unmasked: the same vectors without the predicted positions (column 2 and nothing else)
    *_, unmasked = pretraining_logits(model, ids, types, mask, positions, sentence_vectors="unmasked")
    kept = [0, 1, 3, 4, 5, 6, 7]
    torch.testing.assert_close(unmasked[1], full.last_hidden_state[1, kept].mean(0), rtol=0, atol=1e-5)
    assert not torch.allclose(unmasked[1], vectors[1], atol=1e-4)


def test_clean_first_segments_are_embedded_alone_as_users_embed_them():
    """--preserve-over clean: each pair's [CLS] A [SEP] without masks, through the encoder on its own."""
    model = random_model(300, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    clean_ids = torch.randint(5, 300, (2, 12), generator=torch.Generator().manual_seed(2))
    types = torch.zeros_like(clean_ids)
    types[0, 5:] = 1  # row 0: A is [CLS] + 3 pieces + [SEP] (5 tokens), B the rest
    types[1, 7:11] = 1  # row 1: A is 7 tokens, B 4, then one pad
    mask = torch.ones_like(clean_ids)
    mask[1, 11] = 0
    masked_ids = clean_ids.clone()
    positions = torch.zeros_like(clean_ids, dtype=torch.bool)
    positions[:, [2, 8]] = True
    masked_ids[positions] = 3  # the masks the MLM loss sees; the clean segments must not
    segments = first_segments(clean_ids, types, mask, sep_id=4)
    assert segments[0].shape == (2, 7) and segments[1].sum(1).tolist() == [5, 7]
    cut_ids, cut_mask = first_segments(clean_ids, types, mask, sep_id=4, max_tokens=6)  # row 1 cut to 6
    assert cut_mask.sum(1).tolist() == [5, 6] and cut_ids[1, 5] == 4 and cut_ids[1, :5].equal(clean_ids[1, :5])
    assert cut_ids[0].equal(clean_ids[0, :6])  # a segment that fits is untouched
    full = model(masked_ids, types, mask, mlm_positions=positions)
    mlm, nsp, vectors = pretraining_logits(model, masked_ids, types, mask, positions, sentence_vectors="clean",
                                           clean=segments)
    torch.testing.assert_close(mlm, full.mlm_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(nsp, full.nsp_logits, rtol=0, atol=1e-5)
    for row, length in enumerate([5, 7]):
        alone = model.bert(clean_ids[row : row + 1, :length])[0]  # the service's view: one passage, no padding
        torch.testing.assert_close(vectors[row], alone[0].mean(0), rtol=0, atol=1e-5)


def test_retention_metrics_tell_kept_from_lost_neighbourhoods():
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(60, 16))
    reference /= np.linalg.norm(reference, axis=1, keepdims=True)
    same = retention_metrics(reference, reference)
    assert same["nn_agreement"] == 1.0 and same["similarity_spearman"] > 0.999 and same["mean_cosine"] > 0.999
    nudged = reference + rng.normal(scale=0.05, size=reference.shape)
    nudged /= np.linalg.norm(nudged, axis=1, keepdims=True)
    near = retention_metrics(nudged, reference)
    unrelated = rng.normal(size=reference.shape)
    unrelated /= np.linalg.norm(unrelated, axis=1, keepdims=True)
    far = retention_metrics(unrelated, reference)
    assert 1.0 >= near["nn_agreement"] > 0.6 > far["nn_agreement"]
    assert near["similarity_spearman"] > 0.8 and far["similarity_spearman"] < 0.3
    assert "mean_cosine" not in retention_metrics(reference[:, :8] / np.linalg.norm(reference[:, :8], axis=1,
                                                                                   keepdims=True), reference)


def _wrong_model_type(d: Path) -> str:
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "model_type": "roberta"}))
    return "config.json: model_type is 'roberta'"


def _no_vocab(d: Path) -> str:
    for name in VOCAB_FILES:
        (d / name).unlink(missing_ok=True)
    return "vocab.txt"


def _pickle_only(d: Path) -> str:
    (d / "model.safetensors").rename(d / "pytorch_model.bin")
    return "pytorch_model.bin"


def _vocabulary_larger_than_the_matrix(d: Path) -> str:
    config = json.loads((d / "config.json").read_text())
    from safetensors.torch import load_file, save_file

    weights = load_file(d / "model.safetensors")
    rows = config["vocab_size"] - 50
    for name in list(weights):
        if name.endswith(("word_embeddings.weight", "predictions.bias")):
            weights[name] = weights[name][:rows].contiguous()
    save_file(weights, d / "model.safetensors", metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps({**config, "vocab_size": rows}))
    return "tokens but"


@pytest.mark.parametrize("damage", [_wrong_model_type, _no_vocab, _pickle_only, _vocabulary_larger_than_the_matrix])
def test_a_bad_starting_checkpoint_fails_before_anything_is_prepared_or_written(tmp_path, tokenizer, small_corpus,
                                                                                small_eval_corpus, damage):
    start = encoder_directory(tmp_path / "start", tokenizer)
    expected = damage(start)
    output, cache = tmp_path / "out", tmp_path / "cache"
    result = run(tiny_run_args(small_corpus, small_eval_corpus, output, cache, **{"--init-from": start}))
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert expected in errors[0] and str(start) in errors[0], errors[0]
    assert not output.exists() and not (cache / "sentences").exists()


def test_freezing_the_encoder_trains_only_the_heads(tmp_path, tokenizer, small_corpus, small_eval_corpus):
    from safetensors.torch import load_file

    start = encoder_directory(tmp_path / "start", tokenizer)
    output = tmp_path / "out"
    assert main(tiny_run_args(small_corpus, small_eval_corpus, output, tmp_path / "cache", **{
        "--init-from": start, "--max-steps": 6, "--freeze-encoder-steps": 6, "--lr": 3e-3})) == 0
    before, after = load_file(start / "model.safetensors"), load_file(output / "model.safetensors")
    encoder = [n for n in after if n.startswith(("bert.embeddings.", "bert.encoder."))]
    assert encoder and all(torch.equal(after[n], before[n.removeprefix("bert.")]) for n in encoder)
    assert not torch.equal(after["bert.pooler.dense.weight"], before["pooler.dense.weight"])  # the pooler learns
    assert "cls.predictions.transform.dense.weight" in after and "cls.seq_relationship.weight" in after


def test_encoder_lr_scale_moves_the_encoder_less(tmp_path, tokenizer, small_corpus, small_eval_corpus):
    """With --encoder-lr-scale 0.05 the encoder's weights move about 20x less than at full learning rate (Adam's
    steps are about lr in size), while the fresh heads move alike."""
    from safetensors.torch import load_file

    start = encoder_directory(tmp_path / "start", tokenizer)
    before = load_file(start / "model.safetensors")
    moved = {}
    for scale in ("1", "0.05"):
        output = tmp_path / f"out-{scale}"
        assert main(tiny_run_args(small_corpus, small_eval_corpus, output, tmp_path / "cache", **{
            "--init-from": start, "--max-steps": 4, "--lr": 1e-3, "--encoder-lr-scale": scale})) == 0
        after = load_file(output / "model.safetensors")
        name = "bert.encoder.layer.0.attention.self.query.weight"
        moved[scale] = (float((after[name] - before[name.removeprefix("bert.")]).abs().mean()),
                        float(after["cls.seq_relationship.weight"].abs().mean()))
    encoder_ratio = moved["0.05"][0] / moved["1"][0]
    assert 0.02 < encoder_ratio < 0.15, moved
    assert 0.5 < moved["0.05"][1] / moved["1"][1] < 2, moved  # the NSP head learns at full rate either way


def test_a_resumed_run_takes_this_invocations_encoder_rate_and_keeps_the_moments(tokenizer):
    """load_state_dict alone brings back the saved lr_scale: a changed --encoder-lr-scale would be ignored."""
    import dataclasses

    from trainer.optimizer import build_optimizer, restore_optimizer
    from trainer.options import TrainOptions

    model = random_model(tokenizer.vocab_size)
    base = TrainOptions(corpus=[Path("unused")], output=Path("unused"))
    saved = build_optimizer(model, dataclasses.replace(base, encoder_lr_scale=0.1), torch.device("cpu"))
    model(torch.tensor([[2, 5, 6, 3]]), torch.zeros(1, 4, dtype=torch.long)).nsp_logits.sum().backward()
    saved.step()
    state = saved.state_dict()

    resumed = build_optimizer(model, dataclasses.replace(base, encoder_lr_scale=0.3), torch.device("cpu"))
    restore_optimizer(resumed, state, dataclasses.replace(base, encoder_lr_scale=0.3))
    assert sorted({g["lr_scale"] for g in resumed.param_groups}) == [0.3, 1.0]
    moments = [resumed.state[p]["exp_avg"] for g in resumed.param_groups for p in g["params"] if p in resumed.state]
    assert moments and any(m.abs().sum() > 0 for m in moments)  # Adam's moments came back

    full_rate = build_optimizer(model, base, torch.device("cpu"))  # scale 1: the encoder joins the heads' groups
    with pytest.raises(ValueError, match=r"--resume: .*scale\(s\) \[0\.1, 1\.0\].*--encoder-lr-scale 1\.0"):
        restore_optimizer(full_rate, state, base)


def test_the_card_recommends_the_embeddings_for_search_only_when_the_neighbourhoods_were_kept():
    from trainer.model_card import embedding_words

    warm = {"name": "all-MiniLM-L6-v2"}
    assert "serve search nearly as that model does" in embedding_words({"embedding_nn_agreement": 0.93}, warm)
    assert "drifted" in embedding_words({"embedding_nn_agreement": 0.24}, warm)
    assert embedding_words({"embedding_nn_agreement": 0.93}, None) == embedding_words({}, warm) == ""
