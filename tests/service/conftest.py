from __future__ import annotations

from contextlib import asynccontextmanager

import httpx
import pytest

from service.app import create_app
from service.settings import Settings


@pytest.fixture
def anyio_backend():
    return "asyncio"


@asynccontextmanager
async def serving(checkpoint, engine_factory=None, **overrides):
    """The app with its lifespan running and the model loaded, behind an in-process httpx client. In float32 unless
    the test asks for another `dtype`: most tests hold answers to `transformers`' float32 ones within 1e-5, and
    `--dtype auto` may serve bfloat16 on a CPU that has it (tests/service/engine/test_auto_precision.py)."""
    overrides.setdefault("dtype", "float32")
    app = create_app(Settings(checkpoint=checkpoint, **overrides), engine_factory=engine_factory)
    async with app.router.lifespan_context(app):
        await app.state.loading
        assert app.state.runtime.lifecycle.failure is None, app.state.runtime.lifecycle.failure
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test", timeout=60) as client:
            client.app = app
            yield client
