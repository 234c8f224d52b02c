"""The compiled pre-training step (`--compile`): one graph for the whole step, whatever the batch's padding or
masked positions, computing what the eager step computes, forward and backward; and the step of fixed shapes that
replays as CUDA graphs (`--cuda-graphs`), equal to the step at each batch's own shape and compiled once.

Each split of a compiled graph made the host wait for the device mid-step; the step used to split in 12. Compiled
here with `aot_eager` (the graph capture and autograd tracing that inductor also runs, without its code generation,
which needs a C++ or CUDA compiler): the same `compile_forward` the trainer uses, only the backend differs."""

from __future__ import annotations

import copy

import pytest
import torch

from model import BertConfig, BertForPreTraining
from trainer.data.examples import pad_columns
from trainer.data.masking import MaskedBatch, in_slots
from trainer.forward import PreTrainingForward, compile_forward, replays_cuda_graphs, trace_whole

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
    labels = torch.randint(5, CONFIG.vocab_size, (int(positions.sum()),), generator=g)
    nsp_labels = torch.randint(0, 2, (rows,), generator=g)
    return ids, torch.zeros_like(ids), mask, positions, labels, nsp_labels


def in_fixed_slots(inputs, width: int, slots: int):
    """`batch`'s inputs as the trainer gives a fixed-shape step: padded to `width`, masks in `slots` a row."""
    ids, types, mask, positions, labels, nsp_labels = inputs
    masked = MaskedBatch(ids, positions, labels).padded_to(width, pad_id=0)
    masked = in_slots(masked, slots)
    padded = [pad_columns(t, width, 0) for t in (types, mask)]
    return (masked.input_ids, *padded, masked.positions, masked.slot_labels.flatten(), nsp_labels), masked.slots


def test_the_step_is_one_graph():
    trace_whole()  # as compile_forward does for the trainer
    step = PreTrainingForward(BertForPreTraining(CONFIG).train())
    for padded in (True, False):
        explained = torch._dynamo.explain(step)(*batch(4, 24, padded, seed=0), None, padded)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_the_fixed_shape_step_is_one_graph_with_no_value_read_from_the_device():
    """In fixed slots nothing the device computes decides a shape: one graph even without `trace_whole`'s capture
    of counts and nonzeros (the fixture has them off), which a CUDA graph could not contain."""
    step = PreTrainingForward(BertForPreTraining(CONFIG).train())
    inputs, slots = in_fixed_slots(batch(4, 24, True, seed=0), width=32, slots=8)
    explained = torch._dynamo.explain(step)(*inputs, None, True, slots)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    explained = torch._dynamo.explain(step)(*batch(4, 24, True, seed=0), None, True)  # the boolean step does read
    assert explained.graph_break_count > 0


def run_step(step, inputs, *extra):
    step.zero_grad()
    mlm_sum, nsp_sum, mlm_correct, nsp_correct, _ = step(*inputs, *extra)
    (mlm_sum + nsp_sum).backward()
    return ([t.detach() for t in (mlm_sum, nsp_sum, mlm_correct, nsp_correct)],
            [p.grad.clone() for p in step.parameters()])


def test_compiled_equals_eager_forward_and_backward():
    torch.manual_seed(0)
    eager = PreTrainingForward(BertForPreTraining(CONFIG).train())
    compiled = compile_forward(copy.deepcopy(eager), backend="aot_eager")
    for seed, (rows, width, padded) in enumerate([(4, 24, True), (3, 40, False), (5, 32, True)]):
        inputs = batch(rows, width, padded, seed)
        (sums, grads), (sums_c, grads_c) = (run_step(step, inputs, None, padded) for step in (eager, compiled))
        assert sums[0] > 0 and sums[2] >= 0
        for value, value_c in zip(sums, sums_c):
            torch.testing.assert_close(value_c, value)
        for grad, grad_c in zip(grads, grads_c):
            torch.testing.assert_close(grad_c, grad)


@pytest.mark.parametrize("sentence_vectors", [None, "all", "unmasked"])
def test_fixed_slots_compute_what_the_batch_as_it_is_computes(sentence_vectors):
    """Padded to a fixed width with spare slots pointing at [CLS]: the same losses, correct counts, sentence
    vectors and gradients as the batch at its own width with its masked positions selected."""
    torch.manual_seed(1)
    step = PreTrainingForward(BertForPreTraining(CONFIG).train(), sentence_vectors)
    for seed, (rows, width) in enumerate([(4, 24), (3, 40)]):
        inputs = batch(rows, width, padded=True, seed=seed)
        fixed, slots = in_fixed_slots(inputs, width=48, slots=12)
        assert (slots == 0).any()  # spare slots exist and point at [CLS]: they must add nothing
        (sums, grads), (sums_f, grads_f) = run_step(step, inputs, None, True), run_step(step, fixed, None, True, slots)
        for value, value_f in zip(sums, sums_f):
            torch.testing.assert_close(value_f, value)
        for grad, grad_f in zip(grads, grads_f):
            torch.testing.assert_close(grad_f, grad, rtol=1e-4, atol=1e-6)
        if sentence_vectors is not None:
            vectors = step(*inputs, None, True)[-1]
            torch.testing.assert_close(step(*fixed, None, True, slots)[-1], vectors)


def test_the_cuda_graph_step_compiles_once_for_every_batch():
    """compile_forward(cuda_graphs=True): one compilation serves batches whose lengths, padding and masks differ,
    since the trainer gives them one shape (a recompilation would capture new graphs mid-run)."""
    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    step = compile_forward(PreTrainingForward(BertForPreTraining(CONFIG).train()), backend=counting_backend,
                        cuda_graphs=True)
    for seed, (rows, width, padded) in enumerate([(4, 24, True), (4, 40, False), (4, 33, True)]):
        inputs, slots = in_fixed_slots(batch(rows, width, padded, seed), width=48, slots=12)
        run_step(step, inputs, None, True, slots)
    assert len(graphs) == 1


def test_cuda_graphs_only_where_they_were_tried():
    """--compile --cuda-graphs replays the step as CUDA graphs with one process on a CUDA device and one micro-batch a
    step; otherwise (a CPU, torchrun, --grad-accum, --no-cuda-graphs, no --compile) it is compiled, or not, as before."""
    from trainer.options import TrainOptions
    from trainer.placement import Placement

    def graphs(world=1, device="cuda", **flags) -> bool:
        options = TrainOptions(**{"corpus": ["c.txt"], "output": "out", "compile": True, **flags})
        return replays_cuda_graphs(options, Placement(0, world, torch.device(device)))

    assert graphs()
    assert not graphs(device="cpu") and not graphs(world=2) and not graphs(grad_accum=2)
    assert not graphs(cuda_graphs=False) and not graphs(compile=False)
