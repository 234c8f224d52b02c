"""Corpus download against a local HTTP server: checksum, reuse, corrupt and partial downloads."""

from __future__ import annotations

import hashlib
import http.server
import io
import threading
import zipfile

import pytest

from trainer.corpus import CorpusError
from trainer.download import RemoteCorpus, fetch


def make_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("toy/train.tokens", " = A = \n text of a . \n = B = \n more text . \n")
        zf.writestr("toy/valid.tokens", " = C = \n held out . \n")
    return buffer.getvalue()


class Server:
    def __init__(self, body: bytes, truncate_to: int | None = None):
        self.hits = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                outer.hits += 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[:truncate_to] if truncate_to else body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/toy.zip"

    def close(self):
        self.httpd.shutdown()


def registry(url: str, md5: str) -> dict[str, RemoteCorpus]:
    return {"toy": RemoteCorpus(url=url, md5=md5, train_file="toy/train.tokens", eval_file="toy/valid.tokens")}


@pytest.fixture
def archive() -> bytes:
    return make_zip()


def test_download_verifies_and_is_reused(tmp_path, archive):
    server = Server(archive)
    try:
        reg = registry(server.url, hashlib.md5(archive).hexdigest())
        train, valid = fetch("toy", tmp_path, registry=reg)
        assert "text of a" in train.read_text() and "held out" in valid.read_text()
        fetch("toy", tmp_path, registry=reg)
        assert server.hits == 1  # the second call used the cache
    finally:
        server.close()


def test_corrupt_download_is_never_used(tmp_path, archive):
    server = Server(archive)
    try:
        with pytest.raises(CorpusError, match="corrupt: md5"):
            fetch("toy", tmp_path, registry=registry(server.url, "0" * 32))
        assert not any(p.is_file() for p in (tmp_path / "toy").iterdir())  # no archive, no .part left
        assert not (tmp_path / "toy" / "extracted").exists()
    finally:
        server.close()


def test_partial_download_is_detected(tmp_path, archive):
    server = Server(archive, truncate_to=len(archive) // 2)
    try:
        with pytest.raises(CorpusError, match="cannot download|stopped at"):
            fetch("toy", tmp_path, registry=registry(server.url, hashlib.md5(archive).hexdigest()))
        assert not (tmp_path / "toy" / "extracted").exists()
        assert not list((tmp_path / "toy").glob("*.zip"))
    finally:
        server.close()


def test_file_urls_work_and_unknown_names_are_refused(tmp_path, archive):
    source = tmp_path / "toy.zip"
    source.write_bytes(archive)
    train, _ = fetch("toy", tmp_path / "cache", registry=registry(source.as_uri(), hashlib.md5(archive).hexdigest()))
    assert train.is_file()
    with pytest.raises(CorpusError, match="unknown corpus name 'nope'"):
        fetch("nope", tmp_path)
