"""The corpus job on Ray Data: the same plan, shards and manifest as the job on one machine (corpus.local_job), the
work spread over a Ray cluster.

    work units (one row, one block each) ─► tokenize: CPU tasks (corpus.readers + corpus.tokens)
                                          ─► embed: an actor pool (corpus.embedder), each actor writes its unit's
                                             shard (corpus.shards) and answers with the unit's counts
                                          ─► the driver: progress, then the manifest once every unit is done

A work unit travels whole from reader to writer: the dataset holds one row per unit (its tokenized rows packed in
arrays), so no stage ever splits or merges units, and the shard a unit makes is exactly the shard the job on one
machine makes from it (same tokenization, same packing under the token budget, same file name). That is what makes
resume and failures exact here too: a unit is done when its shard exists under its final name; an embedding actor
killed mid-unit is restarted by Ray (max_restarts) and the unit's task retried on it (max_task_retries), and since
the shard is written atomically the retry writes it whole, once. A run stopped for any reason and started again
embeds only the units without a shard.

Actors: one per GPU on a cluster with GPUs; on CPU nodes `--actors` (default: one per node). The output directory
must be one every node sees (a local disk for `--ray`, a shared file system on a cluster). Ray is an optional extra
(requirements/ray.txt); nothing else in the corpus package imports it.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np

from corpus import shards
from corpus.embedder import Embedder
from corpus.errors import CorpusError, Rejected
from corpus.local_job import computing_in, finish_job, nothing_to_do, open_job
from corpus.plan import WorkUnit
from corpus.progress import Summary
from corpus.readers import read_unit
from corpus.settings import JobSettings
from corpus.tokens import Tokenized, tokenize_unit

log = logging.getLogger("corpus")
TOKENIZE_CPUS = 1  # per tokenizing task
EMBED_CPUS = 1  # per embedding actor on a CPU node (logical: Ray's bookkeeping, not a thread count)


def run(settings: JobSettings, stream=None) -> Summary:
    """Embed the corpus `settings` names into `settings.output` on Ray (`settings.ray_address`, or a local Ray),
    resuming what an earlier run (on Ray or not) left. Raises CorpusError as corpus.local_job.run does."""
    import ray

    started = time.monotonic()
    job = open_job(settings, stream)  # the same manifest, plan and units left as on one machine
    if job.manifest.get("complete"):
        return nothing_to_do(settings, job, stream, started)
    if job.todo:
        started_ray = not ray.is_initialized()
        if started_ray:
            ray.init(address=settings.ray_address, log_to_driver=False, include_dashboard=False,
                     runtime_env=runtime_env())
        job.progress.start()  # the rates' clock: from here the actors' start-up counts in them
        try:
            for result in _results(computing_in(settings, job), job.todo):
                if result["stopped_by"]:
                    raise Rejected(**json.loads(result["stopped_by"])).as_error()
                job.progress.computed(int(result["vectors"]), int(result["tokens"]))
                job.progress.written(int(result["planned"]), int(result["documents"]), int(result["vectors"]),
                                     int(result["rejects"]))
        except Exception as exc:
            raise _as_corpus_error(exc) from None
        finally:
            if started_ray:
                ray.shutdown()
    finish_job(settings, job)
    return job.progress.finish()


def _as_corpus_error(exc: BaseException) -> BaseException:
    """A CorpusError raised in a worker comes back wrapped in Ray's exceptions (with the worker's traceback in its
    text): the job's one-line error again, else `exc` as it is."""
    seen = exc
    while seen is not None:
        if isinstance(seen, CorpusError):
            return CorpusError(seen.source, seen.problem, seen.hint, row=seen.row)
        seen = getattr(seen, "cause", None) or seen.__cause__
    return exc


def runtime_env() -> dict:
    """What the workers need to import this package: the directory that holds it on their PYTHONPATH (the code is
    where the driver's is, on every node: the same checkout or image; nothing is uploaded)."""
    here = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    return {"env_vars": {"PYTHONPATH": path}}


def _results(settings: JobSettings, todo: list[WorkUnit]):
    """The dataset, run: one result row per unit as its shard lands (in whatever order units finish)."""
    import ray
    import ray.data

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # corpus.progress reports instead
    logging.getLogger("ray.data").setLevel(logging.WARNING)  # its per-dataset INFO lines would break into the progress
    gpus = int(ray.cluster_resources().get("GPU", 0))
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    actors = gpus if gpus and settings.actors is None else (settings.actors or nodes)
    where = {"num_gpus": 1} if gpus else {"num_cpus": EMBED_CPUS}
    units = ray.data.from_items([{"unit": json.dumps(unit.to_json())} for unit in todo],
                                override_num_blocks=len(todo))
    tokenized = units.map(_tokenize, fn_args=(_settings_json(settings),), num_cpus=TOKENIZE_CPUS)
    # Ray Data restarts a pool's dead actor and retries its task there (max_restarts=-1, max_task_retries=-1 are its
    # defaults for actor pools); tests/corpus/test_ray.py fails if that ever changes.
    written = tokenized.map_batches(_EmbedUnit, fn_constructor_args=(_settings_json(settings),), batch_size=1,
                                    compute=ray.data.ActorPoolStrategy(size=actors), **where)
    log.info("on Ray: %d unit(s), %d embedding actor(s) (%s)", len(todo), actors, "GPU" if gpus else "CPU")
    return written.iter_rows()


# ---- what the workers run ---------------------------------------------------------------------


def _settings_json(settings: JobSettings) -> str:
    return json.dumps(asdict(settings))


def _settings_from_json(text: str) -> JobSettings:
    values = json.loads(text)
    return JobSettings(**{f.name: values[f.name] for f in fields(JobSettings) if f.name in values})


def _tokenize(row: dict, settings_json: str) -> dict:
    """A work unit -> its rows tokenized, packed into one dataset row (numpy arrays, no Python object per token)."""
    settings = _settings_from_json(settings_json)
    tokenizer, prompt = _tokenizer(settings.checkpoint)
    unit = WorkUnit.from_json(json.loads(row["unit"]))
    prepared = tokenize_unit(unit, read_unit(unit, settings.text_column, settings.id_column), tokenizer, prompt,
                             settings.truncate, settings.chunk_tokens, settings.chunk_overlap)
    return pack(prepared)


@functools.lru_cache(maxsize=2)
def _tokenizer(checkpoint: str):
    """The checkpoint's tokenizer and /embed's default prompt, read once per worker process (no weights loaded)."""
    from model.checkpoint_files import load_checkpoint_files
    from model.hub import resolve_checkpoint

    files = load_checkpoint_files(resolve_checkpoint(checkpoint).path)
    return files.tokenizer, dict(files.pooling.prompts).get(files.pooling.default_prompt_name, "")


def pack(prepared: Tokenized) -> dict:
    """A Tokenized as one dataset row: its sequences flattened with their lengths, its rejects as JSON lines."""
    chunk, start, end = prepared.chunks or ([], [], [])
    return {"unit": json.dumps(prepared.unit.to_json()), "ids": json.dumps(prepared.ids),
            "token_ids": np.fromiter((t for ids in prepared.token_ids for t in ids), dtype=np.int32),
            "lengths": np.asarray(prepared.tokens, dtype=np.int32),
            "chunks": np.asarray([chunk, start, end], dtype=np.int32).reshape(3, len(chunk)),
            "rejects": json.dumps([asdict(r) for r in prepared.rejects]), "documents": prepared.documents,
            "chunked": prepared.chunks is not None}


def unpack(row: dict) -> Tokenized:
    lengths = np.asarray(row["lengths"], dtype=np.int64)
    flat = np.asarray(row["token_ids"], dtype=np.int32)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    token_ids = [flat[bounds[k]:bounds[k + 1]].tolist() for k in range(len(lengths))]
    chunks = tuple(np.asarray(row["chunks"]).reshape(3, -1).tolist()) if row["chunked"] else None
    rejects = [Rejected(**r) for r in json.loads(row["rejects"])]
    return Tokenized(WorkUnit.from_json(json.loads(row["unit"])), json.loads(row["ids"]), token_ids,
                     lengths.tolist(), chunks, rejects, int(row["documents"]))


class _EmbedUnit:
    """One engine per actor; each call embeds one unit and writes its shard (and rejects) atomically."""

    def __init__(self, settings_json: str):
        self.settings = _settings_from_json(settings_json)
        self.embedder = Embedder(self.settings)
        self.schema = shards.shard_schema(self.embedder.dimensions, self.settings.output_precision,
                                          self.settings.chunked)
        self.calls = 0

    def __call__(self, batch: dict) -> dict:
        prepared = unpack({name: values[0] for name, values in batch.items()})
        s, unit = self.settings, prepared.unit
        result = {"unit": [unit.name], "planned": [unit.row_stop - unit.row_start], "documents": [prepared.documents],
                  "vectors": [len(prepared.ids)], "rejects": [len(prepared.rejects)],
                  "tokens": [int(sum(prepared.tokens))], "pid": [os.getpid()], "stopped_by": [""]}
        self.calls += 1
        pause_once("embedding", self.calls)
        if prepared.rejects and s.on_error == "stop":  # no shard: the driver stops the job on the first reject
            result["stopped_by"] = [json.dumps(asdict(min(prepared.rejects, key=lambda r: r.row)))]
            return result
        vectors = self.embedder.embed(prepared.token_ids)
        table = shards.shard_table(self.schema, prepared.ids, vectors, prepared.tokens,
                                   prepared.chunks if s.chunked else None)
        shards.write_shard(s.output, unit, table, prepared.rejects)
        return result


# For the test of a killed actor: CORPUS_PAUSE_AT=embedding:N makes the first embedding actor to reach its Nth unit
# write its process id to CORPUS_PAUSE_FILE and stand still there, to be killed; the actor Ray restarts in its place
# sees the file and goes on.
def pause_once(point: str, count: int) -> None:
    marker = os.environ.get("CORPUS_PAUSE_FILE")
    if os.environ.get("CORPUS_PAUSE_AT") != f"{point}:{count}" or not marker or Path(marker).exists():
        return
    claimed = Path(f"{marker}.{os.getpid()}")
    claimed.write_text(str(os.getpid()), encoding="utf-8")
    try:
        os.link(claimed, marker)  # atomic, and only one actor wins
    except FileExistsError:
        return
    finally:
        claimed.unlink()
    while True:
        time.sleep(60)
