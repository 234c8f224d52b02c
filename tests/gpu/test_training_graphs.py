"""The trainer's step replayed as CUDA graphs (`--compile --cuda-graphs`, trainer.forward.compile_forward) on the GPU, with
inductor as the trainer compiles it: inductor keeps every graph of the step as a CUDA graph, batches of different
lengths and masks in fixed slots compile once, losses and gradients are the eager step's, and dropout draws anew
at each replay (a graph replaying one frozen mask would still train, silently worse). Skipped without CUDA; the
same step is checked eagerly and with `aot_eager` on the CPU in tests/trainer/test_compile.py."""

from __future__ import annotations

import copy
import os

import pytest
import torch

from model import BertConfig, BertForPreTraining
from tests.trainer.test_compile import batch, in_fixed_slots
from trainer.forward import PreTrainingForward, compile_forward, cuda_graph_skips

DEVICE = torch.device(os.environ.get("BERT_TEST_DEVICE", "cuda"))
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(DEVICE.type != "cuda" or not torch.cuda.is_available(), reason="CUDA graphs need CUDA"),
]
# One layer: inductor compiles the forward and the backward for every test, a few seconds a layer on the GPU host
CONFIG = dict(vocab_size=500, hidden_size=64, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128)
WIDTH, SLOTS = 48, 12


def on_device(inputs, slots):
    return tuple(t.to(DEVICE) for t in inputs), slots.to(DEVICE)


def replay(step, inputs, slots, bfloat16: bool = True) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    torch.compiler.cudagraph_mark_step_begin()
    step.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bfloat16):
        mlm_sum, nsp_sum, mlm_correct, nsp_correct, _ = step(*inputs, None, True, slots)
    (mlm_sum + nsp_sum).backward()
    # read before the next replay overwrites the graphs' memory
    return ([t.detach().float().clone() for t in (mlm_sum, nsp_sum, mlm_correct, nsp_correct)],
            [p.grad.float().clone() for p in step.parameters()])


def test_the_step_replays_as_cuda_graphs_and_computes_what_the_eager_step_does():
    torch.manual_seed(0)
    eager = PreTrainingForward(BertForPreTraining(BertConfig(**CONFIG, hidden_dropout_prob=0.0,
                                                          attention_probs_dropout_prob=0.0)).train().to(DEVICE))
    compiled = compile_forward(copy.deepcopy(eager), cuda_graphs=True)
    skips_before, graphs_before = cuda_graph_skips(), torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for seed, (rows, width, padded) in enumerate([(8, 24, True), (8, 40, False), (8, 33, True), (8, 24, True)]):
        inputs, slots = on_device(*in_fixed_slots(batch(rows, width, padded, seed), WIDTH, SLOTS))
        (sums, grads), (sums_g, grads_g) = replay(eager, inputs, slots), replay(compiled, inputs, slots)
        _, exact = replay(eager, inputs, slots, bfloat16=False)
        for value, value_g in zip(sums[:2], sums_g[:2]):  # bfloat16 products of different kernels
            torch.testing.assert_close(value_g, value, rtol=3e-2, atol=1e-2)
        everything = [torch.cat([g.flatten() for g in gs]) for gs in (grads, grads_g)]
        assert torch.nn.functional.cosine_similarity(*everything, dim=0) > 0.99
        # Parameter by parameter, against float32: a gradient a million times smaller than the loss's scale is
        # mostly bfloat16 rounding in both steps (one such bias gradient sat at cosine 0.90 between them), so
        # the graph's step is held to its distance from float32, within a few times the eager step's own.
        for name, grad, grad_g, grad_f32 in zip([n for n, _ in eager.named_parameters()], grads, grads_g, exact):
            eager_error, graph_error = (grad - grad_f32).norm(), (grad_g - grad_f32).norm()
            assert graph_error <= 4 * eager_error + 0.02 * grad_f32.norm() + 1e-9, (name, graph_error, eager_error)
    assert cuda_graph_skips() == skips_before, "inductor ran part of the step without CUDA graphs"
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs_before + 1  # compiled once for all


def test_dropout_draws_anew_at_each_replay():
    torch.manual_seed(0)
    step = compile_forward(PreTrainingForward(BertForPreTraining(BertConfig(**CONFIG)).train().to(DEVICE)),
                        cuda_graphs=True)
    inputs, slots = on_device(*in_fixed_slots(batch(8, 40, True, seed=3), WIDTH, SLOTS))
    losses = [replay(step, inputs, slots)[0][0] for _ in range(5)]  # warm-up, recording, then replays
    assert len({float(loss) for loss in losses[2:]}) == 3, losses
