"""The service's engine as a library: token ids in, pooled vectors out, with no HTTP, queue or deadline between.

The engine starts as the service's does (`service.engine.loader.start_engine`, from `JobSettings.engine_options`:
the checkpoint from a directory or the Hub, the precision for this host, the CPU's token budget from the model's
width, CUDA graphs on a GPU) and runs its batches through the service's own `Batcher` (`service.engine.in_order`):
similar lengths together under the token budget, one batch per runner on a CPU's halves, the next batch launched
before the last is read on a GPU. Each vector is what /embed answers for the same text: the engine's pooling and
normalization, then `dimensions` cut and normalized again (`model.pooling.shorten`, as the service does); a long
input under --long-input chunk is /embed's with `"long_input": "chunk"` (corpus.long_inputs), and a --multi-vector
row's vectors are /token-vectors' (corpus.multi_vector).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np

from corpus.settings import JobSettings, SettingsError

log = logging.getLogger("corpus")
BatchDone = Callable[[int, int], None]  # (sequences, tokens) of the inputs just computed


def resolve_source(settings: JobSettings):
    """The checkpoint's directory (from the Hub cache for a Hub id, fetched first if needed): a ResolvedCheckpoint."""
    from model.hub import resolve_checkpoint

    return resolve_checkpoint(settings.checkpoint)  # CheckpointSourceError: one line naming it


def checkpoint_identity(source) -> dict:
    """What makes this model this model: the Hub id and the commit it resolved to, or the checkpoint's weights'
    hash (a directory's path may move; the weights under one output may not change)."""
    from model.provenance import portable_path

    if source.hub_id is not None:
        return {"hub_id": source.hub_id, "revision": source.revision, "commit": source.commit}
    return {"checkpoint": portable_path(str(Path(source.path).resolve())),
            "weights_sha256": weights_hash(Path(source.path))}


def job_identity(settings: JobSettings, source, dtype: str | None = None, int8_path: str | None = None) -> dict:
    """settings.identity() with the pooling the checkpoint's recipe gives when --pooling is left out, --dtype auto
    resolved (`dtype`: as the machine that runs the engine resolved it, a Ray worker's device not being the
    driver's; None: this machine, for this model: resolved_dtype), for int8 the kernels' path
    (`kernels.int8_path_identity`: `int8_path`, as the machine that runs the engine has it, else this machine's), and
    without the checkpoint's name (the model is compared by checkpoint_identity)."""
    from model.pooling import read_pooling

    identity = settings.identity()
    identity.pop("checkpoint", None)
    identity["pooling"] = settings.pooling or read_pooling(Path(source.path)).mode
    identity["dtype"] = dtype or resolved_dtype(settings, source)
    if identity["dtype"] == "int8":  # int8's bits depend on the kernels this host runs: no two kinds in one output
        from kernels import int8_path_identity

        identity["int8_path"] = int8_path or int8_path_identity()
    return identity


def resolved_dtype(settings: JobSettings, source) -> str:
    """--dtype as this machine resolves it for this model (`--dtype auto`: start_engine's own rule, the bfloat16
    probe on a CPU included). The job's identity records it, and the engines compute in it, so that a job resumed on
    another kind of machine, or a Ray cluster of mixed hosts, never mixes two precisions in one output."""
    if settings.dtype != "auto":
        return settings.dtype
    from model.device import pick_device
    from service.engine.precision import choose

    device = pick_device("auto")
    if device.type != "cpu":
        return choose("auto", device).name
    from model.checkpoint import load_checkpoint
    from service.engine.precision_probe import choose_auto_on_cpu

    return choose_auto_on_cpu(load_checkpoint(source.path, device="cpu")).name


class Embedder:
    """One engine and its batcher for the job's whole run (on Ray: for one actor's)."""

    def __init__(self, settings: JobSettings, source=None):
        from model.checkpoint_files import load_checkpoint_files
        from service.engine.batcher import Batcher
        from service.engine.loader import StartupError, start_engine
        from service.metrics import Metrics

        from corpus.tokens import token_rule
        from service.frontend.long_inputs import window_length

        self.source = source or resolve_source(settings)
        files = load_checkpoint_files(self.source.path)  # what the checks below need, before the weights load
        self.tokenizer = files.tokenizer
        self.width = files.config.hidden_size
        check_against_model(settings, files)
        self.rule = token_rule(settings, files)  # how the reader stage tokenizes for this engine
        self.multi_vector = settings.multi_vector
        # a row's vectors' width: the ColBERT's projection's, or the pooled vector's after --dimensions
        self.dimensions = files.late_interaction.dim if self.multi_vector else settings.dimensions or self.width
        self.normalize = settings.normalize
        self.pooling = settings.pooling or files.pooling.mode  # /embed pools as the checkpoint's recipe says
        self.prompt = self.rule.prompt  # /embed's default prompt
        self.long_input = settings.long_input
        self.long_input_window = window_length(files.tokenizer, files.pooling)  # as the service's front door's
        self.long_input_overlap = settings.long_input_overlap
        try:
            self.started = start_engine(settings.engine_options(str(self.source.path)))
        except StartupError as exc:
            raise SettingsError(str(exc)) from None
        self.precision = self.started.precision
        # The queue holds the few tickets compute_in_order keeps in it; nothing waits with a deadline.
        self.batcher = Batcher(self.started.engine, self.started.batch_policy(max_queue_items=1 << 30), Metrics())
        self.batcher.start()

    def model_identity(self) -> dict:
        return checkpoint_identity(self.source)

    def embed(self, token_ids: list[list[int]], on_batch: BatchDone | None = None) -> np.ndarray | list[np.ndarray]:
        """(len(token_ids), dimensions) float32 vectors, in input order; under --multi-vector a (vectors, dimensions)
        array per entry instead (corpus.multi_vector). Each entry is a sequence with its [CLS]/[SEP], at most the
        model's length unless --long-input chunk (corpus.long_inputs). `on_batch` hears of the sequences (a long
        input's windows each) as they are computed."""
        from model.matryoshka import shorten
        from service.tasks import EncodeItem

        if self.multi_vector:
            from corpus.multi_vector import token_vectors

            return token_vectors(self, token_ids, on_batch)
        if not token_ids:
            return np.empty((0, self.dimensions), dtype=np.float32)
        shortened = self.dimensions < self.width
        normalize_in_engine = self.normalize and not shortened
        if self.long_input == "chunk":
            from corpus.long_inputs import pooled_vectors

            vectors = pooled_vectors(self, token_ids, normalize_in_engine, on_batch)
        else:
            items = [EncodeItem(ids, [0] * len(ids), pooling=self.pooling, normalize=normalize_in_engine)
                     for ids in token_ids]
            vectors = np.stack([result.vector for result in self.compute(items, on_batch)])
        if shortened:
            vectors = shorten(vectors, self.dimensions, self.normalize)
        return vectors

    def compute(self, items: list, on_batch: BatchDone | None = None) -> list:
        """Each engine item's result (service.tasks), in the items' order."""
        from service.engine.in_order import ItemsFailed, compute_in_order

        if not items:
            return []
        # Shortest first: each batch then holds like lengths, as the service's batcher would pick from a long queue.
        order = sorted(range(len(items)), key=lambda i: len(items[i]))
        heard = None if on_batch is None else (lambda done: on_batch(len(done), sum(len(i) for i in done)))
        try:
            ordered = compute_in_order(self.batcher, [items[i] for i in order], on_returned=heard)
        except ItemsFailed as exc:
            raise RuntimeError(f"the engine failed on a batch of this job: {exc}") from None
        results: list = [None] * len(items)
        for position, result in zip(order, ordered):
            results[position] = result
        return results

    def close(self) -> None:
        self.batcher.stop()


def check_against_model(settings: JobSettings, files) -> None:
    """The options whose limits are the model's: refused here, before the engine starts or anything is written."""
    width, longest = files.config.hidden_size, files.tokenizer.model_max_length
    if settings.multi_vector and files.late_interaction is None:
        raise SettingsError(f"--multi-vector needs a ColBERT checkpoint (PyLate's or colbert-ai's format: "
                            f"docs/late-interaction.md); {settings.checkpoint} has no ColBERT projection or settings")
    if settings.dimensions is not None and settings.dimensions > width:
        raise SettingsError(f"--dimensions must be between 1 and this model's width {width}, got {settings.dimensions}")
    if settings.max_batch_tokens < longest:
        raise SettingsError(f"--max-batch-tokens ({settings.max_batch_tokens}) is below the model's maximum input "
                            f"length ({longest})")
    if settings.chunk_tokens is not None:
        from corpus.tokens import prompt_pieces

        prompt = dict(files.pooling.prompts).get(files.pooling.default_prompt_name, "")
        sequence = settings.chunk_tokens + 2 + len(prompt_pieces(files.tokenizer, prompt))
        if sequence > longest:
            raise SettingsError(f"--chunk-tokens {settings.chunk_tokens} makes sequences of {sequence} tokens ([CLS], "
                                f"[SEP] and the model's prompt around it); the model takes at most {longest}")


def weights_hash(directory: Path) -> str:
    """sha256 of the checkpoint's weight files (model.safetensors, or its shards in name order)."""
    digest = hashlib.sha256()
    files = sorted(directory.glob("model*.safetensors"))
    for path in files:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
