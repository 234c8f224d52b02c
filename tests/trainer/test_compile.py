"""The compiled pre-training step (`--compile`): one graph for the whole step, whatever the batch's padding or
masked positions, computing what the eager step computes, forward and backward.

Each split of a compiled graph made the host wait for the device mid-step; the step used to split in 12. Compiled
here with `aot_eager` (the graph capture and autograd tracing that inductor also runs, without its code generation,
which needs a C++ or CUDA compiler): the same `compile_step` the trainer uses, only the backend differs."""

from __future__ import annotations

import copy

import pytest
import torch

from model import BertConfig, BertForPreTraining
from trainer.step import PreTrainingStep, compile_step, trace_whole

CONFIG = BertConfig(vocab_size=500, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                    hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@pytest.fixture(autouse=True)
def dynamo_settings():
    """`trace_whole` sets process-wide options: put them back for the rest of the suite."""
    with torch._dynamo.config.patch(capture_scalar_outputs=False, capture_dynamic_output_shape_ops=False):
        yield
    torch._dynamo.reset()


def batch(rows: int, width: int, padded: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, CONFIG.vocab_size, (rows, width), generator=g)
    mask = torch.ones(rows, width, dtype=torch.long)
    if padded:
        mask[0, width // 2:] = 0
    positions = (torch.rand(rows, width, generator=g) < 0.15) & mask.bool()
    positions[:, 0], positions[:, 1] = False, True  # [CLS] is never predicted; every row predicts something
    return ids, torch.zeros_like(ids), mask, positions


def test_the_step_is_one_graph():
    trace_whole()  # as compile_step does for the trainer
    step = PreTrainingStep(BertForPreTraining(CONFIG).train())
    for padded in (True, False):
        explained = torch._dynamo.explain(step)(*batch(4, 24, padded, seed=0), None, padded)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_compiled_equals_eager_forward_and_backward():
    torch.manual_seed(0)
    eager = PreTrainingStep(BertForPreTraining(CONFIG).train())
    compiled = compile_step(copy.deepcopy(eager), backend="aot_eager")
    for seed, (rows, width, padded) in enumerate([(4, 24, True), (3, 40, False), (5, 32, True)]):
        inputs = batch(rows, width, padded, seed)
        results = []
        for step in (eager, compiled):
            step.zero_grad()
            mlm, nsp, _ = step(*inputs, None, padded)
            (mlm.square().mean() + nsp.square().mean()).backward()
            results.append((mlm.detach(), nsp.detach(), [p.grad.clone() for p in step.parameters()]))
        (mlm, nsp, grads), (mlm_c, nsp_c, grads_c) = results
        assert mlm.shape[0] == int(inputs[3].sum())
        torch.testing.assert_close(mlm_c, mlm)
        torch.testing.assert_close(nsp_c, nsp)
        for grad, grad_c in zip(grads, grads_c):
            torch.testing.assert_close(grad_c, grad)
