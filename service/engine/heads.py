"""Each item's own head over its batch's hidden states, in two halves so that the host never waits mid-batch.

`launch_heads` queues the device work (pooling, the MLM head at [MASK] positions only, pooler + NSP or
classifier on [CLS], SPLADE weights, a ColBERT's token vectors: service.engine.colbert_head) and the copies of
what the items asked for to the host, and returns *collectors*; once the batch's device work has finished (the
engine waits on one event), each collector turns its host arrays into the items' results. On a GPU the copies land
in page-locked memory and the index tensors go up without a stream sync, so the engine can launch the next batch
before it collects this one. A batch replayed as a CUDA graph comes with the pooled vectors and the [CLS] heads'
logits computed in the graph (GraphHeads): those heads only copy them down. On a CPU everything has happened by the
time `launch_heads` returns.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate

import numpy as np
import torch
import torch.nn.functional as F

from model.bert import BertForPreTraining
from model.packing import Packing
from service.engine import colbert_head
from service.engine.graphs import GraphHeads
from service.engine.head_copies import Collector, to_device, to_host
from service.engine.pooling import POOLED, pool
from service.tasks import (
    ClassifyItem,
    ClassLogits,
    EncodeItem,
    FillMaskItem,
    FillMaskScores,
    Item,
    MaskScores,
    NspItem,
    NspLogits,
    PooledVector,
    Result,
    SparseItem,
    SparseVector,
    SpanLogits,
    QaItem,
    TokenClassifyItem,
    TokenLogits,
    TokenVectors,
)

def launch_heads(model: BertForPreTraining, items: list[Item], embedded: torch.Tensor, hidden: torch.Tensor | None,
                 packing: Packing, starts: list[int], graphed: GraphHeads = GraphHeads()) -> list[Collector]:
    """The device work of every item's head; `embedded` feeds /encode, `hidden` (the last layer) the other heads;
    `graphed`, what a CUDA graph computed of the heads already (nothing for an eager batch)."""
    found = [_encode(items, embedded, packing, starts, graphed.pooled)]
    if hidden is not None:
        found += [_fill_mask(model, items, hidden, starts),
                  _cls_head(items, hidden, starts, NspItem, model.nsp_logits_from_cls, NspLogits, graphed.nsp),
                  _cls_head(items, hidden, starts, ClassifyItem, model.class_logits_from_cls, ClassLogits,
                            graphed.classes),
                  _sparse(model, items, hidden, starts), _per_token(items, hidden, starts, TokenClassifyItem,
                                                                    model.classifier, TokenLogits),
                  _per_token(items, hidden, starts, QaItem, model.qa_outputs, _span_logits),
                  colbert_head.launch_colbert(model, items, hidden, starts)]
    return [collect for collect in found if collect is not None]


def _encode(items: list[Item], hidden: torch.Tensor, packing: Packing, starts: list[int],
            pooled: torch.Tensor | None = None) -> Collector | None:
    rows = [r for r, item in enumerate(items) if isinstance(item, EncodeItem)]
    if not rows:
        return None
    variants = {(items[r].pooling, items[r].normalize) for r in rows}
    # float32 states, unless a graph pooled them already and no item asks for its token vectors
    states = hidden.float() if pooled is None or any(pooling == "none" for pooling, _ in variants) else None
    host: dict[tuple[str, bool], torch.Tensor] = {}  # only the variants some item asked for reach the host
    for pooling, normalize in variants:
        if pooling == "none":
            values = states  # (N, H): every item's token vectors, split per item below
        elif pooled is not None:
            values = pooled[POOLED.index((pooling, normalize))]  # (B, H), pooled in the graph's replay
        else:  # cu_seqlens is on the device already: no copy (and no wait) for the lengths
            values = pool(states, pooling, packing.rows, packing.cu_seqlens, packing.starts)  # (B, H)
            values = F.normalize(values, dim=-1) if normalize else values
        host[pooling, normalize] = to_host(values)

    def collect(results: list) -> None:
        arrays = {key: values.numpy() for key, values in host.items()}
        if len(arrays) == 1 and len(rows) == len(results):
            (pooling, _), vectors = next(iter(arrays.items()))
            if pooling != "none":  # an embedding batch pooled alike: its rows in one pass (0.25 µs an item, not 0.42)
                results[:] = map(PooledVector, vectors)
                return
        for row in rows:
            item = items[row]
            values = arrays[item.pooling, item.normalize]
            if item.pooling == "none":
                results[row] = TokenVectors(values[starts[row] : starts[row] + len(item)])
            else:
                results[row] = PooledVector(values[row])
    return collect


def _fill_mask(model: BertForPreTraining, items: list[Item], hidden: torch.Tensor, starts: list[int]
               ) -> Collector | None:
    wanted = [(r, p) for r, item in enumerate(items) if isinstance(item, FillMaskItem) for p in item.mask_positions]
    if not wanted:
        return None
    at = to_device([starts[r] + p for r, p in wanted], hidden.device)
    probs = torch.softmax(model.mlm_logits(hidden[at]).float(), dim=-1)  # (M, V): masked positions only
    k = max(items[r].top_k for r, _ in wanted)
    top_scores, top_ids = probs.topk(min(k, probs.shape[-1]), dim=-1)  # on the device: only k values move
    top_scores, top_ids = to_host(top_scores), to_host(top_ids)
    target_rows = [slot for slot, (r, _) in enumerate(wanted) if items[r].target_ids]
    target_probs = to_host(probs[to_device(target_rows, probs.device)]) if target_rows else None
    target_lookup = {slot: n for n, slot in enumerate(target_rows)}

    def collect(results: list) -> None:
        scores_of, ids_of = top_scores.numpy(), top_ids.numpy()
        for slot, (row, position) in enumerate(wanted):
            item = items[row]
            if item.target_ids:
                scores = target_probs[target_lookup[slot]].numpy()[item.target_ids]
                order = np.argsort(-scores, kind="stable")[: item.top_k]
                mask = MaskScores(position, np.asarray(item.target_ids)[order], scores[order])
            else:
                mask = MaskScores(position, ids_of[slot, : item.top_k], scores_of[slot, : item.top_k])
            if results[row] is None:
                results[row] = FillMaskScores([])
            results[row].masks.append(mask)
    return collect


def _cls_head(items: list[Item], hidden: torch.Tensor, starts: list[int], kind: type,
              head: Callable[[torch.Tensor], torch.Tensor], result: Callable[[np.ndarray], Result],
              graphed: torch.Tensor | None = None) -> Collector | None:
    """A head on the last layer's [CLS] vector of each item of `kind` (NSP, a classifier). `graphed`: the head's
    (B, classes) logits for every sequence of the batch, computed in its CUDA graph; they go down in one copy and
    this kind's rows are picked on the host (one torch call, where running the head after the replay takes seven)."""
    rows = [r for r, item in enumerate(items) if isinstance(item, kind)]
    if not rows:
        return None
    if graphed is not None:
        logits, picked = to_host(graphed), rows
    else:
        logits = to_host(head(hidden[to_device([starts[r] for r in rows], hidden.device)]).float())  # (R, classes)
        picked = range(len(rows))

    def collect(results: list) -> None:
        values = logits.numpy()
        for row, at in zip(rows, picked):
            results[row] = result(values[at])
    return collect


def _sparse(model: BertForPreTraining, items: list[Item], hidden: torch.Tensor, starts: list[int]
            ) -> Collector | None:
    """SPLADE weights: max over the item's tokens of log(1 + relu(MLM logits)), (V,) per item, kept sparse.
    One item at a time (its (L, V) logits are the largest tensor any route makes); finding the non-zero
    weights waits for the device, so these are computed here, not collected later."""
    found = {}
    for row, item in enumerate(items):
        if isinstance(item, SparseItem):
            logits = model.mlm_logits(hidden[starts[row] : starts[row] + len(item)]).float()  # (L, V)
            weights = torch.log1p(torch.relu(logits)).amax(dim=0)  # (V,)
            indices = weights.nonzero().squeeze(1)
            found[row] = SparseVector(indices.cpu().numpy(), weights[indices].cpu().numpy())
    if not found:
        return None

    def collect(results: list) -> None:
        for row, value in found.items():
            results[row] = value
    return collect


def _span_logits(logits: np.ndarray) -> SpanLogits:
    """(L, 2) question-answering logits -> their start and end columns, each its own (L,) array."""
    return SpanLogits(logits[:, 0].copy(), logits[:, 1].copy())


def _per_token(items: list[Item], hidden: torch.Tensor, starts: list[int], kind: type,
               head: torch.nn.Module | None, result: Callable[[np.ndarray], Result]) -> Collector | None:
    """A head on every token's last-layer state of each item of `kind` (a token classifier, the question-answering
    span head): one matmul over the rows of all those items, (R, outputs) to the host."""
    rows = [r for r, item in enumerate(items) if isinstance(item, kind)]
    if not rows:
        return None
    spans = [(starts[r], starts[r] + len(items[r])) for r in rows]
    at = to_device([i for start, stop in spans for i in range(start, stop)], hidden.device)
    logits = to_host(head(hidden[at]).float())  # (sum of the items' lengths, outputs)
    ends = list(accumulate(stop - start for start, stop in spans))

    def collect(results: list) -> None:
        values = logits.numpy()
        for row, stop, (start, end) in zip(rows, ends, spans):
            results[row] = result(values[stop - (end - start) : stop])
    return collect
