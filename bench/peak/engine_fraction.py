"""What fraction of the machine's peak the engine reaches: its matrix work, counted from the model's shape and the
tokens run, per second, over the peak of the precision it runs in.

Matrix work (model.flops, a multiply and an add = 2): per token, the layers' four Linear products
(2 x (4 h^2 + 2 h i)); per sequence of n tokens, attention's QK^T and PV (2 x 2 h n^2). Only the work the sentences
need: padding the engine computes counts as time lost, not work done. The engine is timed as the serving benchmark's
"limit (in-process)" row times it (bench/serving/in_process_limit.py: pre-tokenized batches of similar lengths, one
batch at a time on all cores, or one a core in parallel, the better kept), at batch 1 (one sentence a batch) and in
bulk (large batches).
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path

from model.config import served_embedding_layer
from model.flops import BatchPricer


@dataclass(frozen=True)
class MatrixWork:
    """The matrix work of a set of sentences, per sentence on average."""

    linear_ops: float  # the Linear layers' products
    attention_ops: float  # QK^T and PV

    @property
    def ops(self) -> float:
        return self.linear_ops + self.attention_ops


@dataclass(frozen=True)
class EngineRate:
    model: str
    precision: str
    mode: str  # "batch 1" | "bulk"
    batch_size: int
    parallel: int  # batches run side by side (one a core) or 1
    sentences_per_s: float
    work: MatrixWork

    @property
    def ops_per_s(self) -> float:
        return self.sentences_per_s * self.work.ops


def matrix_work(config, lengths: list[int]) -> MatrixWork:
    """Mean matrix work per sentence of `lengths` (tokens each), through the layers the served embedding uses."""
    pricer = BatchPricer(config, served_embedding_layer(config))
    count = len(lengths)
    return MatrixWork(pricer.per_token * sum(lengths) / count, pricer.per_pair * sum(n * n for n in lengths) / count)


def measure_engine(checkpoint: Path, model: str, precision: str, texts: list[str], seconds: float,
                   bulk_batch_sizes: tuple[int, ...]) -> list[EngineRate]:
    """The engine in `precision` on `texts` at batch 1 and at each of `bulk_batch_sizes` (the best kept as bulk),
    through bench.serving's in-process limit; its sweep printout is kept off this benchmark's output."""
    from bench.serving.in_process_limit import measure_limit
    from model import load_checkpoint

    loaded = load_checkpoint(checkpoint)
    lengths = [len(e.ids) for e in loaded.tokenizer.encode_batch(texts, truncate=True)]
    work = matrix_work(loaded.config, lengths)
    with contextlib.redirect_stdout(io.StringIO()):
        _, _, _, sweep = measure_limit(checkpoint, texts, seconds, (1, *bulk_batch_sizes), precision)
    rates = []
    for mode, sizes in (("batch 1", (1,)), ("bulk", bulk_batch_sizes)):
        (batch_size, parallel), rate = max(((key, rate) for key, rate in sweep.items() if key[0] in sizes),
                                           key=lambda found: found[1])
        rates.append(EngineRate(model, precision, mode, batch_size, parallel, rate, work))
    return rates
