"""A woken model's batch on the express runner's own CUDA stream (service.engine.streams, --gpu-express-lane) while
another model's graphed batches are queued on the default stream: each model's answers are its own, as when it runs
alone. Skipped without CUDA and varlen attention, as tests/gpu/test_cuda_graphs.py is; the scheduling rules (a
model's batches on one stream at a time) are tested on the CPU in tests/service/engine/test_express_stream.py."""

from __future__ import annotations

import threading

import torch

from service.engine.engine import Engine
from service.engine.loader import capture_graphs
from service.engine.streams import express_stream
from tests.conftest import random_model
from tests.gpu import test_cuda_graphs
from tests.gpu.test_cuda_graphs import BATCHES, DEVICE, HEAD_DIM, assert_close
from tests.service.engine.test_graphs import VOCAB, items_of

pytestmark = test_cuda_graphs.pytestmark  # where the graphs' own tests run


def graphed_engine(seed: int) -> Engine:
    model = random_model(VOCAB, seed, hidden_size=2 * HEAD_DIM, num_attention_heads=2, intermediate_size=256,
                         max_position_embeddings=256, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    engine = Engine(model, DEVICE, torch.bfloat16)
    assert capture_graphs(engine, 2048, 16, runners=1) > 0
    return engine


def test_a_woken_models_batch_on_its_own_stream_answers_as_alone_beside_a_flood():
    flooded, quiet = graphed_engine(1), graphed_engine(2)
    flood_batches = [items_of(lengths, seed) for seed, lengths in enumerate(BATCHES * 4)]
    quiet_items = items_of((40, 7, 19, 3), 99)
    flood_alone = [flooded.run(flooded.collate(items)) for items in flood_batches]
    quiet_alone = quiet.run(quiet.collate(quiet_items))
    assert not all(torch.equal(a, b) for a, b in zip(flooded.model.state_dict().values(),
                                                    quiet.model.state_dict().values()))  # two models
    streams: dict = {}

    def express_runner():
        with express_stream(DEVICE)():
            stream = torch.cuda.current_stream(DEVICE)
            streams["express"] = (stream, stream.priority)
            streams["answers"] = quiet.run(quiet.collate(quiet_items))

    launched = [flooded.launch(flooded.collate(items)) for items in flood_batches]  # queued on the default stream
    runner = threading.Thread(target=express_runner)
    runner.start()
    runner.join(60)
    stream, priority = streams["express"]
    assert stream != torch.cuda.default_stream(DEVICE) and priority < 0  # its own stream, above the default's 0
    assert torch.cuda.current_stream(DEVICE) == torch.cuda.default_stream(DEVICE)  # this thread's stream unchanged
    for a, b in zip(quiet_alone, streams["answers"], strict=True):
        assert_close(a, b)
    for expected, handle in zip(flood_alone, launched, strict=True):
        answers = flooded.finish(handle)
        for a, b in zip(expected, answers, strict=True):
            assert_close(a, b)
