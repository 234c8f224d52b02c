"""FlashAttention over packed sequences (model.attention.attend_varlen) on the GPU, in bfloat16 and float16:
that the engine really runs it, and that its answers equal the padded path's, transformers' (float32, CPU,
same weights) and, for each sequence, its own answer alone. Skipped where varlen does not run (no CUDA,
torch < 2.10, or `python -m bench.gpu --dry-run` on the CPU)."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch
import transformers

import model.attention as attention
from model.packing import Packing
from tests.conftest import random_model

DEVICE = torch.device(os.environ.get("BERT_TEST_DEVICE", "cuda"))
VOCAB = 300
HEAD_DIM = 64  # BERT-base's head size
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE.type == "cuda" and not torch.cuda.is_available(), reason="no CUDA device here"),
    pytest.mark.skipif(not attention.runs_varlen(DEVICE, torch.bfloat16, HEAD_DIM),
                       reason=f"varlen attention does not run on {DEVICE} with torch {torch.__version__}"),
]
LENGTHS = (5, 130, 17, 9, 64, 3, 33)  # one long sequence among short ones: what padding used to cost


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().reshape(-1).cpu(), b.double().reshape(-1).cpu()
    return float(a @ b / (a.norm() * b.norm()))


def batch(seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.cat((torch.tensor([1]), torch.randint(5, VOCAB, (n - 2,), generator=generator), torch.tensor([2])))
            for n in LENGTHS]


@pytest.fixture(scope="module")
def models():
    ours = random_model(VOCAB, hidden_size=2 * HEAD_DIM, num_attention_heads=2, intermediate_size=256,
                        max_position_embeddings=256, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    peer = transformers.BertModel(transformers.BertConfig(**ours.config.to_dict()), add_pooling_layer=False).eval()
    encoder = {k.removeprefix("bert."): v for k, v in ours.state_dict().items()
               if k.startswith("bert.") and "pooler" not in k}
    peer.load_state_dict(encoder)
    return ours, peer


def packed(model, sequences: list[torch.Tensor]) -> torch.Tensor:
    flat = torch.cat(sequences).to(DEVICE)
    packing = Packing.from_lengths([len(s) for s in sequences]).to(DEVICE)
    with torch.inference_mode():
        return model.encode_packed(flat, torch.zeros_like(flat), packing, for_heads=False)[0]  # (N, H)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_varlen_equals_padded_transformers_and_single(models, dtype, monkeypatch):
    ours, peer = models
    model = copy.deepcopy(ours).to(DEVICE, dtype).eval()
    calls = []
    real_varlen = attention.varlen_kernel()
    monkeypatch.setattr(attention, "varlen_attn", lambda *args: calls.append(args[3]) or real_varlen(*args))
    sequences = batch()
    together = packed(model, sequences)
    assert len(calls) == model.config.num_hidden_layers, "the packed path did not run varlen attention"
    assert calls[0].dtype == torch.int32 and calls[0].device.type == "cuda"

    width = max(LENGTHS)
    ids = torch.zeros(len(LENGTHS), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, s in enumerate(sequences):
        ids[row, : len(s)], mask[row, : len(s)] = s, 1
    with torch.inference_mode():
        padded, _ = model.bert(ids.to(DEVICE), torch.zeros_like(ids).to(DEVICE), mask.to(DEVICE))
        reference = peer(input_ids=ids, attention_mask=mask).last_hidden_state  # float32, CPU
    offsets = [0, *np.cumsum(LENGTHS)]
    for row, s in enumerate(sequences):
        mine = together[offsets[row] : offsets[row + 1]]
        assert cosine(mine, padded[row, : len(s)]) > 0.999, (row, "padded")
        assert cosine(mine, reference[row, : len(s)]) > 0.99, (row, "transformers")
        assert cosine(mine, packed(model, [s])) > 0.999, (row, "alone")
