"""The GPU path, on the device BERT_TEST_DEVICE names (default cuda; skipped cleanly without CUDA). `python -m
bench.gpu` runs these on a GPU, and its --dry-run on the CPU (so that they cannot rot): the service's engine
(packed batches, pinned-memory transfers, SDPA) against transformers on the same weights, in float32, bfloat16
and float16, for all three heads; packed equals padded; batched equals single."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import transformers

from service.engine.engine import Engine
from model.checkpoint import load_checkpoint
from service.tasks import EncodeItem, FillMaskItem, FillMaskScores, MaskScores, NspItem
from tests.conftest import random_model
from tests.gpu.confident import CHECKPOINT, assert_same_fill_mask, cloze_items

DEVICE = torch.device(os.environ.get("BERT_TEST_DEVICE", "cuda"))
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(), reason="no CUDA device here"),
]
VOCAB = 300
# How far each precision may move from transformers in float32: cosine of hidden states and logits.
FLOORS = {torch.float32: 0.99999, torch.bfloat16: 0.99, torch.float16: 0.999}
DTYPES = [torch.float32, torch.bfloat16] + ([torch.float16] if DEVICE.type == "cuda" else [])


def inputs(seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """Mixed-length single texts and pairs, [CLS]=1 ... [SEP]=2, a [MASK]=4 in each."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for length in (5, 17, 9, 33, 3, 12):
        ids = torch.randint(5, VOCAB, (length,), generator=generator).tolist()
        ids[length // 2] = 4
        cut = length // 3 if length > 8 else length
        out.append(([1, *ids[:cut], 2, *ids[cut:], 2] if cut < length else [1, *ids, 2],
                    [0] * (cut + 2) + [1] * (length - cut + 1) if cut < length else [0] * (length + 2)))
    return out


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def reference():
    """transformers in float32 on the CPU, the same weights: the answer every precision is held to."""
    ours = random_model(VOCAB, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    peer = transformers.BertForPreTraining(transformers.BertConfig(**ours.config.to_dict())).eval()
    peer.load_state_dict(ours.state_dict(), strict=False)
    answers = []
    for ids, types in inputs():
        with torch.no_grad():
            out = peer(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([types]), output_hidden_states=True)
        answers.append((out.hidden_states[-1][0].numpy(), out.prediction_logits[0].numpy(),
                        out.seq_relationship_logits[0].numpy()))
    return ours, answers


def engine_items() -> list:
    items = []
    for ids, types in inputs():
        items += [EncodeItem(ids, types, pooling="none"), FillMaskItem(ids, types, mask_positions=[ids.index(4)],
                                                                       top_k=VOCAB), NspItem(ids, types)]
    return items


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_engine_equals_transformers_for_every_head(reference, dtype):
    ours, answers = reference
    engine = Engine(random_model(VOCAB, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), DEVICE, dtype)
    results = engine.run(engine.collate(engine_items()))
    floor = FLOORS[dtype]
    assert len(results) == 3 * len(answers)
    for index, (hidden, mlm, nsp) in enumerate(answers):
        vectors, filled, next_sentence = results[3 * index : 3 * index + 3]
        assert vectors.vectors.shape == hidden.shape and cosine(vectors.vectors, hidden) > floor, (index, dtype)
        position = inputs()[index][0].index(4)
        # log-probabilities, centred: a random model's probabilities are all near 1/VOCAB, so that the vectors of
        # two different answers would still be at cosine ~1; their logs are not
        want = torch.log_softmax(torch.tensor(mlm[position]), -1).numpy()
        assert len(filled.masks) == 1 and len(filled.masks[0].token_ids) == VOCAB
        got = np.full(VOCAB, np.nan)
        got[filled.masks[0].token_ids] = np.log(filled.masks[0].scores)
        assert np.isfinite(got).all()
        assert cosine(got - got.mean(), want - want.mean()) > floor, (index, dtype)
        assert next_sentence.logits.shape == nsp.shape and cosine(next_sentence.logits, nsp) > floor, (index, dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_packed_equals_padded_and_batched_equals_single(dtype):
    model = random_model(VOCAB, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    engine = Engine(model, DEVICE, dtype)
    items = [EncodeItem(ids, types, pooling="none") for ids, types in inputs(seed=3)]
    batched = engine.run(engine.collate(items))
    singles = [engine.run(engine.collate([item]))[0] for item in items]
    width = max(len(item) for item in items)
    ids = torch.zeros(len(items), width, dtype=torch.long)
    types, mask = torch.zeros_like(ids), torch.zeros_like(ids)
    for row, item in enumerate(items):
        ids[row, : len(item)] = torch.tensor(item.input_ids)
        types[row, : len(item)] = torch.tensor(item.token_type_ids)
        mask[row, : len(item)] = 1
    with torch.inference_mode():
        padded, _ = engine.model.bert(ids.to(DEVICE), types.to(DEVICE), mask.to(DEVICE))
    floor = FLOORS[dtype]
    assert len(batched) == len(singles) == len(items)
    for row, (together, alone) in enumerate(zip(batched, singles, strict=True)):
        assert together.vectors.shape == alone.vectors.shape == (len(items[row]), model.config.hidden_size)
        assert cosine(together.vectors, alone.vectors) > floor
        assert cosine(together.vectors, padded[row, : len(items[row])].float().cpu().numpy()) > floor


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fill_mask_gives_transformers_best_token_where_the_model_is_confident(dtype):
    """The bundled model on the cloze probe, the engine on this device in each precision against transformers in
    float32 on the CPU: the same best token on every confident mask (tests/gpu/confident.py)."""
    checkpoint = load_checkpoint(CHECKPOINT)
    items = cloze_items(checkpoint.tokenizer)
    peer = transformers.BertForMaskedLM.from_pretrained(CHECKPOINT, torch_dtype=torch.float32).eval()
    reference = []
    for item in items:
        with torch.no_grad():
            logits = peer(input_ids=torch.tensor([item.input_ids]),
                          token_type_ids=torch.tensor([item.token_type_ids])).logits[0, item.mask_positions[0]]
        probs = torch.softmax(logits, -1)
        scores, ids = probs.topk(item.top_k)
        reference.append(FillMaskScores([MaskScores(item.mask_positions[0], ids.numpy(), scores.numpy())]))
    engine = Engine(checkpoint.model, DEVICE, dtype)
    assert_same_fill_mask(reference, engine.run(engine.collate(items)))
