"""How a batch runs on the device. Knows nothing of queues, deadlines or HTTP.

One forward pass of the encoder serves every item of a batch (replayed as a CUDA graph where there are
some, service.engine.graphs); each item then gets only its own head (service.engine.heads). A batch is
launched, then finished: on a GPU `launch` queues all of its device work and returns, and `finish` waits
for it and builds the results, so the batcher can launch the next batch in between (`overlaps`).
"""

from __future__ import annotations

import logging
import threading
from contextlib import nullcontext
from dataclasses import dataclass
from itertools import accumulate, chain
from operator import attrgetter, mul

import numpy as np
import torch

from model.bert import BertForPreTraining
from model.attention import attention_pads
from model.flops import BatchPricer, packed_batch_flops
from model.packing import Packing, attends_each_on_cpu
from model.row_buckets import rounds_rows, rows_to_compute
from service.engine.graphs import EncoderGraphs, GraphHeads, Layout, stage
from service.engine.head_copies import Collector
from service.engine.heads import launch_heads
from service.tasks import (
    ClassifyItem,
    EncodeItem,
    FillMaskItem,
    Item,
    LateInteractionItem,
    NspItem,
    QaItem,
    Result,
    TokenClassifyItem,
)

log = logging.getLogger("service")
_INPUT_IDS, _TOKEN_TYPE_IDS = attrgetter("input_ids"), attrgetter("token_type_ids")


@dataclass
class Batch:
    """Plain data on the host: the items' tokens packed back to back (no padding), and the items."""

    input_ids: torch.Tensor  # (N,) every item's tokens, one item after another
    token_type_ids: torch.Tensor  # (N,)
    packing: Packing
    items: list[Item]
    real_tokens: int  # N (read several times a batch: an int, not len() of the tensor at a microsecond each)
    flops: float  # the encoder's FLOPs for this batch
    padding_flops: float  # ... of which attention spends on padding
    staged: torch.Tensor | None = None  # every input in one int32 buffer laid out for a CUDA graph's bucket
    layout: Layout | None = None  # ... that bucket
    # Whether some item is not an embedding's: a checkpoint whose heads read layers above its embedding layer runs
    # those only for batches with such items.
    runs_heads: bool = True

    @property
    def size(self) -> int:
        return len(self.items)

    @property
    def graph_rows(self) -> int:
        """Rows the encoder computes for a graphed batch (its bucket); 0 for a batch that runs op by op."""
        return self.layout.tokens if self.layout is not None else 0

    @property
    def padded_tokens(self) -> int:
        """Tokens in attention's padded (B, T) layout; the token-wise layers compute `real_tokens` only."""
        return self.packing.batch * self.packing.width

    def starts(self) -> list[int]:
        """Where each item begins in the packed layout."""
        return list(accumulate((len(i) for i in self.items[:-1]), initial=0))


@dataclass
class DeviceWork:
    """A batch's device work, queued: `done` is recorded after its last copy (None on a CPU, done already)."""

    size: int
    collectors: list[Collector]
    done: torch.cuda.Event | None


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
        self.rounds_rows = rounds_rows(device, dtype)  # batches computed on a rounded-up row count (row_buckets)
        self.graphs: EncoderGraphs | None = None  # set by use_graphs
        self.graphs_fallen_back: dict[str, str] = {}  # graphs the start-up check dropped, and why (loader)
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

    @property
    def num_token_labels(self) -> int:
        return self.model.num_token_labels

    @property
    def has_qa_head(self) -> bool:
        return self.model.qa_outputs is not None

    @property
    def late_interaction_dim(self) -> int:
        """The width of a ColBERT's token vectors (0: not a ColBERT)."""
        return self.model.projection.out_features if self.model.projection is not None else 0

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
        # A GPU's batch is a few hundred items, collated on the thread that must stay ahead of the device: each pass
        # over them goes through C (map, join), not a Python loop per item (batches of 256: 0.75 µs an input with the
        # loops, 0.67 so; bench.serving.batch_selection).
        id_lists = list(map(_INPUT_IDS, items))
        lengths = list(map(len, id_lists))
        real = sum(lengths)
        ids = torch.from_numpy(_joined(id_lists))
        types = torch.from_numpy(_joined(list(map(_TOKEN_TYPE_IDS, items))))
        kinds = set(map(type, items))
        keys = _attended(items) if any(issubclass(kind, LateInteractionItem) for kind in kinds) else None
        spare_rows = rows_to_compute(real) - real if self.rounds_rows else 0
        packing = Packing.from_lengths(lengths, keys, spare_rows)
        runs_heads = not all(issubclass(kind, EncodeItem) for kind in kinds)
        flops, padding = self.flops(len(items), max(lengths), real, sum(map(mul, lengths, lengths)),
                                    None if runs_heads else self.model.config.served_embedding_layer)
        # The graphs attend each sequence to all of itself: a batch where some do not runs op by op.
        layout = self.graphs.layout_for(real, len(items), runs_heads) \
            if self.graphs is not None and keys is None else None
        if layout is not None:  # one page-locked buffer, one copy to the device
            staged = stage(ids.numpy(), types.numpy(), packing, layout, pin=self.device.type == "cuda")
            return Batch(ids, types, packing, items, real, flops, padding, staged, layout, runs_heads)
        if self.device.type == "cuda":  # page-locked memory: the copy overlaps with the host
            ids, types = ids.pin_memory(), types.pin_memory()
        return Batch(ids, types, packing, items, real, flops, padding, runs_heads=runs_heads)

    def use_graphs(self, graphs: EncoderGraphs | None) -> None:
        """Run the batches that fit `graphs` through them from now on (None: every batch eagerly). Batches
        collated before keep the path they were collated for."""
        self.graphs = graphs

    @property
    def overlaps(self) -> bool:
        """Whether `launch` returns before the device has finished (a GPU): the batcher then launches the next
        batch before it finishes this one."""
        return self.device.type == "cuda"

    @torch.inference_mode()
    def launch(self, batch: Batch) -> DeviceWork:
        """Queue the batch's whole device work: inputs up, the encoder, every item's head, the outputs' copies down."""
        # Graphed batches share the graphs' memory: the next replay may start once this one's heads are queued.
        with self._graph_memory if batch.staged is not None else nullcontext():
            for_heads = batch.runs_heads
            if batch.staged is not None:
                embedded, hidden, packing, graphed = self.graphs.replay(batch.staged, batch.layout,
                                                                        batch.real_tokens, batch.size, for_heads)
            else:
                device, graphed = self.device, GraphHeads()
                packing = batch.packing.to(device, non_blocking=True)
                embedded, hidden = self.model.encode_packed(batch.input_ids.to(device, non_blocking=True),
                                                            batch.token_type_ids.to(device, non_blocking=True),
                                                            packing, for_heads)  # (N, H) each
            collectors = launch_heads(self.model, batch.items, embedded, hidden, packing, batch.starts(), graphed)
            done = None
            if self.device.type == "cuda":
                done = torch.cuda.Event()
                done.record()
        return DeviceWork(batch.size, collectors, done)

    def finish(self, work: DeviceWork) -> list[Result]:
        """Wait for a launched batch's device work (the GIL is free meanwhile) and build its results."""
        if work.done is not None:
            work.done.synchronize()
        results: list[Result | None] = [None] * work.size
        for collect in work.collectors:
            collect(results)
        return results

    def run(self, batch: Batch) -> list[Result]:
        return self.finish(self.launch(batch))

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
        if self.num_token_labels:
            items.append(TokenClassifyItem(one, [0] * 3))
        if self.has_qa_head:
            items.append(QaItem(two, [0, 0, 0, 1, 1]))
        self.run(self.collate(items))
        if self.late_interaction_dim:  # a ColBERT query whose [MASK] is no key, a document: their own batch (op by op)
            self.run(self.collate([LateInteractionItem(two, [0] * 5, keys=3),
                                   LateInteractionItem(one, [0] * 3, kept=[0, 2])]))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _joined(sequences: list) -> np.ndarray:
    """(N,) int64: the items' token ids (or type ids) back to back. Items read off the wire carry int32 memoryviews
    (service.messages), joined as bytes in one call (4 µs for 200 items, where going through their ints took 100);
    lists (items made in this process) go through np.fromiter over the chained lists, a quarter of the cost of
    torch.tensor on a flattened list."""
    if sequences and type(sequences[0]) is memoryview:
        try:
            return np.frombuffer(b"".join(sequences), dtype=np.int32).astype(np.int64)
        except TypeError:  # not all of them views (bytes.join takes no list): item by item, below
            pass
    return np.fromiter(chain.from_iterable(sequences), dtype=np.int64)


def _attended(items: list[Item]) -> list[int] | None:
    """How many leading tokens of each item the others attend to, where some item restricts it (a ColBERT query whose
    [MASK] expansion is not read); None when every token of every item is read."""
    keys = [item.keys if isinstance(item, LateInteractionItem) else None for item in items]
    if all(k is None for k in keys):
        return None
    return [len(item) if k is None else k for item, k in zip(items, keys)]
