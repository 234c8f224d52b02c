"""The corpus job on Ray Data: the same plan, shards and manifest as the job on one machine (corpus.local_job), the
work spread over a Ray cluster.

    work units (one row, one block each) ─► tokenize: CPU tasks (corpus.readers + corpus.tokens)
                                          ─► embed: an actor pool (corpus.embedder), each actor writes its unit's
                                             shard (corpus.output) and answers with the unit's counts
                                          ─► the driver: progress, then the manifest once every unit is done

A work unit travels whole from reader to writer: the dataset holds one row per unit (its tokenized rows flattened
into arrays), so no stage ever splits or merges units, and the shard a unit makes is exactly the shard the job on
one machine makes from it (same tokenization, same batches under the token budget, same file name). That is what
makes resume and failures exact here too: a unit is done when its shard is committed (corpus.output); an embedding
actor killed mid-unit is restarted by Ray (max_restarts) and the unit's task retried on it (max_task_retries), and
since a shard counts only once committed, the retry writes it whole, once. A run stopped for any reason and started
again embeds only the units not committed.

Before anything is written, the engine is started once where the actors run (a task with an actor's resources), so
that an option the model or the workers' device cannot take is refused with the output left as it was.

Actors: one per GPU on a cluster with GPUs; on CPU nodes `--actors` (default: one per node). The output must be one
every node reaches: an object store (`s3://...`), or a directory on a local disk for `--ray` or on a shared file
system on a cluster. Ray is an optional extra (requirements/ray.txt); nothing else in the corpus package imports it.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import platform
import time
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np

from corpus import shards
from corpus.embedder import Embedder
from corpus.errors import CorpusError, Rejected
from corpus.local_job import computing_in, finish_job, nothing_to_do, open_job, start_job
from corpus.open_output import open_output
from corpus.plan import WorkUnit
from corpus.progress import Summary
from corpus.readers import read_unit
from corpus.settings import JobSettings, SettingsError
from corpus.tokenized import Tokenized
from corpus.tokens import token_rule, tokenize_unit

log = logging.getLogger("corpus")
TOKENIZE_CPUS = 1  # per tokenizing task
EMBED_CPUS = 1  # per embedding actor on a CPU node (logical: Ray's bookkeeping, not a thread count)
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")  # where the object store is (corpus.inputs)


def run(settings: JobSettings, stream=None) -> Summary:
    """Embed the corpus `settings` names into `settings.output` on Ray (`settings.ray_address`, or a local Ray),
    resuming what an earlier run (on Ray or not) left. Raises CorpusError as corpus.local_job.run does, and
    SettingsError, PrecisionError or CheckpointError, before anything is written, when an option cannot work with
    this model on the workers' devices."""
    import ray

    started = time.monotonic()
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address=settings.ray_address, log_to_driver=False, include_dashboard=False,
                 runtime_env=runtime_env())
    try:
        try:
            dtype, int8_path = _start_engine_where_it_runs(settings)
            # the same manifest, plan and units left as on one machine
            job = open_job(settings, stream, dtype, int8_path)
            if job.manifest.get("complete"):
                return nothing_to_do(settings, job, stream, started)
            start_job(job)
            if job.todo:  # the rates' clock started with the job's progress: the actors' start-up counts in them
                computing = computing_in(settings, job)
                for result in _results(computing, job.todo, job.manifest["identity"].get("int8_path")):
                    if result["stopped_by"]:
                        raise Rejected(**json.loads(result["stopped_by"])).as_error()
                    job.progress.computed(int(result["vectors"]), int(result["tokens"]))
                    job.progress.written(int(result["rows"]), int(result["documents"]), int(result["vectors"]),
                                         int(result["rejects"]))
        except Exception as exc:
            raise _unwrapped(exc) from None
    finally:
        if started_ray:
            ray.shutdown()
    finish_job(job)
    return job.progress.finish()


def _unwrapped(exc: BaseException) -> BaseException:
    """An error raised in a worker comes back wrapped in Ray's exceptions (with the worker's traceback in its text):
    the job's own error again (a one-line CorpusError, or an option the model cannot take), else `exc` as it is."""
    from ray.exceptions import RayError

    from model.checkpoint_files import CheckpointError
    from model.hub import CheckpointSourceError
    from service.engine.precision import PrecisionError

    seen = exc
    while seen is not None:
        if isinstance(seen, CorpusError):
            return CorpusError(seen.source, seen.problem, seen.hint, row=seen.row)
        if isinstance(seen, (SettingsError, PrecisionError, CheckpointError, CheckpointSourceError)) and \
                not isinstance(seen, RayError):
            return seen
        seen = getattr(seen, "cause", None) or seen.__cause__
    return exc


def runtime_env() -> dict:
    """What the workers need: the directory that holds this package on their PYTHONPATH (the code is where the
    driver's is, on every node: the same checkout or image; nothing is uploaded), and the driver's object-store
    endpoint (AWS_ENDPOINT_URL), so that every node reads and writes the same store. Credentials are not sent
    through Ray: each node has its own (AWS_* variables, ~/.aws or an instance role)."""
    here = str(Path(__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    endpoints = {name: os.environ[name] for name in ENDPOINT_VARIABLES if os.environ.get(name)}
    return {"env_vars": {"PYTHONPATH": path, **endpoints}}


def _actor_resources() -> tuple[dict, int]:
    """What one embedding actor asks of Ray (one GPU on a cluster with GPUs, else EMBED_CPUS), and how many GPUs
    the cluster has."""
    import ray

    gpus = int(ray.cluster_resources().get("GPU", 0))
    return ({"num_gpus": 1} if gpus else {"num_cpus": EMBED_CPUS}), gpus


def _start_engine_where_it_runs(settings: JobSettings) -> tuple[str, str | None]:
    """The engine started once, as an embedding actor starts it and where one runs (a GPU node's device may not be
    the driver's), before the job writes anything: every option is checked against the model and that device,
    and an option refused here leaves the output as it was. Returns what --dtype resolves to there, and for int8 the
    identity of the kernels' path there (every actor is then held to it)."""
    import ray

    where, _ = _actor_resources()
    # max_calls=1: the worker exits afterwards, so no engine (or a GPU's memory) stays held beside the actors
    start = ray.remote(max_calls=1, max_retries=0)(_start_engine).options(**where)
    return ray.get(start.remote(_settings_json(settings)))


def _results(settings: JobSettings, todo: list[WorkUnit], int8_path: str | None = None):
    """The dataset, run: one result row per unit as its shard lands (in whatever order units finish)."""
    import ray
    import ray.data

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # corpus.progress reports instead
    logging.getLogger("ray.data").setLevel(logging.WARNING)  # its per-dataset INFO lines would break into the progress
    where, gpus = _actor_resources()
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    actors = gpus if gpus and settings.actors is None else (settings.actors or nodes)
    units = ray.data.from_items([{"unit": json.dumps(unit.to_json())} for unit in todo],
                                override_num_blocks=len(todo))
    tokenized = units.map(_tokenize, fn_args=(_settings_json(settings),), num_cpus=TOKENIZE_CPUS)
    # Ray Data restarts a pool's dead actor and retries its task there (max_restarts=-1, max_task_retries=-1 are its
    # defaults for actor pools); tests/corpus/test_ray.py fails if that ever changes.
    written = tokenized.map_batches(_EmbedUnit, fn_constructor_args=(_settings_json(settings), int8_path),
                                    batch_size=1, compute=ray.data.ActorPoolStrategy(size=actors), **where)
    log.info("on Ray: %d unit(s), %d embedding actor(s) (%s)", len(todo), actors, "GPU" if gpus else "CPU")
    return written.iter_rows()


# ---- what the workers run ---------------------------------------------------------------------


def _settings_json(settings: JobSettings) -> str:
    return json.dumps(asdict(settings))


def _settings_from_json(text: str) -> JobSettings:
    values = json.loads(text)
    return JobSettings(**{f.name: values[f.name] for f in fields(JobSettings) if f.name in values})


def _start_engine(settings_json: str) -> tuple[str, str | None]:
    """(--dtype as resolved on this worker's device, this worker's int8 path identity where that is int8)."""
    settings = _settings_from_json(settings_json)
    embedder = Embedder(settings)
    embedder.close()
    # --dtype auto is what the engine chose on this worker's device; any other choice is recorded as asked
    dtype = embedder.precision.name if settings.dtype == "auto" else settings.dtype
    return dtype, _int8_path() if dtype == "int8" else None


def _int8_path() -> str:
    from kernels import int8_path_identity

    return int8_path_identity()


def _tokenize(row: dict, settings_json: str) -> dict:
    """A work unit -> its rows tokenized, as one dataset row (numpy arrays, no Python object per token)."""
    settings = _settings_from_json(settings_json)
    unit = WorkUnit.from_json(json.loads(row["unit"]))
    prepared = tokenize_unit(unit, read_unit(unit, settings.text_column, settings.id_column), _token_rule(settings_json))
    return to_dataset_row(prepared)


@functools.lru_cache(maxsize=2)
def _token_rule(settings_json: str):
    """How the job's texts become sequences (the checkpoint's tokenizer, /embed's default prompt, a ColBERT's
    markers), read once per worker process (no weights loaded)."""
    from model.checkpoint_files import load_checkpoint_files
    from model.hub import resolve_checkpoint

    settings = _settings_from_json(settings_json)
    return token_rule(settings, load_checkpoint_files(resolve_checkpoint(settings.checkpoint).path))


def to_dataset_row(prepared: Tokenized) -> dict:
    """A Tokenized as one dataset row: its sequences flattened with their lengths, its rejects as JSON lines."""
    chunk, start, end = prepared.spans or ([], [], [])
    return {"unit": json.dumps(prepared.unit.to_json()), "ids": json.dumps(prepared.ids),
            "token_ids": np.fromiter((t for ids in prepared.token_ids for t in ids), dtype=np.int32),
            "lengths": np.asarray(prepared.tokens, dtype=np.int32),
            "spans": np.asarray([chunk, start, end], dtype=np.int32).reshape(3, len(chunk)),
            "rejects": json.dumps([asdict(r) for r in prepared.rejects]), "documents": prepared.documents,
            "chunked": prepared.spans is not None}


def from_dataset_row(row: dict) -> Tokenized:
    lengths = np.asarray(row["lengths"], dtype=np.int64)
    flat = np.asarray(row["token_ids"], dtype=np.int32)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    token_ids = [flat[bounds[k]:bounds[k + 1]].tolist() for k in range(len(lengths))]
    spans = tuple(np.asarray(row["spans"]).reshape(3, -1).tolist()) if row["chunked"] else None
    rejects = [Rejected(**r) for r in json.loads(row["rejects"])]
    return Tokenized(WorkUnit.from_json(json.loads(row["unit"])), json.loads(row["ids"]), token_ids,
                     lengths.tolist(), spans, rejects, int(row["documents"]))


class _EmbedUnit:
    """One engine per actor; each call embeds one unit and writes its shard (and rejects), staged then committed."""

    def __init__(self, settings_json: str, int8_path: str | None = None):
        self.settings = _settings_from_json(settings_json)
        self.embedder = Embedder(self.settings)
        if int8_path is not None and _int8_path() != int8_path:  # a node of another kind: its int8 bits may differ
            raise CorpusError(f"Ray node {platform.node()}", f"its int8 kernels ({_int8_path()}) are not the job's "
                              f"({int8_path}), so its vectors could differ from the others' in the same output",
                              "run an int8 job on nodes of one kind (the same image and CPU features), or another "
                              "--dtype")
        self.output = open_output(self.settings.output)
        self.schema = shards.shard_schema(self.embedder.dimensions, self.settings.output_precision,
                                          self.settings.chunked, self.settings.multi_vector)

    def __call__(self, batch: dict) -> dict:
        prepared = from_dataset_row({name: values[0] for name, values in batch.items()})
        s, unit = self.settings, prepared.unit
        result = {"unit": [unit.name], "rows": [unit.row_stop - unit.row_start], "documents": [prepared.documents],
                  "vectors": [len(prepared.ids)], "rejects": [len(prepared.rejects)],
                  "tokens": [int(sum(prepared.tokens))], "pid": [os.getpid()], "stopped_by": [""]}
        if prepared.rejects and s.on_error == "stop":  # no shard: the driver stops the job on the first reject
            result["stopped_by"] = [json.dumps(asdict(min(prepared.rejects, key=lambda r: r.row)))]
            return result
        vectors = self.embedder.embed(prepared.token_ids)
        table = shards.shard_table(self.schema, prepared.ids, vectors, prepared.tokens,
                                   prepared.spans if s.chunked else None)
        self.output.write_shard(unit.name, table, prepared.rejects)
        return result
