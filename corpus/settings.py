"""Every option of a corpus job, in one frozen object that the CLI builds and both jobs (one machine, Ray) read.

The options that decide what a vector *is* (model, pooling, normalize, dimensions, precision, truncation,
chunking, long inputs in windows, multi-vector and its mode, the plan's shard size, the output column's type) form the job's `identity()`: an output directory
made with another identity is refused on resume, naming the option that differs, so that no directory ever
mixes vectors of two kinds. The rest (where to read and write, how to run, what to do with bad rows) may
change between runs of the same job.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from service.engine.options import EngineOptions
from service.settings import DEFAULT_CHECKPOINT, Settings

POOLINGS = ("mean", "cls")
DTYPES = ("auto", "float32", "bfloat16", "float16", "int8")
OUTPUT_PRECISIONS = ("float32", "float16")
ON_ERROR = ("stop", "skip")
LONG_INPUTS = ("refuse", "chunk")
MULTI_VECTOR_MODES = ("document", "query")
DEFAULT_LONG_INPUT_OVERLAP: int = Settings.model_fields["long_input_overlap"].default  # the service's, read off it
FORMATS = ("jsonl", "parquet", "csv", "text")
DEFAULT_MAX_BATCH_TOKENS: int = Settings.model_fields["max_batch_tokens"].default  # the service's, read off it

# Options that may differ between a run and its resume: where things are and how the job runs. `on_error` is
# among them: a run stopped by a bad row is meant to be resumed with --on-error skip.
NOT_IDENTITY = frozenset({"input", "output", "text_column", "id_column", "format", "on_error", "max_batch_tokens",
                          "ray", "ray_address", "actors"})


class SettingsError(ValueError):
    """An option's value cannot work; the message names the flag."""


@dataclass(frozen=True)
class JobSettings:
    input: str  # a file, a directory, a glob or an s3:// URI (corpus.inputs)
    output: str  # a directory or an object-store prefix (s3://...): manifest.json, shards/, rejects/ (corpus.output)
    checkpoint: str = str(DEFAULT_CHECKPOINT)  # a directory or a Hub id org/name[@revision], as the service's
    text_column: str | None = None  # JSONL/Parquet/CSV: the column holding the text (None: "text")
    id_column: str | None = None  # None: ids made from the file and the line
    format: str | None = None  # None: from the file name's extension
    pooling: str | None = None  # mean | cls; None: the checkpoint's sentence-transformers recipe, as /embed
    normalize: bool = True  # unit-length vectors, as /embed's default
    dimensions: int | None = None  # keep the first N dimensions (Matryoshka), normalized after the cut
    dtype: str = "auto"  # what the engine computes in, as the service's --dtype
    truncate: bool = False  # cut a too-long document to the model's length; without it (or chunking) it is a bad row
    chunk_tokens: int | None = None  # split documents into chunks of this many word pieces, one row per chunk
    chunk_overlap: int = 0  # word pieces consecutive chunks share
    rows_per_shard: int = 10_000  # input rows per work unit, and so per shard: the unit of resume
    long_input: str = "refuse"  # a document longer than the model: a bad row (refuse) | read in windows (chunk)
    long_input_overlap: int = DEFAULT_LONG_INPUT_OVERLAP  # word pieces consecutive windows share (at most half one)
    multi_vector: bool = False  # a ColBERT's token vectors, a list of vectors per row (corpus.multi_vector)
    multi_vector_mode: str | None = None  # document (None) | query: how the ColBERT marks and reads each text
    output_precision: str = "float32"  # the embedding column's type: float32 | float16 (half the disk)
    on_error: str = "stop"  # stop at the first bad row | skip it into rejects/
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS  # most tokens in one batch (padded), as the service's
    ray: bool = False  # run on a local Ray (corpus.ray_job)
    ray_address: str | None = None  # ... or on this Ray cluster
    actors: int | None = None  # Ray: embedding actors on CPU nodes (None: one per node)

    def __post_init__(self) -> None:
        if self.pooling is not None and self.pooling not in POOLINGS:
            raise SettingsError(f"--pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")
        if self.dtype not in DTYPES:
            raise SettingsError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.output_precision not in OUTPUT_PRECISIONS:
            raise SettingsError(f"--output-precision must be float32 or float16, got {self.output_precision!r}")
        if self.on_error not in ON_ERROR:
            raise SettingsError(f"--on-error must be stop or skip, got {self.on_error!r}")
        if self.format is not None and self.format not in FORMATS:
            raise SettingsError(f"--format must be one of {', '.join(FORMATS)}, got {self.format!r}")
        if self.dimensions is not None and self.dimensions < 1:
            raise SettingsError(f"--dimensions must be at least 1, got {self.dimensions}")
        if self.rows_per_shard < 1:
            raise SettingsError(f"--rows-per-shard must be at least 1, got {self.rows_per_shard}")
        if self.max_batch_tokens < 16:
            raise SettingsError(f"--max-batch-tokens must be at least 16, got {self.max_batch_tokens}")
        if self.chunk_tokens is not None and self.chunk_tokens < 1:
            raise SettingsError(f"--chunk-tokens must be at least 1, got {self.chunk_tokens}")
        if self.chunk_overlap < 0 or (self.chunk_overlap and self.chunk_tokens is None):
            raise SettingsError("--chunk-overlap needs --chunk-tokens and must be at least 0")
        if self.chunk_tokens is not None and self.chunk_overlap >= self.chunk_tokens:
            raise SettingsError(f"--chunk-overlap ({self.chunk_overlap}) must be below --chunk-tokens "
                                f"({self.chunk_tokens}), or chunks would never move on")
        if self.chunk_tokens is not None and self.truncate:
            raise SettingsError("--truncate and --chunk-tokens exclude each other: chunking keeps the whole text")
        if self.long_input not in LONG_INPUTS:
            raise SettingsError(f"--long-input must be one of {', '.join(LONG_INPUTS)}, got {self.long_input!r}")
        if self.long_input_overlap < 0:
            raise SettingsError(f"--long-input-overlap must be at least 0, got {self.long_input_overlap}")
        if self.long_input == "chunk" and self.truncate:
            raise SettingsError("--truncate and --long-input chunk exclude each other: choose to cut long documents "
                                "or to read them whole in windows")
        if self.long_input == "chunk" and self.chunk_tokens is not None:
            raise SettingsError("--chunk-tokens and --long-input chunk exclude each other: one row per chunk, or one "
                                "vector per document read in windows")
        self._check_multi_vector()
        if self.actors is not None and self.actors < 1:
            raise SettingsError(f"--actors must be at least 1, got {self.actors}")

    def _check_multi_vector(self) -> None:
        if self.multi_vector_mode is not None and self.multi_vector_mode not in MULTI_VECTOR_MODES:
            raise SettingsError(f"--multi-vector-mode must be document or query, got {self.multi_vector_mode!r}")
        if not self.multi_vector:
            if self.multi_vector_mode is not None:
                raise SettingsError("--multi-vector-mode needs --multi-vector")
            return
        # A ColBERT's vectors are its tokens' projections, each L2-normalised: nothing to pool, cut or leave unscaled.
        refused = [flag for flag, asked in (("--pooling", self.pooling is not None),
                                            ("--dimensions", self.dimensions is not None),
                                            ("--no-normalize", not self.normalize),
                                            ("--chunk-tokens", self.chunk_tokens is not None)) if asked]
        if refused:
            raise SettingsError(f"--multi-vector writes a ColBERT's token vectors as its encoder makes them "
                                f"(normalised, one per kept token); {', '.join(refused)} cannot apply to them")
        if self.vector_mode == "query" and self.long_input == "chunk":
            raise SettingsError("--long-input chunk reads long documents in windows; a query is always cut to the "
                                "ColBERT's query length (use --multi-vector-mode document)")

    @property
    def vector_mode(self) -> str:
        """How a --multi-vector job's ColBERT reads each text: document (the default) or query."""
        return self.multi_vector_mode or "document"

    @property
    def chunked(self) -> bool:
        return self.chunk_tokens is not None

    @property
    def on_ray(self) -> bool:
        return self.ray or self.ray_address is not None

    def engine_options(self, checkpoint: str) -> EngineOptions:
        """How the job's engine starts (service.engine.loader.start_engine) from `checkpoint`, the resolved
        directory: as the service's with its defaults, but for the options the job has flags for."""
        return EngineOptions(checkpoint, dtype=self.dtype, max_batch_tokens=self.max_batch_tokens)

    def identity(self) -> dict:
        """The options a resume must share with the run that made the output directory (see the module's doc)."""
        identity = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in NOT_IDENTITY}
        # Options added after the first manifests were written are left out while off, so that an output made before
        # they existed resumes as it did (its vectors are of that kind); once on, they are there in full.
        if self.multi_vector:
            identity["multi_vector_mode"] = self.vector_mode  # the default written out: one name for one kind
        else:
            del identity["multi_vector"], identity["multi_vector_mode"]
        if self.long_input == "refuse":
            del identity["long_input"], identity["long_input_overlap"]
        return identity
