"""The kernels as the service's start-up installs them: `model.attention` asks kernels.attention for its CPU
attention kernel (restored after each test, so that no test depends on another having installed it)."""

from __future__ import annotations

import pytest

import kernels
from model import attention as model_attention


@pytest.fixture(autouse=True)
def installed_kernels(monkeypatch):
    monkeypatch.setattr(model_attention, "_cpu_kernel", model_attention._cpu_kernel)  # put back after the test
    kernels.install()
