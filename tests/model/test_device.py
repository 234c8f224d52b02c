"""Device resolution (model.device.pick_device): a CUDA device always carries its index, since
torch.cuda.set_device (the trainer's first CUDA call) refuses "cuda" alone."""

from __future__ import annotations

import pytest
import torch

from model.device import pick_device


@pytest.mark.parametrize(("choice", "rank", "expected"), [("cuda", 0, "cuda:0"), ("cuda", 3, "cuda:3"),
                                                          ("cuda:1", 3, "cuda:1"), ("auto", 2, "cuda:2")])
def test_cuda_devices_carry_an_index(monkeypatch, choice, rank, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    device = pick_device(choice, rank)
    assert device == torch.device(expected) and device.index is not None


def test_cpu_and_missing_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("auto", 1) == torch.device("cpu") and pick_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="CUDA is not available"):
        pick_device("cuda")

