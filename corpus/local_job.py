"""The job on one machine: three stages in threads, so that reading, tokenizing and writing overlap the engine.

    reader:  work unit -> rows (corpus.readers) -> token ids (or chunks) and rejects    ─┐ bounded queue
    engine:  token ids -> vectors (corpus.embedder), packed batches, the device kept busy ◄┘ ─┐ bounded queue
    writer:  vectors -> one Parquet shard per unit, staged then committed (corpus.output)  ◄──┘

The engine's threads compute with the GIL released (torch ops); the reader's tokenizer and pyarrow's readers and
writers release it too for most of their work. Each queue holds two units, so memory stays at a few units
whatever the corpus's size, and a stage that fails stops the others.

Resume: the plan is fixed in the manifest by the first run; a unit is done when its shard is committed
(corpus.output: a local directory or an object store); a later run embeds only the others. Rows are exactly once
by construction: each input row belongs to one unit, and a unit's shard (with its rejects) counts whole or not at
all. Nothing is written before every option has been checked against the model and the device (`run`).
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from dataclasses import dataclass, field, replace

from corpus import shards
from corpus.embedder import Embedder, checkpoint_identity, job_identity, resolve_source
from corpus.errors import CorpusError
from corpus.inputs import resolve_inputs
from corpus.manifest import VERSION as MANIFEST_VERSION, check_manifest, completed
from corpus.open_output import open_output
from corpus.output import MANIFEST, Output
from corpus.plan import make_plan, plan_from_json, plan_to_json
from corpus.progress import Progress, Summary
from corpus.readers import check_columns, read_unit
from corpus.settings import JobSettings
from corpus.tokens import tokenize_unit

log = logging.getLogger("corpus")
QUEUE_UNITS = 2  # units waiting between two stages


def run(settings: JobSettings, stream=None) -> Summary:
    """Embed the corpus `settings` names into `settings.output`, resuming what an earlier run left. Raises
    CorpusError (one line naming the file, and row where there is one) when it cannot go on, and SettingsError,
    PrecisionError or CheckpointError, before anything is written, when an option cannot work with this model
    here."""
    started = time.monotonic()
    job = open_job(settings, stream)
    if job.manifest.get("complete"):
        return nothing_to_do(settings, job, stream, started)
    # The engine's start-up checks every option against the model and the device (--dimensions against its
    # width, --chunk-tokens against its length, --dtype against the device): before the job's first write, so
    # that a refused option leaves the output as it was and the corrected command starts afresh.
    settings = computing_in(settings, job)
    embedder = Embedder(settings, job.source) if job.todo or job.is_new else None
    try:
        start_job(job)
        if job.todo:
            job.progress.start()
            Pipeline(settings, embedder, job.output, job.progress).run(job.todo)
    finally:
        if embedder is not None:
            embedder.close()
    finish_job(job)
    return job.progress.finish()


@dataclass
class OpenedJob:
    output: Output
    manifest: dict
    is_new: bool  # the manifest is not written yet (start_job writes it)
    plan: list  # every WorkUnit of the job
    todo: list  # those not done yet
    progress: Progress
    source: object  # the checkpoint, resolved (model.hub.ResolvedCheckpoint)


def open_job(settings: JobSettings, stream=None, dtype: str | None = None, int8_path: str | None = None
             ) -> OpenedJob:
    """The job's manifest (the one a first run wrote, checked against this run, or a new one), plan and units left.
    Reads only: an option or an output refused here leaves the output as it was. `dtype` is the precision --dtype
    resolves to where the engine runs (None: on this machine), `int8_path` that machine's int8 kernels
    (kernels.int8_path_identity; None: this machine's). Shared by the Ray job, so either resumes the other."""
    files = resolve_inputs(settings.input, settings.format)
    check_columns(files, settings.text_column, settings.id_column)  # a missing column stops the job before it starts
    inputs = [{"uri": f.uri, "format": f.format, "size": f.size, "fingerprint": f.fingerprint} for f in files]
    source = resolve_source(settings)
    identity, model = job_identity(settings, source, dtype, int8_path), checkpoint_identity(source)
    output = open_output(settings.output)
    output.check_target()
    manifest = output.read_manifest()
    is_new = manifest is None
    if is_new:
        if output.done_units():
            raise CorpusError(output.uri, "holds shards but no manifest.json", "choose an empty --output")
        plan = make_plan(files, settings.rows_per_shard)
        manifest = {"version": MANIFEST_VERSION, "identity": identity, "model": model, "inputs": inputs,
                    "plan": plan_to_json(plan), "total_rows": sum(u.row_stop - u.row_start for u in plan),
                    "complete": False}
        done: set[str] = set()
    else:
        check_manifest(output.where(MANIFEST), manifest, identity, model, inputs)
        plan = plan_from_json(manifest["plan"])
        done = output.done_units()
    todo = [unit for unit in plan if unit.name not in done]
    done_rows = sum(unit.row_stop - unit.row_start for unit in plan if unit.name in done)
    if done and todo:
        log.info("resuming: %d of %d shards done already, %d left", len(plan) - len(todo), len(plan), len(todo))
    return OpenedJob(output, manifest, is_new, plan, todo, Progress(manifest["total_rows"], done_rows, stream),
                     source)


def start_job(job: OpenedJob) -> None:
    """The job's first writes, once every check has passed: what a stopped run left uncommitted is removed, and a
    new job's manifest is written."""
    removed = job.output.prepare()
    if removed:
        log.info("removed %d unfinished file(s) a stopped run left in %s", removed, job.output.uri)
    if job.is_new:
        job.output.write_manifest(job.manifest)


def computing_in(settings: JobSettings, job: OpenedJob) -> JobSettings:
    """The settings with --dtype as the job's identity resolved it: every engine of the job (a resumed run's, each Ray
    actor's) computes in the precision the output was begun in, never `auto` again on a host that would choose
    differently."""
    return replace(settings, dtype=job.manifest["identity"]["dtype"])


def nothing_to_do(settings: JobSettings, job: OpenedJob, stream, started: float) -> Summary:
    total = job.manifest["total_rows"]
    print(f"nothing to do: {settings.output} holds this job complete ({total} rows in {len(job.plan)} shards)",
          file=stream or sys.stderr)
    return Summary(rows=0, documents=0, vectors=0, rejects=0, tokens=0, seconds=time.monotonic() - started, shards=0,
                   already_done=total)


def finish_job(job: OpenedJob) -> None:
    """Every unit committed: the manifest gains each shard's counts, the totals and `complete: true`."""
    summaries = job.output.shard_summaries([unit.name for unit in job.plan])
    job.output.write_manifest(completed(job.manifest, summaries))


@dataclass
class _Unfinished:
    """A stage's failure, handed down the queues so that the engine stage raises it."""

    error: BaseException


_END = object()


@dataclass
class Pipeline:
    settings: JobSettings
    embedder: Embedder
    output: Output
    progress: Progress
    stopping: threading.Event = field(default_factory=threading.Event)

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
                vectors = self.embedder.embed(item.token_ids, self.progress.computed)
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

    def _read(self, units: list, out: queue.Queue) -> None:
        """Each unit's rows, tokenized, in plan order; the first rejected row stops the job under --on-error stop."""
        s, embedder = self.settings, self.embedder
        try:
            for unit in units:
                rows = read_unit(unit, s.text_column, s.id_column)
                prepared = tokenize_unit(unit, rows, embedder.rule)
                if prepared.rejects and s.on_error == "stop":
                    raise min(prepared.rejects, key=lambda r: r.row).as_error()
                if not self._put(out, prepared):
                    return
            self._put(out, _END)
        except BaseException as exc:  # noqa: BLE001  (handed to the engine stage, which raises it)
            self._put(out, _Unfinished(exc), force=True)

    def _write(self, embedded: queue.Queue, failures: list) -> None:
        s = self.settings
        schema = shards.shard_schema(self.embedder.dimensions, s.output_precision, s.chunked, s.multi_vector)
        while True:
            item = embedded.get()
            if item is _END:
                return
            if failures:
                continue  # drain: the engine stage is stopping
            prepared, vectors = item
            try:
                table = shards.shard_table(schema, prepared.ids, vectors, prepared.tokens,
                                           prepared.spans if s.chunked else None)
                unit = prepared.unit
                self.output.write_shard(unit.name, table, prepared.rejects)
                self.progress.written(unit.row_stop - unit.row_start, prepared.documents, len(prepared.ids),
                                      len(prepared.rejects))
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
