"""The CPU attention paths a packed batch can take, for tests that check each one: the C kernel as the service
installs it, one SDPA call per sequence, and the padded call."""

from __future__ import annotations

import model.attention as attention
from model.packing import Packing

CPU_ATTENTION_PATHS = ["as chosen", "one call per sequence", "padded"]


def use_cpu_attention_path(monkeypatch, path: str) -> None:
    """Make packed CPU attention take `path` until the test ends."""
    monkeypatch.setattr(attention, "_cpu_kernel", attention._cpu_kernel)  # restored after the test
    if path == "as chosen":  # the C kernel where this CPU can run it, as the service installs it
        import kernels

        kernels.install()
        return
    monkeypatch.setattr(attention, "_cpu_kernel", lambda: None)
    monkeypatch.setattr(Packing, "attend_each_on_cpu", lambda self, hidden: path == "one call per sequence")
