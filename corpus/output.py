"""Where a job writes: a local directory or a prefix in an object store (`s3://bucket/prefix`), behind one interface
that both jobs (one machine, Ray) use. The layout is the same in both:

    manifest.json                              the job (corpus.manifest)
    shards/part-FFFFF-RRRRRRRRRRRR.parquet     one per work unit (corpus.plan), the unit's name as its stem
    rejects/part-....jsonl                     a unit's rejected rows with their reason (only when it had some)
    done/part-....json                         object stores only: the unit's commit record (corpus.store_output)

A unit's files are written in two steps: `stage` writes them whole where they do not count yet, `commit` makes the
unit done in one atomic step. Exactly-once rests on that: a unit is done exactly when its commit happened, a stop
before the commit leaves nothing that counts, and the unit is redone whole by the next run. A local directory
stages under `.tmp-` names and commits by a rename (corpus.local_output); an object store has no rename, so the
shard object is uploaded whole first and the unit is committed by a small record under done/, written last
(corpus.store_output).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import pyarrow as pa

from corpus.errors import Rejected

MANIFEST = "manifest.json"
SHARDS, REJECTS, DONE = "shards", "rejects", "done"


def shard_name(unit_name: str) -> str:
    return f"{SHARDS}/{unit_name}.parquet"


def rejects_name(unit_name: str) -> str:
    return f"{REJECTS}/{unit_name}.jsonl"


class Output(ABC):
    uri: str  # as the user named it: messages name it

    def where(self, relative: str) -> str:
        """A file of the output as messages name it: a path, or the object's URI."""
        return f"{self.uri.rstrip('/')}/{relative}"

    @abstractmethod
    def check_target(self) -> None:
        """Raise CorpusError when the output cannot hold a job (a file; a bucket that does not exist), writing
        nothing."""

    @abstractmethod
    def read_manifest(self) -> dict | None:
        """The manifest a run wrote, or None when there is none yet."""

    @abstractmethod
    def write_manifest(self, manifest: dict) -> None:
        """Write (or replace) the manifest atomically."""

    @abstractmethod
    def done_units(self) -> set[str]:
        """Names of the units whose shard is committed."""

    @abstractmethod
    def prepare(self) -> int:
        """Before a run writes its first file: what a stopped run left uncommitted is removed (a unit redone
        rewrites it whole). Returns how many files or objects were removed."""

    @abstractmethod
    def stage(self, unit_name: str, table: pa.Table, rejects: list[Rejected]) -> object:
        """The unit's rejects file (when it has rejects) and shard, written whole where they do not count yet.
        Returns what `commit` needs."""

    @abstractmethod
    def commit(self, unit_name: str, staged: object) -> None:
        """Make the staged unit done, in one atomic step."""

    @abstractmethod
    def shard_summaries(self, unit_names: list[str]) -> list[dict]:
        """{"name", "rows", "rejects", "tokens"} of each committed unit, read from what the output holds (so that a
        job finished over several runs counts each row once)."""

    def write_shard(self, unit_name: str, table: pa.Table, rejects: list[Rejected]) -> None:
        self.commit(unit_name, self.stage(unit_name, table, rejects))
