"""Corpus download against a local HTTP server: checksum, reuse, corrupt and partial downloads."""

from __future__ import annotations

import hashlib
import http.server
import io
import threading
import zipfile

import pytest

from trainer.cli import main
from trainer.data.corpus import CorpusError
from trainer.data.download import EXIT_PERMANENT, EXIT_TRANSIENT, DownloadError, RemoteCorpus, fetch


def make_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("toy/train.tokens", " = A = \n text of a . \n = B = \n more text . \n")
        zf.writestr("toy/valid.tokens", " = C = \n held out . \n")
    return buffer.getvalue()


class Server:
    def __init__(self, body: bytes, truncate_to: int | None = None, status: int = 200):
        self.hits = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                outer.hits += 1
                if status != 200:
                    self.send_error(status)
                    return
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
    urls = (url,) if isinstance(url, str) else tuple(url)
    return {"toy": RemoteCorpus(urls=urls, md5=md5, train_file="toy/train.tokens", eval_file="toy/valid.tokens")}


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


def test_a_dead_mirror_falls_back_to_the_next(tmp_path, archive):
    dead, alive = Server(archive, status=403), Server(archive)
    try:
        train, _ = fetch("toy", tmp_path, registry=registry([dead.url, alive.url], hashlib.md5(archive).hexdigest()))
        assert train.is_file() and dead.hits == 1 and alive.hits == 1
    finally:
        dead.close()
        alive.close()


def test_failures_say_whether_retrying_can_help(tmp_path, archive):
    gone = Server(archive, status=404)
    try:
        with pytest.raises(DownloadError, match="HTTP 404") as raised:
            fetch("toy", tmp_path, registry=registry(gone.url, hashlib.md5(archive).hexdigest()))
        assert raised.value.permanent
        with pytest.raises(DownloadError, match="corrupt") as raised:  # served, but not the published archive
            fetch("toy", tmp_path, registry=registry(Server(archive).url, "0" * 32))
        assert raised.value.permanent
        refused = "http://127.0.0.1:9/toy.zip"  # nothing listens on the discard port
        with pytest.raises(DownloadError) as raised:
            fetch("toy", tmp_path, registry=registry([gone.url, refused], hashlib.md5(archive).hexdigest()))
        assert not raised.value.permanent  # one mirror may come back
        with pytest.raises(DownloadError) as raised:
            fetch("nope", tmp_path)
        assert raised.value.permanent
    finally:
        gone.close()


@pytest.mark.parametrize("permanent, code", [(True, EXIT_PERMANENT), (False, EXIT_TRANSIENT)])
def test_the_cli_exits_with_a_code_that_tells_retry_from_never(tmp_path, monkeypatch, capsys, permanent, code):
    import trainer.loop

    def fail(options, command=None):
        raise DownloadError("cannot download http://x/toy.zip: HTTP 404 Not Found", permanent=permanent)

    monkeypatch.setattr(trainer.loop, "train", fail)
    assert main(["--corpus", "wikitext-2", "--output", str(tmp_path / "out"), "--no-progress"]) == code
    assert "error: cannot download" in capsys.readouterr().err
