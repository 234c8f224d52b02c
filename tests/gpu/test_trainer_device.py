"""The trainer's first CUDA call, torch.cuda.set_device, on what `--device cuda` resolves to: it raised
"Expected a torch.device with a specified index" when given a device without one."""

from __future__ import annotations

import pytest
import torch

from model.device import pick_device
from trainer.loop import Placement, Training  # noqa: F401  (the module whose constructor calls set_device)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")]


def test_set_device_accepts_what_cuda_resolves_to():
    device = pick_device("cuda")
    torch.cuda.set_device(device)
    assert torch.cuda.current_device() == device.index == 0
