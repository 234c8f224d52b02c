"""The service's engine as a library: token ids in, pooled vectors out, with no HTTP, queue or deadline between.

The same start-up as the engine process (`service.engine.loader`): the checkpoint from a directory or the Hub
(`model.hub`), the precision for the device (`service.engine.precision`), one batch per half of the CPU's cores
(`plan_compute`, what the in-process limit in bench/serving finds fastest on a CPU), the CPU's token budget from
the model's width, CUDA graphs on a GPU. Batches are packed as the service's packer packs them (similar lengths
together, at most `batch_tokens` padded tokens and `batch_size` sequences), and each vector is what /embed answers
for the same text: the engine's pooling and normalization, then `dimensions` cut and normalized again as
`service.frontend.frontdoor._shorten` does.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from corpus.settings import JobSettings, SettingsError

log = logging.getLogger("corpus")
BatchDone = Callable[[int, int], None]  # (sequences, tokens) of a batch just computed


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


def job_identity(settings: JobSettings, source) -> dict:
    """settings.identity() with the pooling the checkpoint's recipe gives when --pooling is left out, --dtype auto
    resolved for this machine, for int8 the kernels' path (`kernels.int8_path_identity`), and without the
    checkpoint's name (the model is compared by checkpoint_identity)."""
    from model.pooling import read_pooling

    identity = settings.identity()
    identity.pop("checkpoint", None)
    identity["pooling"] = settings.pooling or read_pooling(Path(source.path)).mode
    identity["dtype"] = resolved_dtype(settings.dtype)
    if identity["dtype"] == "int8":  # int8's bits depend on the kernels this host runs: no two kinds in one output
        from kernels import int8_path_identity

        identity["int8_path"] = int8_path_identity()
    return identity


def resolved_dtype(choice: str) -> str:
    """--dtype auto as this machine resolves it (float32 on a CPU, bfloat16 or float16 on a GPU): a job resumed on
    another kind of machine must not mix the two precisions in one output."""
    if choice != "auto":
        return choice
    import torch

    from model.device import pick_device

    if pick_device("auto").type != "cuda":
        return "float32"
    return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"


class Embedder:
    def __init__(self, settings: JobSettings, source=None):
        from model.checkpoint import load_checkpoint
        from model.device import keep_freed_memory, pick_device
        from service.engine.batch_size import batch_tokens_for_width
        from service.engine.loader import AUTO_BATCH_SIZE_CPU, AUTO_BATCH_SIZE_GPU, build_engine, capture_graphs, \
            plan_compute
        from service.engine.precision import choose
        import torch

        self.source = source or resolve_source(settings)
        device = pick_device("auto")
        self.precision = choose(settings.dtype, device)  # PrecisionError: says what to ask for instead
        if device.type == "cpu":
            keep_freed_memory()  # as the service does by default (cpu_keep_freed_memory)
        checkpoint = load_checkpoint(self.source.path, device="cpu")
        self.tokenizer = checkpoint.tokenizer
        self.engine = build_engine(checkpoint, device, self.precision)
        config = checkpoint.config
        self.width = config.hidden_size
        if settings.dimensions is not None and settings.dimensions > self.width:
            raise SettingsError(f"--dimensions must be between 1 and this model's width {self.width}, "
                                f"got {settings.dimensions}")
        if settings.max_batch_tokens < self.tokenizer.model_max_length:
            raise SettingsError(f"--max-batch-tokens ({settings.max_batch_tokens}) is below the model's maximum "
                                f"input length ({self.tokenizer.model_max_length})")
        self.dimensions = settings.dimensions or self.width
        self.shortened = self.dimensions < self.width
        self.normalize = settings.normalize
        self.pooling = settings.pooling or checkpoint.pooling.mode  # /embed pools as the checkpoint's recipe says
        prompts = dict(checkpoint.pooling.prompts)
        self.prompt = prompts.get(checkpoint.pooling.default_prompt_name, "")  # /embed's default prompt
        if settings.chunk_tokens is not None:
            from corpus.tokens import prompt_pieces

            longest = settings.chunk_tokens + 2 + len(prompt_pieces(self.tokenizer, self.prompt))
            if longest > self.tokenizer.model_max_length:
                raise SettingsError(f"--chunk-tokens {settings.chunk_tokens} makes sequences of {longest} tokens "
                                    f"([CLS], [SEP] and the model's prompt around it); the model takes at most "
                                    f"{self.tokenizer.model_max_length}")
        self.runners = plan_compute(0, device)  # on CPU: sets torch's threads per runner
        if device.type == "cpu":
            element_bytes = torch.empty((), dtype=self.precision.dtype).element_size()
            self.batch_tokens = batch_tokens_for_width(config.intermediate_size, element_bytes,
                                                       settings.max_batch_tokens)
            self.batch_size = AUTO_BATCH_SIZE_CPU
        else:
            self.batch_tokens, self.batch_size = settings.max_batch_tokens, AUTO_BATCH_SIZE_GPU
        self.batch_tokens = max(self.batch_tokens, self.tokenizer.model_max_length)
        tok = self.tokenizer
        self.engine.warm_up(tok.cls_id, tok.sep_id, tok.mask_id)
        self.cuda_graphs = capture_graphs(self.engine, self.batch_tokens, self.batch_size, self.runners)
        self._pool = ThreadPoolExecutor(self.runners, thread_name_prefix="corpus-engine") if self.runners > 1 else None
        log.info("engine: %s, %s, %d batch(es) at once, %d tokens per batch, CUDA graphs: %s", device,
                 self.precision.name, self.runners, self.batch_tokens, self.cuda_graphs or "off")

    def model_identity(self) -> dict:
        return checkpoint_identity(self.source)

    # ---- tokens -> vectors ---------------------------------------------------------------------

    def pack(self, lengths: list[int]) -> list[list[int]]:
        """Indices into `lengths`, in batches: sorted by length, then greedily filled while the padded size
        (longest x count) stays within the token budget and the count within the batch size, as the packer."""
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
        batches: list[list[int]] = []
        current: list[int] = []
        for index in order:
            if current and (lengths[index] * (len(current) + 1) > self.batch_tokens
                            or len(current) >= self.batch_size):
                batches.append(current)
                current = []
            current.append(index)
        if current:
            batches.append(current)
        return batches

    def embed(self, token_ids: list[list[int]], on_batch: BatchDone | None = None) -> np.ndarray:
        """(len(token_ids), dimensions) float32 vectors, in input order. Each entry is a sequence with its
        [CLS]/[SEP], at most the model's length. `on_batch` hears of each batch as it finishes."""
        from service.tasks import EncodeItem

        vectors = np.empty((len(token_ids), self.dimensions), dtype=np.float32)
        if not token_ids:
            return vectors
        normalize_in_engine = self.normalize and not self.shortened
        items = [EncodeItem(ids, [0] * len(ids), pooling=self.pooling, normalize=normalize_in_engine)
                 for ids in token_ids]
        batches = self.pack([len(ids) for ids in token_ids])

        def store(indices: list[int], results) -> None:
            for index, result in zip(indices, results):
                vectors[index] = result.vector[: self.dimensions]
            if on_batch is not None:
                on_batch(len(indices), sum(len(token_ids[i]) for i in indices))

        if self._pool is None:
            self._run_in_order(items, batches, store)
        else:  # one batch per runner at a time, each on its share of the cores; the next batch to whoever is free
            taking = threading.Lock()
            pending = iter(batches)

            def runner() -> None:
                while True:
                    with taking:
                        indices = next(pending, None)
                    if indices is None:
                        return
                    store(indices, self.engine.run(self.engine.collate([items[i] for i in indices])))
            for future in [self._pool.submit(runner) for _ in range(self.runners)]:
                future.result()
        if self.shortened and self.normalize:  # as _shorten: the cut vector over its own length
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors /= np.maximum(norms, 1e-12)
        return vectors

    def _run_in_order(self, items, batches: list[list[int]], store) -> None:
        """One runner; on a GPU the next batch is launched before the last one's results are read, as the service."""
        engine = self.engine
        if not engine.overlaps:
            for indices in batches:
                store(indices, engine.run(engine.collate([items[i] for i in indices])))
            return
        in_flight = None  # (indices, launched batch)
        for indices in batches:
            launched = (indices, engine.launch(engine.collate([items[i] for i in indices])))
            if in_flight is not None:
                store(in_flight[0], engine.finish(in_flight[1]))
            in_flight = launched
        if in_flight is not None:
            store(in_flight[0], engine.finish(in_flight[1]))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()


def weights_hash(directory: Path) -> str:
    """sha256 of the checkpoint's weight files (model.safetensors, or its shards in name order)."""
    digest = hashlib.sha256()
    files = sorted(directory.glob("model*.safetensors"))
    for path in files:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
