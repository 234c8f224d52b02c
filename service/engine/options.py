"""What starting one model's engine depends on, as one plain object: the service's `Settings` and the corpus job's
`JobSettings` each make one (their `engine_options`), and `service.engine.loader.start_engine` takes it, so the two
entry points cannot start a model differently. No torch here: settings objects import it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineOptions:
    """Each field means what the service setting of the same name means (docs/configuration.md); the corpus job
    leaves the ones it has no flag for at these defaults, which are the service's."""

    checkpoint: str
    device: str = "auto"
    dtype: str = "auto"
    max_batch_tokens: int = 16384
    cpu_batch_tokens: int | str = "auto"
    max_batch_size: int | str = "auto"
    concurrent_batches: int = 0
    cuda_graphs: bool = True
    warmup: bool = True
    cpu_keep_freed_memory: bool = True
