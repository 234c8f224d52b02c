"""The job on one machine: three stages in threads, so that reading, tokenizing and writing overlap the engine.

    reader:  work unit -> rows (corpus.readers) -> token ids (or chunks) and rejects    ─┐ bounded queue
    engine:  token ids -> vectors (corpus.embedder), packed batches, the device kept busy ◄┘ ─┐ bounded queue
    writer:  vectors -> one Parquet shard per unit, atomically (corpus.shards)             ◄──┘

The engine's threads compute with the GIL released (torch ops); the reader's tokenizer and pyarrow's readers and
writers release it too for most of their work. Each queue holds two units, so memory stays at a few units
whatever the corpus's size, and a stage that fails stops the others.

Resume: the plan is fixed in the manifest by the first run; a unit is done when its shard exists (corpus.shards);
a later run embeds only the others. Rows are exactly once by construction: each input row belongs to one unit,
and a unit's shard (with its rejects) appears whole or not at all.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from corpus import shards
from corpus.embedder import Embedder, checkpoint_identity, job_identity, resolve_source
from corpus.errors import CorpusError
from corpus.inputs import resolve_inputs
from corpus.plan import make_plan, plan_from_json, plan_to_json
from corpus.progress import Progress, Summary
from corpus.readers import check_columns, read_unit
from corpus.settings import JobSettings
from corpus.tokens import tokenize_unit

log = logging.getLogger("corpus")
MANIFEST_VERSION = 1
QUEUE_UNITS = 2  # units waiting between two stages


def run(settings: JobSettings, stream=None) -> Summary:
    """Embed the corpus `settings` names into `settings.output`, resuming what an earlier run left. Raises
    CorpusError (one line naming the file, and row where there is one) when it cannot go on."""
    started = time.monotonic()
    job = open_job(settings, stream)
    if job.manifest.get("complete"):
        return nothing_to_do(settings, job, stream, started)
    if job.todo:
        settings = computing_in(settings, job)
        embedder = Embedder(settings, job.source)
        job.progress.start()
        try:
            Pipeline(settings, embedder, job.progress).run(job.todo)
        finally:
            embedder.close()
    finish_job(settings, job)
    return job.progress.finish()


@dataclass
class OpenedJob:
    manifest: dict
    plan: list  # every WorkUnit of the job
    todo: list  # those whose shard is not written yet
    progress: Progress
    source: object  # the checkpoint, resolved (model.hub.ResolvedCheckpoint)


def open_job(settings: JobSettings, stream=None) -> OpenedJob:
    """The job's manifest (written by its first run, checked against this one by every later run), plan and units
    left, with what a stopped run left half-written removed. Shared by the Ray job, so either resumes the other."""
    files = resolve_inputs(settings.input, settings.format)
    check_columns(files, settings.text_column, settings.id_column)  # a missing column stops the job before it starts
    inputs = [{"uri": f.uri, "format": f.format, "size": f.size, "fingerprint": f.fingerprint} for f in files]
    source = resolve_source(settings)
    identity, model = job_identity(settings, source), checkpoint_identity(source)
    output = Path(settings.output)
    if output.exists() and not output.is_dir():
        raise CorpusError(str(output), "--output is a file", "name a directory (it is created when missing)")
    removed = shards.prepare_output(output)
    if removed:
        log.info("removed %d unfinished file(s) a stopped run left in %s", removed, output)
    manifest = shards.read_manifest(output)
    if manifest is None:
        if shards.done_units(output):
            raise CorpusError(str(output), "holds shards but no manifest.json", "choose an empty --output")
        plan = make_plan(files, settings.rows_per_shard)
        manifest = {"version": MANIFEST_VERSION, "identity": identity, "model": model, "inputs": inputs,
                    "plan": plan_to_json(plan), "total_rows": sum(u.row_stop - u.row_start for u in plan),
                    "complete": False}
        shards.write_manifest(output, manifest)
    else:
        shards.check_manifest(output, manifest, identity, model, inputs)
        plan = plan_from_json(manifest["plan"])
    pause_point("plan")
    done = shards.done_units(output)
    todo = [unit for unit in plan if unit.name not in done]
    done_rows = sum(unit.row_stop - unit.row_start for unit in plan if unit.name in done)
    if done and todo:
        log.info("resuming: %d of %d shards done already, %d left", len(plan) - len(todo), len(plan), len(todo))
    return OpenedJob(manifest, plan, todo, Progress(manifest["total_rows"], done_rows, stream), source)


def computing_in(settings: JobSettings, job: OpenedJob) -> JobSettings:
    """The settings with --dtype as the job's identity resolved it: every engine of the job (a resumed run's, each Ray
    actor's) computes in the precision the output was begun in, never `auto` again on a host that would choose
    differently."""
    return replace(settings, dtype=job.manifest["identity"]["dtype"])


def nothing_to_do(settings: JobSettings, job: OpenedJob, stream, started: float) -> Summary:
    total = job.manifest["total_rows"]
    print(f"nothing to do: {settings.output} holds this job complete ({total} rows in {len(job.plan)} shards)",
          file=stream or sys.stderr)
    return Summary(0, 0, 0, 0, time.monotonic() - started, 0, total)


def finish_job(settings: JobSettings, job: OpenedJob) -> None:
    """Every shard on disk: the manifest gains each shard's counts, the totals and `complete: true`."""
    shards.write_manifest(settings.output, shards.completed(settings.output, job.manifest,
                                                           [unit.name for unit in job.plan]))


@dataclass
class _Unfinished:
    """A stage's failure, handed down the queues so that the engine stage raises it."""

    error: BaseException


_END = object()


@dataclass
class Pipeline:
    settings: JobSettings
    embedder: Embedder
    progress: Progress
    stopping: threading.Event = field(default_factory=threading.Event)
    batches: int = 0

    def run(self, units: list) -> None:
        tokenized: queue.Queue = queue.Queue(QUEUE_UNITS)
        embedded: queue.Queue = queue.Queue(QUEUE_UNITS)
        failures: list[BaseException] = []
        reader = threading.Thread(target=self._read, args=(units, tokenized), name="corpus-reader", daemon=True)
        writer = threading.Thread(target=self._write, args=(embedded, failures), name="corpus-writer", daemon=True)
        reader.start()
        writer.start()
        try:
            while not self.stopping.is_set():
                item = tokenized.get()
                if item is _END:
                    break
                if isinstance(item, _Unfinished):
                    raise item.error
                vectors = self.embedder.embed(item.token_ids, self._batch_done)
                self._put(embedded, (item, vectors))
        except BaseException:
            self.stopping.set()
            raise
        finally:
            self._put(embedded, _END, force=True)
            writer.join()
            self.stopping.set()
            reader.join(timeout=5)
        if failures:
            raise failures[0]

    def _batch_done(self, sequences: int, tokens: int) -> None:
        self.progress.computed(sequences, tokens)
        self.batches += 1
        pause_point("batches", self.batches)

    def _read(self, units: list, out: queue.Queue) -> None:
        """Each unit's rows, tokenized, in plan order; the first rejected row stops the job under --on-error stop."""
        s, embedder = self.settings, self.embedder
        try:
            for unit in units:
                rows = read_unit(unit, s.text_column, s.id_column)
                prepared = tokenize_unit(unit, rows, embedder.tokenizer, embedder.prompt, s.truncate,
                                         s.chunk_tokens, s.chunk_overlap)
                if prepared.rejects and s.on_error == "stop":
                    raise min(prepared.rejects, key=lambda r: r.row).as_error()
                if not self._put(out, prepared):
                    return
            self._put(out, _END)
        except BaseException as exc:  # noqa: BLE001  (handed to the engine stage, which raises it)
            self._put(out, _Unfinished(exc), force=True)

    def _write(self, embedded: queue.Queue, failures: list) -> None:
        s = self.settings
        schema = shards.shard_schema(self.embedder.dimensions, s.output_precision, s.chunked)
        written = 0
        while True:
            item = embedded.get()
            if item is _END:
                return
            if failures:
                continue  # drain: the engine stage is stopping
            prepared, vectors = item
            try:
                table = shards.shard_table(schema, prepared.ids, vectors, prepared.tokens,
                                           prepared.chunks if s.chunked else None)
                shards.write_shard(s.output, prepared.unit, table, prepared.rejects,
                                   before_rename=lambda path: pause_point("renaming", written + 1))
                written += 1
                unit = prepared.unit
                self.progress.written(unit.row_stop - unit.row_start, prepared.documents, len(prepared.ids),
                                      len(prepared.rejects))
                pause_point("shards", written)
            except BaseException as exc:  # noqa: BLE001  (the engine stage raises it)
                failures.append(exc)
                self.stopping.set()

    def _put(self, into: queue.Queue, item, force: bool = False) -> bool:
        """Put unless the job is stopping (then False); `force` puts anyway, and once the job is stopping makes room
        by dropping what waits there (the stage behind may be gone)."""
        while True:
            if self.stopping.is_set() and not force:
                return False
            try:
                into.put(item, timeout=0.1)
                return True
            except queue.Full:
                if force and self.stopping.is_set():
                    try:
                        into.get_nowait()
                    except queue.Empty:
                        pass


# For the tests of resume: CORPUS_PAUSE_AT=POINT[:N] makes the job stop still at that point (after the plan, after
# N engine batches, while renaming the Nth shard, after the Nth shard), touch CORPUS_PAUSE_FILE and wait there to be
# killed. POINT is one of plan, batches, renaming, shards.
def pause_point(point: str, count: int = 0) -> None:
    wanted = os.environ.get("CORPUS_PAUSE_AT")
    if not wanted:
        return
    name, _, number = wanted.partition(":")
    if name != point or (number and int(number) != count):
        return
    marker = os.environ.get("CORPUS_PAUSE_FILE")
    if marker:
        Path(marker).write_text(f"{point}:{count}\n", encoding="utf-8")
    while True:
        time.sleep(60)
