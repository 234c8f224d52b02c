"""Downloading the public WikiText corpora into a cache, verified by checksum and reused.

Each corpus has mirrors, tried in order: the archives' current home (wikitext.smerity.com, the
dataset author's site) first, the original S3 bucket (which answers 403 since 2024) as a fallback.
The archive goes to `<name>.zip.part`, is hashed while it streams, and is renamed to its final name
only when the checksum matches; extraction goes to a temporary directory renamed into place at the
end. A partial or corrupt download is therefore never used, and a completed one is never fetched again.

Failures say whether retrying can help: `DownloadError.permanent` is true when every mirror refused
for good (404, 403, 410, a checksum mismatch) or the name is unknown; the trainer then exits with
EXIT_PERMANENT so that a supervisor does not restart it forever (network errors exit EXIT_TRANSIENT).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import urllib.request
import uuid
import zipfile
import urllib.error
from dataclasses import dataclass, field
from pathlib import Path

from trainer.data.corpus import CorpusError

DEFAULT_CACHE = Path(os.environ.get("BERT_CACHE_DIR", Path.home() / ".cache" / "bert-serve"))
EXIT_PERMANENT = 3  # retrying cannot help: fix the corpus name or the mirror list
EXIT_TRANSIENT = 75  # EX_TEMPFAIL: the network failed; retrying later may work
PERMANENT_HTTP = {401, 403, 404, 410, 451}
USER_AGENT = "bert-serve-trainer/0.1 (corpus download)"  # some hosts refuse Python's default agent


class DownloadError(CorpusError):
    def __init__(self, message: str, permanent: bool):
        super().__init__(message)
        self.permanent = permanent


@dataclass(frozen=True)
class RemoteCorpus:
    urls: tuple[str, ...]  # mirrors, tried in order
    md5: str  # of the archive, as published (torchtext and others list the same values)
    train_file: str  # member path, relative to the archive root
    eval_file: str
    member_sha256: dict[str, str] = field(default_factory=dict)  # extra checks of extracted files


REMOTE_CORPORA = {
    "wikitext-2": RemoteCorpus(
        urls=("https://wikitext.smerity.com/wikitext-2-v1.zip",
              "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-v1.zip"),
        md5="542ccefacc6c27f945fb54453812b3cd",
        train_file="wikitext-2/wiki.train.tokens",
        eval_file="wikitext-2/wiki.valid.tokens",
        member_sha256={
            "wikitext-2/wiki.valid.tokens": "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8",
            "wikitext-2/wiki.test.tokens": "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0",
        },
    ),
    "wikitext-103": RemoteCorpus(
        urls=("https://wikitext.smerity.com/wikitext-103-v1.zip",
              "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip"),
        md5="9ddaacaf6af0710eda8c456decff7832",
        train_file="wikitext-103/wiki.train.tokens",
        eval_file="wikitext-103/wiki.valid.tokens",
    ),
}


def _file_digest(path: Path, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch(name: str, cache_dir: Path = DEFAULT_CACHE, registry: dict[str, RemoteCorpus] | None = None,
          timeout: float = 60.0) -> tuple[Path, Path]:
    """Return (train file, eval file) of a named corpus, downloading and extracting it once."""
    registry = REMOTE_CORPORA if registry is None else registry
    if name not in registry:
        raise DownloadError(f"unknown corpus name {name!r}; known: {sorted(registry)}", permanent=True)
    remote = registry[name]
    root = Path(cache_dir) / name
    extracted = root / "extracted"
    if not extracted.is_dir():
        archive = _download(remote, root, timeout)
        _extract(archive, remote, extracted)
    return extracted / remote.train_file, extracted / remote.eval_file


def _download(remote: RemoteCorpus, root: Path, timeout: float) -> Path:
    """The verified archive, from the first mirror that delivers it."""
    root.mkdir(parents=True, exist_ok=True)
    archive = root / Path(remote.urls[0]).name
    if archive.is_file() and _file_digest(archive, "md5") == remote.md5:
        return archive
    failures: list[DownloadError] = []
    for url in remote.urls:
        try:
            _download_one(url, remote.md5, archive, timeout)
            return archive
        except DownloadError as exc:
            failures.append(exc)
    permanent = all(f.permanent for f in failures)
    raise DownloadError("; ".join(str(f) for f in failures), permanent=permanent)


def _download_one(url: str, md5: str, archive: Path, timeout: float) -> None:
    partial = archive.with_name(archive.name + f".part-{uuid.uuid4().hex[:6]}")
    digest = hashlib.md5()
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response, open(partial, "wb") as out:
            expected = response.headers.get("Content-Length")
            received = 0
            for chunk in iter(lambda: response.read(1 << 20), b""):
                out.write(chunk)
                digest.update(chunk)
                received += len(chunk)
        if expected is not None and received != int(expected):
            raise DownloadError(f"download of {url} stopped at {received} of {expected} bytes", permanent=False)
        if digest.hexdigest() != md5:
            raise DownloadError(f"download of {url} is corrupt: md5 {digest.hexdigest()} != expected {md5}",
                                permanent=True)
        os.replace(partial, archive)
    except urllib.error.HTTPError as exc:
        raise DownloadError(f"cannot download {url}: HTTP {exc.code} {exc.reason}",
                            permanent=exc.code in PERMANENT_HTTP) from None
    except OSError as exc:  # URLError, timeouts, refused connections and disk errors are all OSError
        raise DownloadError(f"cannot download {url}: {exc}", permanent=False) from None
    finally:
        partial.unlink(missing_ok=True)


def _extract(archive: Path, remote: RemoteCorpus, extracted: Path) -> None:
    tmp = extracted.with_name(f".extracted-{uuid.uuid4().hex[:6]}")
    try:
        with zipfile.ZipFile(archive) as zf:
            for member in zf.namelist():
                target = (tmp / member).resolve()
                if not str(target).startswith(str(tmp.resolve())):  # no "../" escapes
                    raise CorpusError(f"{archive}: unsafe member path {member!r}")
            zf.extractall(tmp)
        for member in (remote.train_file, remote.eval_file):
            if not (tmp / member).is_file():
                raise CorpusError(f"{archive}: has no {member}")
        for member, sha in remote.member_sha256.items():
            if _file_digest(tmp / member, "sha256") != sha:
                raise CorpusError(f"{archive}: {member} does not match its published checksum")
        os.replace(tmp, extracted)
    except zipfile.BadZipFile as exc:
        archive.unlink(missing_ok=True)
        raise CorpusError(f"{archive}: not a valid zip archive ({exc}); removed, download again") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
