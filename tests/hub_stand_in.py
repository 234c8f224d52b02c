"""A local stand-in for the Hugging Face Hub: the few endpoints huggingface_hub 2.4's snapshot_download calls.

- GET  /api/models/{org}/{name}[/revision/{rev}]   model info: the commit (`sha`) and the files (`siblings`)
- GET  /api/models/{org}/{name}/tree/{rev}         the file listing snapshot_download filters
- HEAD /{org}/{name}/resolve/{rev}/{path}          X-Repo-Commit, ETag, Content-Length (no X-Xet-* header and no
                                                   xetHash in listings, so the library downloads over plain HTTP)
- GET  the same                                    the bytes, honouring `Range: bytes=N-` (how it resumes)

Errors carry the X-Error-Code header the library maps to its exceptions (RepoNotFound, RevisionNotFound,
GatedRepo, EntryNotFound). `cuts[path] = n` makes the next n transfers of `path` stop halfway and close the
connection; `delay_s` slows every transfer (to make two clients overlap).
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests.optional import MINILM, required_or_skip


@dataclass
class Repo:
    revisions: dict[str, str]  # branch or tag -> commit hash
    commits: dict[str, dict[str, bytes]]  # commit hash -> path in repo -> content
    gated_token: str | None = None  # downloads need "Authorization: Bearer <this>"


def files_of(directory: Path, extra: dict[str, bytes] | None = None) -> dict[str, bytes]:
    """Every file under `directory` by its repo path, plus `extra` (files the service must never fetch)."""
    files = {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}
    return {**files, **(extra or {})}


def commit_hash(files: dict[str, bytes]) -> str:
    digest = hashlib.sha1()
    for path in sorted(files):
        digest.update(path.encode() + b"\0" + hashlib.sha1(files[path]).digest())
    return digest.hexdigest()


@dataclass
class HubStandIn:
    repos: dict[str, Repo] = field(default_factory=dict)
    cuts: dict[str, int] = field(default_factory=dict)
    delay_s: float = 0.0
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path) in arrival order
    ranges: list[str] = field(default_factory=list)  # Range headers received (a resumed transfer sends one)

    def add(self, hub_id: str, files: dict[str, bytes], revision: str = "main", gated_token: str | None = None) -> str:
        commit = commit_hash(files)
        repo = self.repos.setdefault(hub_id, Repo({}, {}, gated_token))
        repo.revisions[revision] = commit
        repo.commits[commit] = files
        return commit

    def fetched(self, method: str = "GET") -> list[str]:
        return [path for m, path in self.requests if m == method and "/resolve/" in path]

    def start(self) -> str:
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                stand_in.answer(self, body=False)

            def do_GET(self) -> None:
                stand_in.answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ---- answers ---------------------------------------------------------------------------------

    def answer(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        path = urlsplit(handler.path).path
        self.requests.append((handler.command, path))
        if handler.headers.get("Range"):
            self.ranges.append(handler.headers["Range"])
        api = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/(revision|tree)/([^/]+))?/?", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if api:
            hub_id, kind, revision = api[1], api[2] or "revision", unquote(api[3] or "main")
            found = self.find(handler, hub_id, revision, body)
            if found:
                commit, files = found
                if kind == "tree":
                    listing = [{"type": "file", "path": p, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                               for p, b in files.items()]
                else:
                    listing = {"id": hub_id, "sha": commit, "private": False,
                               "gated": "manual" if self.repos[hub_id].gated_token else False,
                               "siblings": [{"rfilename": p, "size": len(b)} for p, b in files.items()]}
                self.send(handler, 200, json.dumps(listing).encode(), {"Content-Type": "application/json"}, body)
        elif resolve:
            hub_id, revision, file_path = resolve[1], unquote(resolve[2]), unquote(resolve[3])
            found = self.find(handler, hub_id, revision, body, download=True)
            if found:
                self.send_file(handler, found[0], found[1], file_path, body)
        else:
            self.send(handler, 404, b"{}", {"X-Error-Code": "RepoNotFound"}, body)

    def find(self, handler, hub_id: str, revision: str, body: bool, download: bool = False):
        repo = self.repos.get(hub_id)
        if repo is None:
            self.send(handler, 401, b'{"error":"Repository not found"}',
                      {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}, body)
            return None
        commit = repo.revisions.get(revision, revision if revision in repo.commits else None)
        if commit is None:
            self.send(handler, 404, b'{"error":"Invalid rev id"}',
                      {"X-Error-Code": "RevisionNotFound", "X-Error-Message": "Invalid rev id: " + revision}, body)
            return None
        if download and repo.gated_token and handler.headers.get("Authorization") != f"Bearer {repo.gated_token}":
            self.send(handler, 401, b'{"error":"gated"}', {
                "X-Error-Code": "GatedRepo",
                "X-Error-Message": f"Access to model {hub_id} is restricted. You must have access to it and be "
                                   "authenticated to access it. Please log in."}, body)
            return None
        return commit, repo.commits[commit]

    def send_file(self, handler, commit: str, files: dict[str, bytes], file_path: str, body: bool) -> None:
        content = files.get(file_path)
        headers = {"X-Repo-Commit": commit}
        if content is None:
            self.send(handler, 404, b"{}", {**headers, "X-Error-Code": "EntryNotFound"}, body)
            return
        headers.update({"ETag": f'"{hashlib.sha256(content).hexdigest()}"', "Accept-Ranges": "bytes"})
        status, start = 200, 0
        ranged = re.fullmatch(r"bytes=(\d+)-", handler.headers.get("Range", ""))
        if ranged:
            status, start = 206, int(ranged[1])
            headers["Content-Range"] = f"bytes {start}-{len(content) - 1}/{len(content)}"
        part = content[start:]
        if not body:
            self.send(handler, status, b"", {**headers, "Content-Length": str(len(content))}, False)
            return
        if self.cuts.get(file_path, 0) > 0:  # send half of it, then hang up
            self.cuts[file_path] -= 1
            self.send_headers(handler, status, {**headers, "Content-Length": str(len(part))})
            handler.wfile.write(part[: len(part) // 2])
            handler.wfile.flush()
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return
        self.send(handler, status, part, headers, True)

    def send(self, handler, status: int, payload: bytes, headers: dict, body: bool) -> None:
        self.send_headers(handler, status, {"Content-Length": str(len(payload)), **headers})
        if body and payload:
            step = 64 * 1024
            for offset in range(0, len(payload), step):
                if self.delay_s:
                    threading.Event().wait(self.delay_s)
                handler.wfile.write(payload[offset: offset + step])

    @staticmethod
    def send_headers(handler, status: int, headers: dict) -> None:
        handler.send_response(status)
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.end_headers()


# ---- pytest fixtures (import them into a test module to use them) ---------------------------------

MINILM_ID = "sentence-transformers/all-MiniLM-L6-v2"
CROSS_ENCODER_ID = "test-org/tiny-cross-encoder"
PICKLE_ONLY_ID = "test-org/pickle-only"
GATED_ID = "test-org/gated"
GATED_TOKEN = "hf_stand_in_token"
# What the real repositories also hold and the service must never fetch.
NEVER_FETCHED = {"pytorch_model.bin": b"\x80\x04pickle, never loaded", "onnx/model.onnx": b"onnx bytes",
                 "openvino/openvino_model.bin": b"openvino bytes"}


def minilm_dir() -> Path:
    return Path(required_or_skip(*MINILM).MODEL_DIR)


def build_stand_in(cross_encoder: Path, other_cross_encoder: Path) -> HubStandIn:
    hub = HubStandIn()
    hub.add(MINILM_ID, files_of(minilm_dir(), NEVER_FETCHED))
    hub.add(CROSS_ENCODER_ID, files_of(cross_encoder))
    hub.add(CROSS_ENCODER_ID, files_of(other_cross_encoder), revision="v1")
    weights_free = {k: v for k, v in files_of(cross_encoder).items() if not k.endswith(".safetensors")}
    hub.add(PICKLE_ONLY_ID, {**weights_free, "pytorch_model.bin": NEVER_FETCHED["pytorch_model.bin"]})
    hub.add(GATED_ID, files_of(cross_encoder), gated_token=GATED_TOKEN)
    return hub


def use_stand_in(monkeypatch, url: str, cache: Path) -> None:
    """Point huggingface_hub at the stand-in and an empty cache, with no token and online."""
    import huggingface_hub.constants

    for name, value in {"HF_ENDPOINT": url, "HF_HOME": str(cache), "HF_HUB_CACHE": str(cache / "hub"),
                        "HF_HUB_DISABLE_TELEMETRY": "1"}.items():
        monkeypatch.setenv(name, value)
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    # read once at import by the library: no telemetry request to the real Hub from this process
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory, tokenizer, tiny_cross_encoder):
    """The stand-in, serving MiniLM, a tiny cross-encoder (main, and another at tag v1), a pickle-only and a gated
    repository."""
    from tests.conftest import sequence_classifier

    other = sequence_classifier(tmp_path_factory.mktemp("ckpt") / "other", tokenizer, num_labels=1, seed=5)
    hub = build_stand_in(tiny_cross_encoder, other)
    hub.url = hub.start()
    yield hub
    hub.stop()


@pytest.fixture
def hub(stand_in, monkeypatch, tmp_path):
    """The stand-in with a fresh cache under tmp_path; its request log and faults reset."""
    use_stand_in(monkeypatch, stand_in.url, tmp_path / "hf")
    stand_in.requests.clear(), stand_in.ranges.clear(), stand_in.cuts.clear()
    stand_in.delay_s = 0.0
    stand_in.cache = tmp_path / "hf" / "hub"
    return stand_in


def tree(directory: Path) -> dict[str, str]:
    """sha256 of every file under `directory` (links followed, as a loader reads them)."""
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}
