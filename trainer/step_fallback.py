"""A compiled step that cannot run trains eagerly, and says so.

torch.compile compiles the step at its first call and, with CUDA graphs (--cuda-graphs), records them over the
first calls, forward and backward. Where that raises (an op inductor cannot lower, a capture the driver refuses),
the run would end at its first step; the step as plain PyTorch computes the same losses, slower. So the first
failure of the compiled step drops the step's gradients, logs why, and runs that step and every later one eagerly;
the run's metadata (`compiled_step`) records it. A failure of the eager step is raised as it is.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

log = logging.getLogger("trainer")


class EagerFallback:
    """Wraps a `trainer.gradient_step.GradientStep` whose `forward_model` is compiled; `eager` is the module it
    compiled. `on_fallback(reason)` is told once, when the step turns eager."""

    def __init__(self, step, eager: torch.nn.Module, on_fallback: Callable[[str], None]):
        self.step, self.eager, self.on_fallback = step, eager, on_fallback
        self.reason: str | None = None

    def __call__(self, batch, masked, step_number: int):
        if self.reason is not None or self.step.forward_model is self.eager:
            return self.step(batch, masked, step_number)
        try:
            return self.step(batch, masked, step_number)
        except Exception as exc:  # noqa: BLE001 - any failure of compilation or capture: train eagerly
            if isinstance(exc, torch.OutOfMemoryError):
                raise  # the eager step needs more memory, not less
            self.reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        log.warning("the compiled step failed at step %d (%s): training eagerly from here on", step_number, self.reason)
        self.step.optimizer.zero_grad(set_to_none=True)  # whatever the failed attempt accumulated
        self.step.forward_model, self.step.cuda_graphs = self.eager, False
        self.on_fallback(self.reason)
        return self.step(batch, masked, step_number)
