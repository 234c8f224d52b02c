"""Checkpoint directories: round trips with transformers, foreign layouts, and clear errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from model import CheckpointError, load_checkpoint, save_checkpoint
from model.checkpoint import WEIGHTS_FILE
from tests.conftest import random_model

TEXTS = [("the cat sat on the mat", "it was warm"), ("a river flows", "into the sea")]


def encode(tokenizer, pairs):
    encoded = [tokenizer.encode(a, b) for a, b in pairs]
    width = max(len(e.ids) for e in encoded)
    ids = torch.tensor([e.ids + [0] * (width - len(e.ids)) for e in encoded])
    types = torch.tensor([e.type_ids + [0] * (width - len(e.ids)) for e in encoded])
    mask = torch.tensor([[1] * len(e.ids) + [0] * (width - len(e.ids)) for e in encoded])
    return ids, types, mask


def test_our_checkpoint_opens_in_transformers(tiny_checkpoint):
    ours = load_checkpoint(tiny_checkpoint)
    reference = transformers.BertForPreTraining.from_pretrained(tiny_checkpoint).eval()
    hf_tokenizer = transformers.BertTokenizerFast.from_pretrained(tiny_checkpoint)
    ids, types, mask = encode(ours.tokenizer, TEXTS)
    hf = hf_tokenizer([a for a, _ in TEXTS], [b for _, b in TEXTS], padding=True, return_tensors="pt")
    assert torch.equal(hf["input_ids"], ids) and torch.equal(hf["token_type_ids"], types)
    with torch.no_grad():
        got = ours.model(ids, types, mask)
        want = reference(input_ids=ids, token_type_ids=types, attention_mask=mask)
    assert torch.equal(got.nsp_logits, want.seq_relationship_logits) or (
        (got.nsp_logits - want.seq_relationship_logits).abs().max() <= 1e-5
    )
    assert (got.mlm_logits - want.prediction_logits)[mask.bool()].abs().max() <= 1e-5


@pytest.mark.parametrize("kind", ["BertForPreTraining", "BertForMaskedLM", "BertModel"])
def test_transformers_checkpoints_load_here(tmp_path, tokenizer, kind):
    source = random_model(tokenizer.vocab_size)
    hf_cls = getattr(transformers, kind)
    hf_config = transformers.BertConfig(**source.config.to_dict())
    reference = hf_cls(hf_config).eval()
    reference.load_state_dict(
        {k.removeprefix("bert.") if kind == "BertModel" else k: v for k, v in source.state_dict().items()},
        strict=False,
    )
    reference.save_pretrained(tmp_path)
    tokenizer.save(tmp_path)
    loaded = load_checkpoint(tmp_path)
    assert loaded.model.has_mlm_head == (kind != "BertModel")
    assert loaded.model.has_nsp_head == (kind == "BertForPreTraining")
    ids, types, mask = encode(loaded.tokenizer, TEXTS)
    with torch.no_grad():
        got = loaded.model(ids, types, mask)
        body = reference if kind == "BertModel" else reference.bert
        want = body(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
    assert (got.last_hidden_state - want)[mask.bool()].abs().max() <= 1e-5
    if kind == "BertForMaskedLM":
        assert loaded.model.bert.pooler is None  # absent, not invented


def test_tf_style_names_load(tmp_path, tiny_checkpoint):
    shutil.copytree(tiny_checkpoint, tmp_path / "c")
    weights = load_file(tmp_path / "c" / WEIGHTS_FILE)
    renamed = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v for k, v in weights.items()}
    save_file(renamed, tmp_path / "c" / WEIGHTS_FILE)
    original = load_checkpoint(tiny_checkpoint).model.state_dict()
    for name, tensor in load_checkpoint(tmp_path / "c").model.state_dict().items():
        assert torch.equal(tensor, original[name])


def test_half_precision_save_is_smaller_and_close(tmp_path, tiny_checkpoint):
    full = load_checkpoint(tiny_checkpoint)
    save_checkpoint(tmp_path / "half", full.model, full.tokenizer, dtype=torch.float16)
    half = load_checkpoint(tmp_path / "half")
    size = lambda d: (d / WEIGHTS_FILE).stat().st_size  # noqa: E731
    assert size(tmp_path / "half") < 0.6 * size(tiny_checkpoint)
    ids, types, mask = encode(full.tokenizer, TEXTS)
    with torch.no_grad():
        diff = (half.model(ids, types, mask).nsp_logits - full.model(ids, types, mask).nsp_logits).abs().max()
    assert diff < 1e-2


def test_save_is_atomic_when_interrupted(tmp_path, tiny_checkpoint):
    good = load_checkpoint(tiny_checkpoint)
    target = tmp_path / "out"
    save_checkpoint(target, good.model, good.tokenizer, metadata={"version": 1})

    def crash(_directory):
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(target, good.model, good.tokenizer, metadata={"version": 2}, write_extra=crash)
    assert load_checkpoint(target).metadata == {"version": 1}  # the previous checkpoint is intact
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary left behind


# ---- bad checkpoints -----------------------------------------------------------------------------


@pytest.fixture
def broken(tmp_path, tiny_checkpoint):
    target = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, target)
    return target


def test_missing_weights_file(broken):
    (broken / WEIGHTS_FILE).unlink()
    (broken / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(CheckpointError, match=r"broken: no model\.safetensors.*pytorch_model\.bin.*never loads"):
        load_checkpoint(broken)


def test_truncated_safetensors(broken):
    data = (broken / WEIGHTS_FILE).read_bytes()
    (broken / WEIGHTS_FILE).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: truncated"):
        load_checkpoint(broken)


def test_shape_mismatch(broken):
    config = json.loads((broken / "config.json").read_text())
    config["intermediate_size"] = 96
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: tensor .*intermediate.dense.weight has shape \[128, 64\].*\[96, 64\]"):
        load_checkpoint(broken)


def test_malformed_config(broken):
    (broken / "config.json").write_text('{"hidden_size": 64,')
    with pytest.raises(CheckpointError, match=r"config\.json: not valid JSON"):
        load_checkpoint(broken)


def test_unknown_config_field(broken):
    config = json.loads((broken / "config.json").read_text())
    config["rotary_embedding"] = True
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config\.json: unknown field.*rotary_embedding"):
        load_checkpoint(broken)


def test_wrong_dtype(broken):
    weights = load_file(broken / WEIGHTS_FILE)
    weights["bert.pooler.dense.bias"] = weights["bert.pooler.dense.bias"].to(torch.int32)
    save_file(weights, broken / WEIGHTS_FILE)
    with pytest.raises(CheckpointError, match=r"pooler\.dense\.bias has dtype torch.int32"):
        load_checkpoint(broken)


def test_missing_and_extra_tensors(broken):
    weights = load_file(broken / WEIGHTS_FILE)
    del weights["bert.encoder.layer.1.output.dense.bias"]
    save_file(weights, broken / WEIGHTS_FILE)
    with pytest.raises(CheckpointError, match=r"missing tensors .*layer\.1\.output\.dense\.bias"):
        load_checkpoint(broken)


def test_missing_directory_and_tokenizer(tmp_path, broken):
    with pytest.raises(CheckpointError, match="nope: not a directory"):
        load_checkpoint(tmp_path / "nope")
    (broken / "tokenizer.json").unlink()
    (broken / "vocab.txt").unlink()
    with pytest.raises(CheckpointError, match="broken: no tokenizer.json or vocab.txt"):
        load_checkpoint(broken)


class _Exploit:
    """Unpickling this runs code: it creates the file named by `marker`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_planted_malicious_pickle_is_never_executed(tmp_path, tiny_checkpoint):
    import pickle

    marker = tmp_path / "pwned"
    payload = pickle.dumps({"state_dict": _Exploit(marker)})
    # Beside good weights: the loader reads model.safetensors and ignores every pickle.
    planted = tmp_path / "with-weights"
    shutil.copytree(tiny_checkpoint, planted)
    for name in ("pytorch_model.bin", "training_args.bin", "optimizer.pt"):
        (planted / name).write_bytes(payload)
    assert load_checkpoint(planted).config.hidden_size == 64
    # Instead of the weights: a clear error naming the file, still without opening it.
    bare = tmp_path / "pickle-only"
    shutil.copytree(tiny_checkpoint, bare)
    (bare / WEIGHTS_FILE).unlink()
    (bare / "pytorch_model.bin").write_bytes(payload)
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin.*never loads"):
        load_checkpoint(bare)
    # Proof that the payload is live: unpickling it does create the marker.
    assert not marker.exists()
    pickle.loads(payload)
    assert marker.exists()
