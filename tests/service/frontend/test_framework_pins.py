"""What the front end takes from uvicorn beyond its public API, held to the versions it was written against.

Two things have no public way: bounding a connection's headers (service/frontend/connections.py subclasses uvicorn's
httptools protocol: uvicorn arms no timer before a request's headers and bounds neither their size nor the number of
connections in a way that answers JSON), and noticing a departed client without a task per request
(service/frontend/disconnects.py reads uvicorn's request object's `disconnected`). pyproject.toml pins uvicorn to the
minor version this was written against; these tests fail when an install drifts from that range, or when the
names the two modules rely on are gone."""

from __future__ import annotations

import inspect
import re
import tomllib
from importlib.metadata import version

from packaging.specifiers import SpecifierSet
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from devkit.paths import REPO_ROOT


def pinned(package: str) -> SpecifierSet:
    dependencies = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    found = next(d for d in dependencies if re.match(rf"{package}(\[|[<>=!~])", d))
    return SpecifierSet(re.sub(r"^[A-Za-z0-9_.-]+(\[[^]]*\])?", "", found))


def test_the_installed_uvicorn_is_within_the_pinned_range():
    assert version("uvicorn") in pinned("uvicorn"), (version("uvicorn"), pinned("uvicorn"))
    assert "0.60.0" not in pinned("uvicorn")  # a range, not an open floor: a later minor is a decision, not a drift


def test_the_protocol_hooks_the_connection_limits_override_are_uvicorns():
    overridden = ("connection_made", "connection_lost", "on_message_begin", "on_url", "on_header",
                  "on_headers_complete")
    for hook in overridden:
        assert callable(getattr(HttpToolsProtocol, hook, None)), hook
    source = inspect.getsource(HttpToolsProtocol)
    for attribute in ("self.connections", "self.cycle", "self.loop", "self.transport", "self.app"):
        assert attribute in source, attribute  # read or replaced by the subclass


def test_the_request_object_says_whether_its_client_is_gone():
    source = inspect.getsource(RequestResponseCycle)
    assert "self.disconnected" in source and "async def receive" in source
    assert "response_complete" in source  # connections.py reads it to tell an idle connection from a busy one
