"""How a batch runs on the device. Knows nothing of queues, deadlines or HTTP.

One forward pass of the encoder serves every item of a batch; each item then gets only its own head:
token vectors or pooling (encode), the MLM head at its [MASK] positions only (fill-mask), the pooler
and NSP head on its [CLS] (nsp).
"""

from __future__ import annotations

import logging
import threading
from contextlib import nullcontext
from dataclasses import dataclass
from itertools import accumulate, chain

import numpy as np
import torch
import torch.nn.functional as F

from model.bert import BertForPreTraining
from model.attention import attention_pads
from model.flops import BatchPricer, packed_batch_flops
from model.packing import Packing, attends_each_on_cpu
from service.engine.graphs import EncoderGraphs, Layout, stage
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
    TokenVectors,
)

log = logging.getLogger("service")


@dataclass
class Batch:
    """Plain data on the host: the items' tokens packed back to back (no padding), and the items."""

    input_ids: torch.Tensor  # (N,) every item's tokens, one item after another
    token_type_ids: torch.Tensor  # (N,)
    packing: Packing
    items: list[Item]
    flops: float  # the encoder's FLOPs for this batch
    padding_flops: float  # ... of which attention spends on padding
    staged: torch.Tensor | None = None  # every input in one int32 buffer laid out for a CUDA graph's bucket
    layout: Layout | None = None  # ... that bucket

    @property
    def size(self) -> int:
        return len(self.items)

    @property
    def real_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def padded_tokens(self) -> int:
        """Tokens in attention's padded (B, T) layout; the token-wise layers compute `real_tokens` only."""
        return self.packing.batch * self.packing.width

    def starts(self) -> list[int]:
        """Where each item begins in the packed layout."""
        return list(accumulate((len(i) for i in self.items[:-1]), initial=0))


class Engine:
    """Runs batches of typed items through one model on one device (the batcher's `BatchEngine`)."""

    def __init__(self, model: BertForPreTraining, device: torch.device, dtype: torch.dtype):
        self.model = model.to(device=device, dtype=dtype).eval()
        self.device = device
        self.dtype = dtype
        # Whether a batch's attention may compute padding (False where varlen attention runs): the batcher
        # prices candidate batches only where it may. Fixed for the engine's life, so asked once.
        self.pads_attention = attention_pads(device, dtype, model.config.head_dim)
        self._price_all_layers = BatchPricer(model.config)
        self.graphs: EncoderGraphs | None = None  # set by use_graphs
        self._graph_memory = threading.Lock()  # the graphs' outputs share one pool: one graphed batch at a time

    @property
    def has_mlm_head(self) -> bool:
        return self.model.has_mlm_head

    @property
    def has_nsp_head(self) -> bool:
        return self.model.has_nsp_head

    @property
    def num_labels(self) -> int:
        return self.model.num_labels

    def flops(self, count: int, longest: int, real: int, real_squares: int,
              layers: int | None = None) -> tuple[float, float]:
        """(FLOPs of one packed batch through `layers` (all by default), the part spent on padding): see
        `packed_batch_flops`. The batcher prices candidate batches with all layers, not knowing their kinds."""
        # No padding where attention runs on packed sequences (varlen on CUDA) or one sequence at a time (CPU).
        per_sequence = not self.pads_attention or \
            (self.device.type == "cpu" and attends_each_on_cpu(count, longest, real_squares,
                                                                self.model.config.hidden_size))
        if layers is None:
            return self._price_all_layers(count, longest, real, real_squares, per_sequence)
        return packed_batch_flops(self.model.config, count, longest, real, real_squares, per_sequence, layers)

    def collate(self, items: list[Item]) -> Batch:
        # np.fromiter over the chained lists: a quarter of the cost of torch.tensor on a flattened list.
        ids = torch.from_numpy(np.fromiter(chain.from_iterable(i.input_ids for i in items), dtype=np.int64))
        types = torch.from_numpy(np.fromiter(chain.from_iterable(i.token_type_ids for i in items), dtype=np.int64))
        lengths = [len(item) for item in items]
        packing = Packing.from_lengths(lengths)
        flops, padding = self.flops(len(items), max(lengths), sum(lengths), sum(n * n for n in lengths),
                                    None if self._runs_heads(items) else self.model.config.served_embedding_layer)
        layout = self.graphs.layout_for(len(ids), len(items)) if self.graphs is not None else None
        if layout is not None:  # one page-locked buffer, one copy to the device
            staged = stage(ids.numpy(), types.numpy(), packing, layout, pin=self.device.type == "cuda")
            return Batch(ids, types, packing, items, flops, padding, staged, layout)
        if self.device.type == "cuda":  # page-locked memory: the copy overlaps with the host
            ids, types = ids.pin_memory(), types.pin_memory()
        return Batch(ids, types, packing, items, flops, padding)

    def use_graphs(self, graphs: EncoderGraphs | None) -> None:
        """Run the batches that fit `graphs` through them from now on (None: every batch eagerly). Batches
        collated before keep the path they were collated for."""
        self.graphs = graphs

    @torch.inference_mode()
    def run(self, batch: Batch) -> list[Result]:
        with self._graph_memory if batch.staged is not None else nullcontext():
            return self._run(batch)

    def _run(self, batch: Batch) -> list[Result]:
        for_heads = self._runs_heads(batch.items)
        if batch.staged is not None:
            embedded, hidden, packing = self.graphs.replay(batch.staged, batch.layout, batch.real_tokens, batch.size,
                                                           for_heads)
        else:
            device = self.device
            packing = batch.packing.to(device, non_blocking=True)
            embedded, hidden = self.model.encode_packed(batch.input_ids.to(device, non_blocking=True),
                                                        batch.token_type_ids.to(device, non_blocking=True), packing,
                                                        for_heads)  # (N, H) each
        results: list[Result | None] = [None] * batch.size
        starts = batch.starts()
        self._encode_outputs(batch, embedded, packing, starts, results)
        if hidden is None:
            return results
        self._fill_mask_outputs(batch, hidden, starts, results)
        self._nsp_outputs(batch, hidden, starts, results)
        self._class_outputs(batch, hidden, starts, results)
        self._sparse_outputs(batch, hidden, starts, results)
        return results

    @staticmethod
    def _runs_heads(items: list[Item]) -> bool:
        """A checkpoint whose heads read layers above its embedding layer runs those only for items with a head."""
        return any(not isinstance(item, EncodeItem) for item in items)

    # ---- heads ---------------------------------------------------------------------------------

    def _encode_outputs(self, batch: Batch, hidden: torch.Tensor, packing: Packing, starts: list[int],
                        results: list) -> None:
        rows = [r for r, item in enumerate(batch.items) if isinstance(item, EncodeItem)]
        if not rows:
            return
        hidden = hidden.float()
        wanted = {(batch.items[r].pooling, batch.items[r].normalize) for r in rows}
        host: dict[tuple[str, bool], np.ndarray] = {}  # only the variants some item asked for reach the host
        for pooling, normalize in wanted:
            if pooling == "none":
                values = hidden  # (N, H): every item's token vectors, split per item below
            elif pooling == "cls":
                values = hidden[packing.starts]  # (B, H)
            else:
                ends = packing.cu_seqlens  # on the device already: no copy (and no wait) for the lengths
                lengths = (ends[1:] - ends[:-1]).to(hidden.dtype)
                sums = hidden.new_zeros(packing.batch, hidden.shape[-1]).index_add_(0, packing.rows, hidden)
                values = sums / lengths[:, None]  # (B, H): mean over the item's tokens
            host[(pooling, normalize)] = (F.normalize(values, dim=-1) if normalize else values).cpu().numpy()
        for row in rows:
            item = batch.items[row]
            values = host[(item.pooling, item.normalize)]
            if item.pooling == "none":
                results[row] = TokenVectors(values[starts[row] : starts[row] + len(item)])
            else:
                results[row] = PooledVector(values[row])

    def _fill_mask_outputs(self, batch: Batch, hidden: torch.Tensor, starts: list[int], results: list) -> None:
        wanted = [(r, p) for r, item in enumerate(batch.items) if isinstance(item, FillMaskItem)
                  for p in item.mask_positions]
        if not wanted:
            return
        at = torch.tensor([starts[r] + p for r, p in wanted], device=hidden.device)
        probs = torch.softmax(self.model.mlm_logits(hidden[at]).float(), dim=-1)  # (M, V): masked positions only
        k = max(batch.items[r].top_k for r, _ in wanted)
        top_scores, top_ids = probs.topk(min(k, probs.shape[-1]), dim=-1)  # on the device: only k values move
        top_scores, top_ids = top_scores.cpu().numpy(), top_ids.cpu().numpy()
        target_rows = [slot for slot, (r, _) in enumerate(wanted) if batch.items[r].target_ids]
        target_probs = probs[target_rows].cpu().numpy() if target_rows else None
        target_lookup = {slot: n for n, slot in enumerate(target_rows)}
        for slot, (row, position) in enumerate(wanted):
            item = batch.items[row]
            if item.target_ids:
                scores = target_probs[target_lookup[slot]][item.target_ids]
                order = np.argsort(-scores, kind="stable")[: item.top_k]
                mask = MaskScores(position, np.asarray(item.target_ids)[order], scores[order])
            else:
                mask = MaskScores(position, top_ids[slot, : item.top_k], top_scores[slot, : item.top_k])
            if results[row] is None:
                results[row] = FillMaskScores([])
            results[row].masks.append(mask)

    def _nsp_outputs(self, batch: Batch, hidden: torch.Tensor, starts: list[int], results: list) -> None:
        rows = [r for r, item in enumerate(batch.items) if isinstance(item, NspItem)]
        if not rows:
            return
        cls_vectors = hidden[torch.tensor([starts[r] for r in rows], device=hidden.device)]  # (R, H)
        logits = self.model.nsp_logits_from_cls(cls_vectors).float().cpu().numpy()
        for slot, row in enumerate(rows):
            results[row] = NspLogits(logits[slot])

    def _class_outputs(self, batch: Batch, hidden: torch.Tensor, starts: list[int], results: list) -> None:
        rows = [r for r, item in enumerate(batch.items) if isinstance(item, ClassifyItem)]
        if not rows:
            return
        cls_vectors = hidden[torch.tensor([starts[r] for r in rows], device=hidden.device)]  # (R, H)
        logits = self.model.class_logits_from_cls(cls_vectors).float().cpu().numpy()  # (R, num_labels)
        for slot, row in enumerate(rows):
            results[row] = ClassLogits(logits[slot])

    def _sparse_outputs(self, batch: Batch, hidden: torch.Tensor, starts: list[int], results: list) -> None:
        """SPLADE weights: max over the item's tokens of log(1 + relu(MLM logits)), (V,) per item, kept sparse.
        One item at a time: its (L, V) logits are the largest tensor any route makes."""
        for row, item in enumerate(batch.items):
            if isinstance(item, SparseItem):
                logits = self.model.mlm_logits(hidden[starts[row] : starts[row] + len(item)]).float()  # (L, V)
                weights = torch.log1p(torch.relu(logits)).amax(dim=0)  # (V,)
                indices = weights.nonzero().squeeze(1)
                results[row] = SparseVector(indices.cpu().numpy(), weights[indices].cpu().numpy())

    # ---- device housekeeping -------------------------------------------------------------------

    def release_cached_memory(self) -> None:
        """Give the allocator's cached blocks back after an out-of-memory error, before retrying smaller."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    @staticmethod
    def is_out_of_memory(exc: BaseException) -> bool:
        return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()

    def warm_up(self, cls_id: int, sep_id: int, mask_id: int) -> None:
        """One batch through every head, so the first client request pays no first-call costs."""
        one, two = [cls_id, mask_id, sep_id], [cls_id, mask_id, sep_id, mask_id, sep_id]
        items: list[Item] = [EncodeItem(one, [0] * 3, pooling="mean"), EncodeItem(two, [0, 0, 0, 1, 1])]
        if self.has_mlm_head:
            items.append(FillMaskItem(one, [0] * 3, mask_positions=[1]))
        if self.has_nsp_head:
            items.append(NspItem(two, [0, 0, 0, 1, 1]))
        if self.num_labels:
            items.append(ClassifyItem(two, [0, 0, 0, 1, 1]))
        self.run(self.collate(items))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
