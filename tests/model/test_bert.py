"""The network against `transformers.BertForPreTraining` with the same weights, and padding invariance."""

from __future__ import annotations

import pytest
import torch
import transformers

from model import PRESETS, BertConfig, BertForPreTraining, ConfigError
from model.dropout import Dropout
from model.flops import count_parameters, packed_batch_flops
from model.packing import Packing, attends_each_on_cpu
from tests.conftest import random_model, tiny_config
from trainer.forward import pretraining_logits

VOCAB = 300


def reference_model(ours: BertForPreTraining) -> transformers.BertForPreTraining:
    hf_config = transformers.BertConfig(**{k: v for k, v in ours.config.to_dict().items() if k != "architectures"})
    reference = transformers.BertForPreTraining(hf_config).eval()
    # The same state dict goes both ways with no renaming.
    missing, unexpected = reference.load_state_dict(ours.state_dict(), strict=False)
    assert not unexpected and not [m for m in missing if "position_ids" not in m]
    return reference


def batch(pairs: bool, padded: bool, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (3, 17), generator=g)
    types = torch.zeros_like(ids)
    if pairs:
        types[:, 9:] = 1
    mask = torch.ones_like(ids)
    if padded:
        for row, length in enumerate((17, 11, 6)):
            mask[row, length:] = 0
            ids[row, length:] = 0
            types[row, length:] = 0
    return ids, types, mask


@pytest.mark.parametrize("pairs", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_matches_transformers(pairs: bool, padded: bool):
    ours = random_model(VOCAB)
    reference = reference_model(ours)
    ids, types, mask = batch(pairs, padded)
    with torch.no_grad():
        got = ours(ids, types, mask)
        want = reference(input_ids=ids, token_type_ids=types, attention_mask=mask)
        want_hidden = reference.bert(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
    real = mask.bool()
    # Padding positions are garbage in both implementations; compare the real tokens only.
    assert (got.last_hidden_state[real] - want_hidden[real]).abs().max() <= 1e-5
    assert (got.mlm_logits[real] - want.prediction_logits[real]).abs().max() <= 1e-5
    assert (got.nsp_logits - want.seq_relationship_logits).abs().max() <= 1e-5


def test_selected_positions_equal_full_logits():
    model = random_model(VOCAB)
    ids, types, mask = batch(pairs=True, padded=True)
    positions = torch.zeros_like(ids, dtype=torch.bool)
    positions[0, 3] = positions[1, 7] = positions[2, 1] = True
    with torch.no_grad():
        full = model(ids, types, mask).mlm_logits
        selected = model(ids, types, mask, mlm_positions=positions).mlm_logits
    assert selected.shape == (3, VOCAB)
    torch.testing.assert_close(selected, full[positions], rtol=0, atol=1e-6)


def test_padding_invariance():
    model = random_model(VOCAB)
    ids, types, mask = batch(pairs=True, padded=True)
    with torch.no_grad():
        batched = model(ids, types, mask)
        for row in range(3):
            length = int(mask[row].sum())
            alone = model(ids[row : row + 1, :length], types[row : row + 1, :length])
            torch.testing.assert_close(alone.last_hidden_state[0], batched.last_hidden_state[row, :length], rtol=0, atol=1e-5)
            torch.testing.assert_close(alone.nsp_logits[0], batched.nsp_logits[row], rtol=0, atol=1e-5)


@pytest.mark.parametrize("lengths, attend_each", [((17, 11, 6), False), ((9, 9), False), ((1, 17, 2, 5), False),
                                                  ((40, 7, 23, 3, 31), True)])
def test_packed_forward_equals_padded(lengths, attend_each):
    """The padding-free path (token-wise layers on real tokens only; on CPU, attention either padded or
    per sequence, as Packing weighs it) gives the padded path's answers. The model is as wide as MiniLM's
    attention, where the choice is between both paths at these lengths."""
    model = random_model(VOCAB, hidden_size=384, num_attention_heads=12)
    g = torch.Generator().manual_seed(3)
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    types = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(5, VOCAB, (n,), generator=g)
        types[row, n // 2 : n] = 1
        mask[row, :n] = 1
    packing = Packing.from_lengths(list(lengths))
    assert packing.attend_each_on_cpu(model.config.hidden_size) is attend_each
    real = mask.bool()
    assert packing.indices.tolist() == real.reshape(-1).nonzero().squeeze(1).tolist()
    with torch.no_grad():
        padded, _ = model.bert(ids, types, mask)
        packed = model.encode_packed(ids[real], types[real], packing)[1]
    assert packed.shape == (sum(lengths), model.config.hidden_size)
    torch.testing.assert_close(packed, padded[real], rtol=0, atol=1e-5)
    torch.testing.assert_close(packed[packing.starts], padded[:, 0], rtol=0, atol=1e-5)


def test_attention_per_sequence_prices_no_padding():
    """The batcher's FLOP model follows the CPU attention arrangement: per-sequence calls waste nothing,
    a padded call wastes count x longest^2 - sum of squares pairs, and the useful work is the same."""
    config = tiny_config(VOCAB)
    lengths = [40, 7, 23, 3, 31]
    count, longest, real, squares = len(lengths), max(lengths), sum(lengths), sum(n * n for n in lengths)
    assert attends_each_on_cpu(count, longest, squares)
    assert not attends_each_on_cpu(3, 9, 3 * 81)  # equal lengths: one call, nothing padded
    assert not attends_each_on_cpu(4, 6, 25 + 36 + 16 + 36)  # short and nearly equal: one padded call is cheaper
    assert not attends_each_on_cpu(count, longest, squares, hidden=32)  # a narrow model: attention is cheap per pair
    total, padding = packed_batch_flops(config, count, longest, real, squares, attention_per_sequence=True)
    padded_total, padded_padding = packed_batch_flops(config, count, longest, real, squares)
    assert padding == 0 and padded_padding > 0
    assert padded_total - padded_padding == total


@pytest.mark.parametrize("padded", [False, True])
def test_pretraining_logits_equal_forward_with_the_same_gradients(padded: bool):
    """The training path (last layer only at masked positions and [CLS]) is exact, forward and backward."""
    model = random_model(VOCAB, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).train()
    ids, types, mask = batch(pairs=True, padded=padded)
    positions = (torch.rand(ids.shape, generator=torch.Generator().manual_seed(5)) < 0.3) & mask.bool()
    positions[:, 0] = False
    positions[2, 4] = True  # every row has one, and rows have different counts

    full = model(ids, types, mask, mlm_positions=positions)
    (full.mlm_logits.square().sum() + full.nsp_logits.square().sum()).backward()
    want = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    mlm, nsp, _ = pretraining_logits(model, ids, types, mask, positions)
    (mlm.square().sum() + nsp.square().sum()).backward()

    torch.testing.assert_close(mlm, full.mlm_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(nsp, full.nsp_logits, rtol=0, atol=1e-5)
    for name, param in model.named_parameters():
        torch.testing.assert_close(param.grad, want[name], rtol=1e-4, atol=1e-6, msg=name)


def test_dropout_rate_scale_and_seed():
    layer = Dropout(0.1).train()
    x = torch.ones(400_000)
    torch.manual_seed(0)
    out = layer(x)
    assert abs(float((out == 0).float().mean()) - 0.1) < 0.003
    torch.testing.assert_close(out[out != 0], torch.full_like(out[out != 0], 1 / 0.9))
    torch.manual_seed(0)
    assert torch.equal(layer(x), out)  # the torch RNG drives it: seeded runs repeat
    assert not torch.equal(layer(x), out)
    assert torch.equal(layer.eval()(x), x) and torch.equal(Dropout(0.0).train()(x), x)
    x.requires_grad_(True)
    layer.train()(x).sum().backward()
    values = x.grad.unique()
    assert len(values) == 2 and values[0] == 0 and values[1] == pytest.approx(1 / 0.9)
    with pytest.raises(ValueError, match="not in"):
        Dropout(1.0)


def test_written_out_attention_with_dropout_equals_sdpa(monkeypatch):
    """In training on CPU, attention is written out to use the cheap dropout; with dropout made the
    identity it must give SDPA's answer (padding included)."""
    model = random_model(VOCAB, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.2)
    ids, types, mask = batch(pairs=True, padded=True)
    with torch.no_grad():
        want = model.eval()(ids, types, mask).last_hidden_state
        monkeypatch.setattr("model.dropout.dropout", lambda x, p, training: x)
        got = model.train()(ids, types, mask).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], rtol=0, atol=1e-5)


def test_decoder_is_tied_to_word_embeddings():
    model = random_model(VOCAB)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight


def test_presets_follow_turc_et_al():
    for name, (layers, hidden) in PRESETS.items():
        config = BertConfig.preset(name)
        assert (config.num_hidden_layers, config.hidden_size) == (layers, hidden)
        assert config.num_attention_heads == hidden // 64 and config.intermediate_size == 4 * hidden


def test_preset_parameter_counts_match_transformers():
    for name in ("tiny", "mini"):
        config = BertConfig.preset(name, vocab_size=8192)
        ours = count_parameters(BertForPreTraining(config))
        hf = transformers.BertForPreTraining(transformers.BertConfig(**config.to_dict())).num_parameters()
        assert ours == hf


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(hidden_size=100, num_attention_heads=3), "divisible by num_attention_heads"),
        (dict(hidden_act="tanh"), "hidden_act"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(hidden_dropout_prob=1.5), "hidden_dropout_prob"),
        (dict(pad_token_id=99999), "pad_token_id"),
    ],
)
def test_config_validation_names_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        BertConfig(**overrides)


def test_config_rejects_unknown_fields_and_unsupported_variants():
    with pytest.raises(ConfigError, match="unknown field"):
        BertConfig.from_dict({"hidden_size": 64, "num_attention_heads": 1, "rotary_dim": 8})
    with pytest.raises(ConfigError, match="is_decoder"):
        BertConfig.from_dict({"is_decoder": True})
    assert BertConfig.from_dict(BertConfig().to_dict()) == BertConfig()


def test_fresh_model_is_initialised_and_meta_build_skips_it():
    """A model for training from scratch gets N(0, initializer_range) weights with a zero padding row (the
    embedding tables skip their own init, _init_weights does it); one built on meta for loading gets none."""
    config = tiny_config(vocab_size=500)
    torch.manual_seed(0)
    model = BertForPreTraining(config)
    for table in (model.bert.embeddings.word_embeddings, model.bert.embeddings.position_embeddings):
        assert abs(float(table.weight.detach().std()) - config.initializer_range) < 0.2 * config.initializer_range
    assert float(model.bert.embeddings.word_embeddings.weight.detach()[config.pad_token_id].abs().sum()) == 0.0
    assert torch.isfinite(torch.cat([p.flatten() for p in model.parameters()])).all()
    with torch.device("meta"):
        assert next(BertForPreTraining(config).parameters()).is_meta
