"""Our corpus job, timed: on one machine (corpus.local_job's pipeline) and on a local two-node Ray cluster
(corpus.ray_job)."""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, replace
from pathlib import Path

from corpus.settings import JobSettings


@dataclass
class Timed:
    rows: int
    seconds: float  # from reading the input to the last shard written, the model already loaded
    load_seconds: float  # the engine's start-up: checkpoint, precision (int8 calibration), warm-up

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds


def job_settings(checkpoint: Path, corpus: Path, output: Path, dtype: str) -> JobSettings:
    return JobSettings(input=str(corpus), output=str(output), checkpoint=str(checkpoint), format="text",
                       dtype=dtype, truncate=True)


def single_machine(settings: JobSettings) -> Timed:
    """The job of `python -m corpus embed` on one machine, clocked from the plan (counting the input's rows) to the
    last shard committed; the engine's start-up is clocked apart (a one-off, whatever the corpus's size)."""
    from corpus.embedder import Embedder
    from corpus.inputs import resolve_inputs
    from corpus.local_job import Pipeline
    from corpus.open_output import open_output
    from corpus.plan import make_plan
    from corpus.progress import Progress

    import torch

    threads = torch.get_num_threads()  # the engine splits them between its runners: given back at the end
    started = time.perf_counter()
    embedder = Embedder(settings)
    loaded = time.perf_counter()
    try:
        plan = make_plan(resolve_inputs(settings.input, settings.format), settings.rows_per_shard)
        output = open_output(settings.output)
        output.prepare()
        progress = Progress(sum(u.row_stop - u.row_start for u in plan), 0, io.StringIO())
        Pipeline(settings, embedder, output, progress).run(plan)
        summary = progress.finish()
    finally:
        embedder.close()
        torch.set_num_threads(threads)
    return Timed(summary.documents, time.perf_counter() - loaded, loaded - started)


def on_local_ray(settings: JobSettings, actors: int | None = None) -> Timed:
    """`python -m corpus embed --ray` on a local cluster of two Ray nodes (as tests/corpus/test_ray.py starts it),
    clocked around the whole job: the actors' start-up (each loads the engine) is inside it."""
    import ray
    from ray.cluster_utils import Cluster

    from corpus import ray_job

    node = {"num_cpus": 2, "object_store_memory": 200 * 2**20}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    cluster.add_node(**node)
    try:
        ray.init(address=cluster.address, log_to_driver=False, runtime_env=ray_job.runtime_env())
        started = time.perf_counter()
        summary = ray_job.run(replace(settings, ray=True, actors=actors), stream=io.StringIO())
        seconds = time.perf_counter() - started
    finally:
        ray.shutdown()
        cluster.shutdown()
    return Timed(summary.documents, seconds, 0.0)
