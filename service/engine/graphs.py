"""CUDA graphs of the encoder: a batch's whole forward pass launched as one replay, at fixed token counts.

Why: on a GPU a small model's batch is bound by the host, not the device. Every op of a forward pass costs the
engine's runner thread some microseconds of Python and one kernel launch (about 100 of them for six layers);
on an H200 the runner was the busiest thread of the server, on top of its stack `Linear.forward`, and a batch
took about 5.6 ms whatever its size (BENCHMARKS.md, "On a GPU"). A graph records the launches once and
replays them in one call. Graphs need fixed shapes and fixed addresses, which the packed layout gives cheaply:

- a batch's N tokens are padded up to the next *bucket* (`token_buckets`: 8 sizes per doubling above 512, so
  at most an eighth more rows; below 512 steps of 64, where the device waits on the host anyway);
- its B sequences fill a fixed number of sequence *slots* (the batch size in force): the slots past B are empty
  sequences (the cumulative length repeats), and the padding rows belong to no sequence;
- attention is FlashAttention over the packed sequences (`model.attention.attend_varlen`), whose shapes depend
  on N alone; it is told the model's longest input as the longest sequence, so one graph serves every mix;
- a batch's inputs (ids, token types, positions, rows, cumulative lengths, starts) travel as one int32 host
  buffer laid out for its bucket (`stage`, built by the preparer thread ahead of time) and reach the device in
  one copy, into the buffer the graphs read.

Padding rows compute values that nothing reads: every layer but attention works row by row, and attention
gives them no sequence (its output rows for them are whatever the memory held). Each graph also pools the
served states every way an embedding route asks for (service/engine/pooling.py: [CLS] or mean, normalised or
not) into one buffer all graphs share, and the graphs of the whole stack compute the [CLS] heads (next-sentence, a
sequence classifier: a reranker's scores) for every slot, so that an embedding or a rerank batch needs no torch call
between its replay and its copy to the host. The graphs share one memory pool: the engine holds a lock from a
batch's copy in until its heads are queued, after which the next replay, queued behind them on the same stream, may
overwrite the outputs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from model.packing import Packing
from service.engine.pooling import POOLED, pool_every_variant

SMALLEST_BUCKET = 64
BUCKETS_PER_DOUBLING = 8


def token_buckets(most: int) -> list[int]:
    """The token counts graphs are captured at, up to `most` (the batch token budget, always a bucket)."""
    sizes, size = [], SMALLEST_BUCKET
    while size < most:
        sizes.append(size)
        size += max(SMALLEST_BUCKET, (1 << (size.bit_length() - 1)) // BUCKETS_PER_DOUBLING)
    return sizes + [most]


@dataclass(frozen=True)
class Layout:
    """Where each input sits in the int32 buffer of a batch padded to `tokens` rows with `slots` sequences."""

    tokens: int
    slots: int

    @property
    def size(self) -> int:
        return 4 * self.tokens + 2 * self.slots + 1

    def views(self, buffer: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(ids, token types, positions, rows: each (tokens,); cumulative lengths (slots + 1,); starts (slots,))."""
        t, s = self.tokens, self.slots
        return (buffer[:t], buffer[t:2 * t], buffer[2 * t:3 * t], buffer[3 * t:4 * t], buffer[4 * t:4 * t + s + 1],
                buffer[4 * t + s + 1:4 * t + 2 * s + 1])


def stage(ids: np.ndarray, types: np.ndarray, packing: Packing, layout: Layout, pin: bool) -> torch.Tensor:
    """One batch's inputs in `layout` on the host (page-locked when `pin`, so that the copy runs asynchronously).
    Padding rows get id 0 at position 0 of sequence 0, which no sequence reads; the empty slots end where the
    last sequence does."""
    staged = torch.zeros(layout.size, dtype=torch.int32, pin_memory=pin)
    ids_at, types_at, positions_at, rows_at, ends_at, starts_at = layout.views(staged.numpy())
    count, batch = len(ids), packing.batch
    ids_at[:count], types_at[:count] = ids, types
    positions_at[:count], rows_at[:count] = packing.positions.numpy(), packing.rows.numpy()
    ends_at[: batch + 1] = packing.cu_seqlens.numpy()
    ends_at[batch + 1:] = count
    starts_at[:batch] = packing.starts.numpy()
    return staged


@dataclass(frozen=True)
class GraphHeads:
    """What a graph computed for a batch's sequences besides the states, so that the heads that read only these need
    no torch call between the replay and their copy down (service.engine.heads): the embedding-layer states pooled
    every way, and where the graph ran the whole stack, the [CLS] heads' logits. All float32."""

    pooled: torch.Tensor | None = None  # (len(POOLED), B, H); None: an eager batch, nothing computed
    nsp: torch.Tensor | None = None  # (B, 2), where the checkpoint has a next-sentence head
    classes: torch.Tensor | None = None  # (B, num_labels), where it has a sequence classifier


class EncoderGraphs:
    """The model's encoder captured as CUDA graphs, one per bucket (and per depth when the served embedding layer
    is below the top). `replay` runs a staged batch and returns views of the graph's outputs."""

    def __init__(self, model, device: torch.device, most_tokens: int, slots: int, capture: bool = True):
        self.model = model
        self.device = device
        self.slots = slots
        self.buckets = token_buckets(most_tokens)
        self.longest = model.config.max_position_embeddings  # FlashAttention's max_seqlen for every batch
        self.split = model.config.served_embedding_layer < model.config.num_hidden_layers
        self.capture = capture  # False: the same static path through a StandIn, not a CUDA graph (tests on the CPU)
        self.inputs = torch.zeros(Layout(self.buckets[-1], slots).size, dtype=torch.int32, device=device)
        # Every graph's pooled vectors (POOLED's variants, float32), one batch's at a time as are the inputs.
        self.pooled = torch.zeros(len(POOLED), slots, model.config.hidden_size, dtype=torch.float32, device=device)
        self.graphs: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph | StandIn, tuple]] = {}
        self.eager: dict[str, str] = {}  # graphs dropped (by name) and why: their batches run op by op
        self.pool = None

    def whole_stack(self, for_heads: bool) -> bool:
        """Which of a bucket's graphs a batch replays: the whole stack for heads (one graph serves both without a
        split below the top)."""
        return for_heads or not self.split

    def name(self, key: tuple[int, bool]) -> str:
        """A graph's name in the log, /info and /metrics: its tokens x slots, and with a split which depth."""
        tokens, whole = key
        return f"{tokens}x{self.slots}" + ("" if not self.split else ":heads" if whole else ":embedding")

    @property
    def live(self) -> list[str]:
        return [self.name(key) for key in sorted(self.graphs)]

    def layout_for(self, tokens: int, sequences: int, for_heads: bool = True) -> Layout | None:
        """The bucket a batch runs in, or None when it fits none or its graph was dropped (it then runs eagerly)."""
        if sequences > self.slots or tokens > self.buckets[-1]:
            return None
        bucket = next(b for b in self.buckets if b >= tokens)
        return Layout(bucket, self.slots) if (bucket, self.whole_stack(for_heads)) in self.graphs else None

    def drop(self, key: tuple[int, bool], reason: str) -> None:
        """Serve `key`'s batches eagerly from now on (the others keep their graphs)."""
        self.graphs.pop(key, None)
        self.eager[self.name(key)] = reason

    def keys(self) -> list[tuple[int, bool]]:
        """Every graph start-up captures: each bucket, and with a split each depth."""
        depths = (False, True) if self.split else (True,)
        return [(tokens, whole) for tokens in reversed(self.buckets) for whole in depths]

    @torch.inference_mode()
    def capture_all(self) -> float:
        """Capture every bucket, largest first (the later graphs reuse the pool's blocks); returns the seconds.
        A capture that raises drops that graph alone (`eager` says why): its batches run op by op."""
        started = time.perf_counter()
        for key in self.keys():
            try:
                self.graphs[key] = self._record(Layout(key[0], self.slots), key[1])
            except Exception as exc:  # noqa: BLE001 - that bucket serves eagerly: slower, not wrong
                self.drop(key, f"capture failed: {type(exc).__name__}: {exc}")
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - started

    def _static_forward(self, layout: Layout, for_heads: bool):
        ids, types, positions, rows, ends, starts = layout.views(self.inputs)
        packing = Packing(rows, rows, positions, starts, None, self.slots, self.longest, (), ends)

        def forward():
            embedded, hidden = self.model.encode_packed(ids, types, packing, for_heads)
            pooled = pool_every_variant(embedded.float(), rows, ends, starts, out=self.pooled)
            if not for_heads:
                return embedded, hidden, pooled, None, None
            cls = hidden[starts]  # every slot's [CLS] state (an unused slot's is row 0's, which no item reads)
            nsp = self.model.nsp_logits_from_cls(cls).float() if self.model.has_nsp_head else None
            classes = self.model.class_logits_from_cls(cls).float() if self.model.num_labels else None
            return embedded, hidden, pooled, nsp, classes
        return forward

    def _record(self, layout: Layout, for_heads: bool):
        if not self.capture:
            stand_in = StandIn(self._static_forward(layout, for_heads))
            return stand_in, stand_in.outputs
        forward = self._static_forward(layout, for_heads)
        # Warm up on a side stream first (PyTorch's advice for capture: lazy initialisation stays out of the graph).
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            forward()
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = forward()
        self.pool = graph.pool()
        return graph, outputs

    def replay(self, staged: torch.Tensor, layout: Layout, tokens: int, sequences: int, for_heads: bool
               ) -> tuple[torch.Tensor, torch.Tensor | None, Packing, GraphHeads]:
        """A batch staged in `layout` through its graph: ((tokens, H) embedding-layer states, (tokens, H) last-layer
        states or None unless `for_heads`, the batch's Packing on the device for the heads, what the graph computed of
        the heads for its sequences). The outputs are the graphs' own memory: read them before the next replay."""
        self.inputs[: layout.size].copy_(staged, non_blocking=True)
        graph, outputs = self.graphs[layout.tokens, self.whole_stack(for_heads)]
        graph.replay()
        embedded, hidden, pooled, nsp, classes = outputs
        _, _, positions, rows, ends, starts = layout.views(self.inputs)
        packing = Packing(rows[:tokens], rows[:tokens], positions[:tokens], starts[:sequences], None, sequences,
                          self.longest, (), ends[: sequences + 1])
        if not for_heads:  # the embedding routes read the pooled vectors alone
            return embedded[:tokens], None, packing, GraphHeads(pooled[:, :sequences])
        nsp, classes = (None if logits is None else logits[:sequences] for logits in (nsp, classes))
        return embedded[:tokens], hidden[:tokens], packing, GraphHeads(pooled[:, :sequences], nsp, classes)

    def __len__(self) -> int:
        return len(self.graphs)


class StandIn:
    """What a CUDA graph does, on any device (tests on the CPU): `replay` computes the static forward again and
    writes it into the SAME output tensors, as a graph's replay overwrites its static outputs. So a batch read after
    the next one's replay reads the next one's states, on a CPU as on a GPU."""

    def __init__(self, forward):
        self.forward = forward
        first, copies = forward(), {}  # one tensor twice (no split) stays one buffer, as in a graph
        self.outputs = tuple(None if t is None else copies.setdefault(id(t), t.clone()) for t in first)

    def replay(self) -> None:
        written = set()
        for static, fresh in zip(self.outputs, self.forward()):
            if static is not None and id(static) not in written:
                static.copy_(fresh)
                written.add(id(static))
