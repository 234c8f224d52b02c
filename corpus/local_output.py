"""The output as a local directory (or any file system every node mounts at the same path).

Every file is written under a `.tmp-` name in its own folder and flushed to disk (fsync): that is a unit's stage.
Its commit is the rename to the final name and an fsync of the folder, so a crash leaves either the whole file or
a `.tmp-` file, which the next run removes. A unit's rejects file is renamed while staging, before its shard, so a
committed unit always has its rejects beside it; a unit is done exactly when its shard exists under its final name.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from corpus.errors import CorpusError, Rejected
from corpus.manifest import manifest_text, parse_manifest
from corpus.output import MANIFEST, REJECTS, SHARDS, Output, rejects_name, shard_name
from corpus.shards import rejects_text, token_total
from model.files import fsync_directory

TMP_PREFIX = ".tmp-"
RESUME_HINT = "free some space, then run the same command again: it resumes where it stopped"


class LocalOutput(Output):
    def __init__(self, directory: str | Path):
        self.root = Path(directory)
        self.uri = str(directory)

    def where(self, relative: str) -> str:
        return str(self.root / relative)

    def check_target(self) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise CorpusError(self.uri, "--output is a file", "name a directory (it is created when missing)")

    def read_manifest(self) -> dict | None:
        path = self.root / MANIFEST
        if not path.is_file():
            return None
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CorpusError(str(path), f"unreadable manifest: {exc}",
                              "this directory holds no job this command made; choose an empty --output") from None
        return parse_manifest(text, str(path))

    def write_manifest(self, manifest: dict) -> None:
        _write_text(self.root / MANIFEST, manifest_text(manifest))

    def done_units(self) -> set[str]:
        folder = self.root / SHARDS
        return {path.stem for path in folder.glob("part-*.parquet")} if folder.is_dir() else set()

    def prepare(self) -> int:
        removed = 0
        for folder in (self.root, self.root / SHARDS, self.root / REJECTS):
            folder.mkdir(parents=True, exist_ok=True)
            for stale in folder.glob(f"{TMP_PREFIX}*"):
                stale.unlink(missing_ok=True)
                removed += 1
        return removed

    def stage(self, unit_name: str, table: pa.Table, rejects: list[Rejected]) -> Path:
        """The rejects file whole under its final name (it counts only beside a shard), then the shard under its
        `.tmp-` name. A unit redone after a crash overwrites whatever rejects file it left."""
        rejects_path = self.root / rejects_name(unit_name)
        if rejects:
            _write_text(rejects_path, rejects_text(rejects))
        else:
            rejects_path.unlink(missing_ok=True)  # left by an earlier try under --on-error skip
        return _staged(self.root / shard_name(unit_name), lambda path: pq.write_table(table, path))

    def commit(self, unit_name: str, staged: Path) -> None:
        _commit(staged, self.root / shard_name(unit_name))

    def shard_summaries(self, unit_names: list[str]) -> list[dict]:
        summaries = []
        for name in unit_names:
            path = self.root / shard_name(name)
            rejects_file = self.root / rejects_name(name)
            rejects = sum(1 for _ in open(rejects_file, encoding="utf-8")) if rejects_file.is_file() else 0
            summaries.append({"name": name, "rows": pq.read_metadata(path).num_rows, "rejects": rejects,
                              "tokens": token_total(pq.read_table(path, columns=["tokens"]))})
        return summaries


def _as_corpus_error(exc: BaseException, final: Path) -> BaseException:
    """A full disk or another OS error as one line naming the file; anything else as it is."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return CorpusError(str(final), "no space left on the device", RESUME_HINT)
    if isinstance(exc, OSError):
        return CorpusError(str(final), f"cannot write: {exc.strerror or exc}",
                           "check the output directory, then run the same command again")
    return exc


def _staged(final: Path, write) -> Path:
    """`write(path)` into a `.tmp-` file beside `final`, flushed to disk. Any error removes the temporary file."""
    tmp = final.with_name(f"{TMP_PREFIX}{final.name}")
    try:
        write(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        raise _as_corpus_error(exc, final) from None
    return tmp


def _commit(tmp: Path, final: Path) -> None:
    """The staged file renamed to `final` and the folder flushed: it counts from here."""
    try:
        os.replace(tmp, final)
        fsync_directory(final.parent)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        raise _as_corpus_error(exc, final) from None


def _write_text(final: Path, text: str) -> None:
    def write(path: Path) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    _commit(_staged(final, write), final)
