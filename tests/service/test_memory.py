"""The garbage collector of a serving process: what loading leaves is frozen once, after cyclic garbage is gone."""

from __future__ import annotations

import subprocess
import sys

import pytest

from devkit.paths import REPO_ROOT
from service.app import create_app
from service.settings import Settings

# Run in a child: freezing pytest's own objects would keep every later test's cyclic garbage alive.
FREEZE = """
import gc, weakref
from service.memory import YOUNG_OBJECTS, freeze_loaded_objects

class Node:
    pass

kept = [Node() for _ in range(5000)]
cycle = Node(); cycle.me = cycle; dead = weakref.ref(cycle); del cycle
frozen_before = gc.get_freeze_count()
freeze_loaded_objects()
assert dead() is None, "cyclic garbage was frozen instead of collected"
assert gc.get_freeze_count() >= frozen_before + 5000, gc.get_freeze_count()
assert gc.get_count()[2] == 0 and gc.get_threshold()[0] == YOUNG_OBJECTS, (gc.get_count(), gc.get_threshold())
fresh = [Node() for _ in range(10)]
gc.collect()
assert gc.get_freeze_count() >= frozen_before + 5000  # a full collection leaves the frozen objects frozen
print("ok")
"""


def test_freezing_collects_garbage_first_then_exempts_what_lives():
    result = subprocess.run([sys.executable, "-c", FREEZE], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


@pytest.mark.anyio
async def test_the_loaded_hook_runs_once_after_a_successful_load_only(tiny_checkpoint, tmp_path):
    calls = []
    app = create_app(Settings(checkpoint=str(tiny_checkpoint)))
    app.state.on_loaded = lambda: calls.append(app.state.runtime.lifecycle.state)
    async with app.router.lifespan_context(app):
        await app.state.loading
        assert calls == ["ready"]  # the front door is open when it runs: nothing loaded after is missed

    (tmp_path / "config.json").write_text("{}")  # no weights: loading fails
    failing = create_app(Settings(checkpoint=str(tmp_path)))
    failing.state.on_loaded = lambda: calls.append("failed load")
    failing.state.on_load_failure = lambda exc: None
    async with failing.router.lifespan_context(failing):
        await failing.state.loading
    assert calls == ["ready"]
