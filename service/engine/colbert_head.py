"""The ColBERT head: each `LateInteractionItem`'s kept tokens, their last hidden states through the checkpoint's
projection, L2-normalised (what PyLate's and colbert-ai's encoders return for a query or a document). One projection
over the kept rows of every such item of a batch; (kept tokens, dim) to the host."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from model.bert import BertForPreTraining
from model.row_buckets import rounds_rows, rows_to_compute
from service.engine.head_copies import Collector, to_device, to_host
from service.tasks import Item, LateInteractionItem, TokenVectors


def launch_colbert(model: BertForPreTraining, items: list[Item], hidden: torch.Tensor, starts: list[int]
                   ) -> Collector | None:
    rows = [r for r, item in enumerate(items) if isinstance(item, LateInteractionItem)]
    if not rows:
        return None
    if model.projection is None:
        raise RuntimeError("a late-interaction item reached a model without a ColBERT projection")
    kept = [items[r].kept if items[r].kept is not None else range(len(items[r])) for r in rows]
    at = [starts[r] + position for r, positions in zip(rows, kept) for position in positions]
    count = len(at)
    if count and rounds_rows(hidden.device, hidden.dtype):  # one of few row counts, as the encoder's (row_buckets)
        at += [at[0]] * (rows_to_compute(count) - count)
    projected = model.projection(hidden[to_device(at, hidden.device)])[:count]
    vectors = to_host(F.normalize(projected.float(), dim=-1))  # (sum of kept, dim)
    counts = [len(positions) for positions in kept]

    def collect(results: list) -> None:
        values, offset = vectors.numpy(), 0
        for row, count in zip(rows, counts):
            results[row] = TokenVectors(values[offset : offset + count])
            offset += count
    return collect
