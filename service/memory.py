"""The garbage collector in a long-running server process.

By the time a process serves, it holds some 300,000 objects that live as long as it does (the modules of
torch, FastAPI and pydantic, the tokenizer, the model's modules). CPython's full collections walk every one
of them: 137 ms each in a front end under load, 13 of them in a 12-second run, a quarter of that process's
CPU (measured with `gc.callbacks`, `bench.serving.server_cpu`'s load). Moving them into the permanent
generation once they are loaded (`gc.freeze`, as the CPython docs suggest for pre-fork servers) leaves the
collector only the objects made while serving.
"""

from __future__ import annotations

import gc

YOUNG_OBJECTS = 10_000


def freeze_loaded_objects() -> None:
    """Collect what start-up left behind, then exempt everything still alive from later collections.
    Call once, when loading is over: what is frozen is never freed, even if it later becomes garbage."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_OBJECTS, *gc.get_threshold()[1:])
