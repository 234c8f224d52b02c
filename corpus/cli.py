"""`python -m corpus embed INPUT --output DIR|s3://... [options]`: the flags -> JobSettings -> the job, one machine or
Ray.

Exit status: 0 done (or nothing left to do), 1 the job stopped (a bad row, a vanished input, a full disk: one
line naming the file and what to do), 2 the command cannot start (a flag's value, the checkpoint, Ray missing),
130 interrupted. Every stop leaves the output resumable by the same command, and a run refused at its start (2)
leaves it as it found it.
"""

from __future__ import annotations

import argparse
import logging
import sys

from corpus.settings import (DEFAULT_LONG_INPUT_OVERLAP, DEFAULT_MAX_BATCH_TOKENS, DTYPES, FORMATS, LONG_INPUTS,
                             MULTI_VECTOR_MODES, JobSettings, SettingsError)
from service.settings import DEFAULT_CHECKPOINT

RAY_MISSING = "--ray and --ray-address need Ray, an optional extra: pip install -r requirements/ray.txt"


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m corpus", description="Embed a corpus into Parquet shards.")
    commands = top.add_subparsers(dest="command", required=True)
    p = commands.add_parser("embed", help="read a corpus, write its embeddings (resumes an unfinished OUTPUT)",
                            description="Read a corpus, write its embeddings as Parquet shards and a manifest. "
                                        "Run the same command again to resume a stopped job.")
    p.add_argument("input", metavar="INPUT", help="a file, a directory, a glob or an s3:// URI (JSONL, Parquet, CSV, "
                                                  "plain text one document a line; .gz/.xz/.zst compressed too)")
    p.add_argument("--output", "-o", required=True,
                   help="output directory, or s3://bucket/prefix (created; resumed when it holds this job)")
    read = p.add_argument_group("reading")
    read.add_argument("--format", choices=FORMATS, help="input format (default: from each file's extension)")
    read.add_argument("--text-column", help="column or JSON field holding the text (default: text)")
    read.add_argument("--id-column", help="column or JSON field holding the id (default: file and line)")
    model = p.add_argument_group("model and vectors (as the service's /embed)")
    model.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT),
                       help="checkpoint directory or Hugging Face Hub id org/name[@revision] (default: the bundled "
                            "model)")
    model.add_argument("--pooling", choices=("mean", "cls"), help="default: the checkpoint's recipe, else mean")
    model.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=True,
                       help="unit-length vectors (default: yes)")
    model.add_argument("--dimensions", type=int, help="keep the first N dimensions (Matryoshka), then normalize")
    model.add_argument("--dtype", choices=DTYPES, default="auto",
                       help="what the engine computes in: auto = as the service's --dtype auto (bfloat16 on a GPU; "
                            "on a CPU bfloat16 where native and faithful to float32, else float32); int8 on CPU is "
                            "the fastest there")
    model.add_argument("--truncate", action="store_true",
                       help="cut documents longer than the model takes (default: such a document is a bad row)")
    model.add_argument("--chunk-tokens", type=int, metavar="N",
                       help="split each document into chunks of N word pieces, one output row per chunk")
    model.add_argument("--chunk-overlap", type=int, default=0, metavar="M",
                       help="word pieces consecutive chunks share (with --chunk-tokens)")
    model.add_argument("--long-input", choices=LONG_INPUTS, default="refuse",
                       help="a document longer than the model: a bad row (refuse, the default), or read whole in "
                            "windows of the model's length, pooled into its one vector (chunk: as the service's "
                            "long_input: chunk; docs/long-inputs.md)")
    model.add_argument("--long-input-overlap", type=int, default=DEFAULT_LONG_INPUT_OVERLAP, metavar="M",
                       help="word pieces consecutive windows share under --long-input chunk (default: "
                            f"{DEFAULT_LONG_INPUT_OVERLAP}, the service's; at most half a window)")
    model.add_argument("--multi-vector", action="store_true",
                       help="a ColBERT checkpoint's token vectors, a list of vectors per row, as the service's "
                            "/token-vectors gives them (docs/late-interaction.md)")
    model.add_argument("--multi-vector-mode", choices=MULTI_VECTOR_MODES,
                       help="with --multi-vector: read each text as a document (the default: [D] marker, "
                            "skiplist) or as a query ([Q] marker, [MASK] expansion to the query length)")
    out = p.add_argument_group("output")
    out.add_argument("--output-precision", choices=("float32", "float16"), default="float32",
                     help="the embedding column's type (float16: half the disk; each of a --multi-vector row's "
                          "vectors too)")
    out.add_argument("--rows-per-shard", type=int, default=10_000,
                     help="input rows per shard: the unit of resume (default: 10000)")
    out.add_argument("--on-error", choices=("stop", "skip"), default="stop",
                     help="a bad row stops the job (stop), or goes to rejects/ with its reason (skip)")
    run = p.add_argument_group("running")
    run.add_argument("--max-batch-tokens", type=int, default=DEFAULT_MAX_BATCH_TOKENS,
                     help="most tokens in one batch (a CPU uses less: sized from the model's width)")
    run.add_argument("--ray", action="store_true", help="run on a local Ray as a Ray Data pipeline")
    run.add_argument("--ray-address", help="run on this Ray cluster (ray://host:10001 or auto)")
    run.add_argument("--actors", type=int, help="Ray: embedding actors on CPU nodes (default: one per node)")
    return top


def settings_from(args: argparse.Namespace) -> JobSettings:
    return JobSettings(input=args.input, output=args.output, checkpoint=args.checkpoint, text_column=args.text_column,
                       id_column=args.id_column, format=args.format, pooling=args.pooling, normalize=args.normalize,
                       dimensions=args.dimensions, dtype=args.dtype, truncate=args.truncate,
                       chunk_tokens=args.chunk_tokens, chunk_overlap=args.chunk_overlap,
                       long_input=args.long_input, long_input_overlap=args.long_input_overlap,
                       multi_vector=args.multi_vector, multi_vector_mode=args.multi_vector_mode,
                       rows_per_shard=args.rows_per_shard, output_precision=args.output_precision,
                       on_error=args.on_error, max_batch_tokens=args.max_batch_tokens, ray=args.ray,
                       ray_address=args.ray_address, actors=args.actors)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    logging.getLogger("corpus").setLevel(logging.INFO)
    from corpus.errors import CorpusError
    from model.checkpoint_files import CheckpointError
    from model.hub import CheckpointSourceError
    from service.engine.precision import PrecisionError

    try:
        settings = settings_from(args)
        if settings.on_ray:
            try:
                import ray  # noqa: F401
            except ImportError:
                print(f"error: {RAY_MISSING}", file=sys.stderr)
                return 2
            from corpus import ray_job
            summary = ray_job.run(settings)
        else:
            from corpus import local_job
            summary = local_job.run(settings)
    except (SettingsError, CheckpointSourceError, CheckpointError, PrecisionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except CorpusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\ninterrupted: run the same command again to resume into {args.output}", file=sys.stderr)
        return 130
    if summary is not None and summary.rows:
        print(summary.line())
    return 0
