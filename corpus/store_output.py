"""The output as a prefix in an object store (`s3://bucket/prefix`, through fsspec as the inputs are read, with the
same credentials and endpoint: AWS_* variables, ~/.aws or an instance role, AWS_ENDPOINT_URL for an S3-compatible
store).

An object store has no rename, so a unit is staged by uploading its rejects object (when it has rejects) and its
shard object whole, and committed by writing `done/<unit>.json` last: the shard's rows, rejects and tokens. A unit
is done exactly when both its commit record and its shard exist. Each upload is one atomic PUT (an object appears
whole or not at all), but atomicity is not what exactness rests on: a job stopped between its shard and its commit
record leaves a shard that does not count, which the next run removes and redoes; nothing partial can ever count.
The commit records also spare the job's end from reading every shard back: its totals come from them.
"""

from __future__ import annotations

import contextlib
import json
import posixpath

import pyarrow as pa

from corpus.errors import CorpusError, Rejected
from corpus.inputs import open_filesystem
from corpus.manifest import manifest_text, parse_manifest
from corpus.output import DONE, MANIFEST, REJECTS, SHARDS, Output, rejects_name, shard_name
from corpus.shards import parquet_bytes, rejects_text, token_total

RETRY_HINT = "check the network, the endpoint (AWS_ENDPOINT_URL) and the credentials, then run the same command again"


def commit_name(unit_name: str) -> str:
    return f"{DONE}/{unit_name}.json"


class StoreOutput(Output):
    def __init__(self, uri: str):
        self.uri = uri.rstrip("/")
        self.fs, path = open_filesystem(self.uri)
        self.root = path.rstrip("/")

    def _path(self, relative: str) -> str:
        return f"{self.root}/{relative}"

    @contextlib.contextmanager
    def _reaching(self, relative: str, doing: str):
        """A failure of the store (no such bucket, access denied, no credentials, a dropped connection) as one line
        naming the object."""
        try:
            yield
        except CorpusError:
            raise
        except PermissionError as exc:
            raise CorpusError(self.where(relative), f"not allowed to {doing} it: {exc}",
                              "check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE, an instance role)") from None
        except Exception as exc:  # noqa: BLE001  (s3fs, botocore and aiohttp each raise their own kinds)
            raise CorpusError(self.where(relative), f"cannot {doing} it: {type(exc).__name__}: {exc}",
                              RETRY_HINT) from None

    def check_target(self) -> None:
        bucket, _, key = self.root.partition("/")
        with self._reaching("", "reach"):
            if not self.fs.exists(bucket):
                raise CorpusError(self.uri, f"the bucket {bucket!r} does not exist (or these credentials cannot "
                                            "see it)",
                                  "create it first, or check the name, AWS_ENDPOINT_URL and the credentials")
            if key and self.fs.isfile(self.root):
                raise CorpusError(self.uri, "--output names an object, not a prefix",
                                  "name a prefix (s3://bucket/some/prefix) under which the job writes")

    def read_manifest(self) -> dict | None:
        with self._reaching(MANIFEST, "read"):
            try:
                data = self.fs.cat_file(self._path(MANIFEST))
            except FileNotFoundError:
                return None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorpusError(self.where(MANIFEST), f"unreadable manifest: {exc}", "choose an empty --output") from None
        return parse_manifest(text, self.where(MANIFEST))

    def write_manifest(self, manifest: dict) -> None:
        self._put(MANIFEST, manifest_text(manifest).encode("utf-8"))

    def _listed(self, folder: str, suffix: str) -> set[str]:
        """The unit names of the objects `folder/part-*{suffix}`, listed afresh (not from fsspec's cache)."""
        with self._reaching(folder + "/", "list"):
            try:
                entries = self.fs.ls(self._path(folder), detail=True, refresh=True)
            except FileNotFoundError:
                return set()
        names = (posixpath.basename(entry["name"]) for entry in entries if entry.get("type") != "directory")
        return {name[: -len(suffix)] for name in names if name.startswith("part-") and name.endswith(suffix)}

    def done_units(self) -> set[str]:
        return self._listed(DONE, ".json") & self._listed(SHARDS, ".parquet")

    def prepare(self) -> int:
        """Shards, rejects and commit records of units that are not done (a stop between a unit's uploads) are
        removed; a unit redone uploads them again whole."""
        shards, commits, rejects = (self._listed(SHARDS, ".parquet"), self._listed(DONE, ".json"),
                                    self._listed(REJECTS, ".jsonl"))
        done = shards & commits
        stale = ([shard_name(name) for name in sorted(shards - done)] +
                 [commit_name(name) for name in sorted(commits - done)] +
                 [rejects_name(name) for name in sorted(rejects - done)])
        if stale:
            with self._reaching(stale[0], "remove"):
                self.fs.rm([self._path(name) for name in stale])
        return len(stale)

    def stage(self, unit_name: str, table: pa.Table, rejects: list[Rejected]) -> dict:
        if rejects:
            self._put(rejects_name(unit_name), rejects_text(rejects).encode("utf-8"))
        shard = parquet_bytes(table)
        self._put(shard_name(unit_name), shard)
        return {"name": unit_name, "rows": table.num_rows, "rejects": len(rejects), "tokens": token_total(table),
                "shard_bytes": len(shard)}

    def commit(self, unit_name: str, staged: dict) -> None:
        self._put(commit_name(unit_name), json.dumps(staged).encode("utf-8"))

    def shard_summaries(self, unit_names: list[str]) -> list[dict]:
        paths = [self._path(commit_name(name)) for name in unit_names]
        with self._reaching(DONE + "/", "read"):
            found = self.fs.cat(paths) if paths else {}
        records = [json.loads(found[path]) for path in paths]
        return [{key: record[key] for key in ("name", "rows", "rejects", "tokens")} for record in records]

    def _put(self, relative: str, data: bytes) -> None:
        with self._reaching(relative, "write"):
            self.fs.pipe_file(self._path(relative), data)
