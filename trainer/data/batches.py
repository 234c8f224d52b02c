"""The training batches, step after step: built in this process on a CPU, ahead of the step in a worker
process on a GPU.

Building a step's batch (choosing the pairs, collating them, drawing the masks) is host work: about 10 ms for
256 pairs of 128 tokens on this project's CPU machine, 23 ms on an H200's host. Done between steps, it left the
GPU idle that long each step: bench.gpu's training profile on an H200 (2026-11-26) found the device busy 67% of
the wall-clock, idle from the end of each optimizer step until the next batch was built and copied. A thread
would share the interpreter lock with the thread that dispatches the step, itself busy for most of a step; a
worker process (torch's DataLoader, forked, so the corpus is shared rather than copied) builds the next batches
while the step runs, and hands them over pinned, so that the step's copies to the device need not wait for it.
Measured there: 35.8% -> 36.4% MFU, less than the idle share promised, because the step's own dispatch (about as
long as the device's work) is now what the device waits on (BENCHMARKS.md, "On a GPU").
On a CPU the cores are the model's: the batches are built in this process, between steps, as before.
"""

from __future__ import annotations

import copy
import multiprocessing
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from trainer.data.examples import PairBatch, TrainingPairs, collate
from trainer.data.masking import MaskedBatch, in_slots, mask_tokens, slots_per_row
from trainer.data.pipeline import PreparedData
from trainer.options import TrainOptions
from trainer.state import Progress


def training_batch(pairs: TrainingPairs, progress: Progress, options: TrainOptions, data: PreparedData,
                   replace: torch.Tensor, fixed_shapes: bool = False) -> tuple[PairBatch, MaskedBatch]:
    """Step `progress.step`'s pairs and masks (advancing the data cursors): the same on every rank,
    and the same again after a resume. `fixed_shapes`: padded to --max-seq-len, the masks also in fixed slots
    (`in_slots`), for a step replayed as CUDA graphs; the same pairs and masks either way."""
    batch = collate(pairs.batch(progress.step, options.batch_size, progress.cursors), data.tokenizer)
    generator = torch.Generator().manual_seed(options.seed * 1_000_003 + progress.step)
    masked = mask_tokens(batch.input_ids, batch.special_mask, generator, data.tokenizer.mask_id, replace,
                         options.mask_rate)
    if fixed_shapes:  # padded after masking: the masks are drawn over the same shape either way
        pad = data.tokenizer.pad_id
        batch = batch.padded_to(options.max_seq_len, pad)
        masked = in_slots(masked.padded_to(options.max_seq_len, pad), slots_per_row(options.max_seq_len,
                                                                                     options.mask_rate))
    return batch, masked


@dataclass
class StepBatch:
    step: int
    batch: PairBatch
    masked: MaskedBatch
    cursors: list[list[int]]  # the data cursors once this batch is taken: what a checkpoint after it saves


class _Steps(IterableDataset):
    """Step `first`'s batch, then the next step's, without end (the loop decides when to stop)."""

    def __init__(self, pairs: TrainingPairs, first: int, cursors: list[list[int]], options: TrainOptions,
                 data: PreparedData, replace: torch.Tensor, fixed_shapes: bool):
        self.pairs, self.first, self.cursors = pairs, first, cursors
        self.options, self.data, self.replace, self.fixed_shapes = options, data, replace, fixed_shapes

    def __iter__(self) -> Iterator[dict]:
        progress = Progress(step=self.first, cursors=copy.deepcopy(self.cursors))
        # With several workers, worker k of n builds the steps first + k, first + k + n, ... (the DataLoader takes
        # them from the workers in turn: in order). A step's data cursors are where the last step's left them, so
        # each worker moves them past the other workers' steps too (TrainingPairs.advance: counting the steps'
        # draws, not building their pairs); it builds, collates and masks its own steps only.
        worker = get_worker_info()
        share, workers = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        while True:
            if (progress.step - self.first) % workers != share:
                self.pairs.advance(progress.step, self.options.batch_size, progress.cursors)
                progress.step += 1
                continue
            batch, masked = training_batch(self.pairs, progress, self.options, self.data, self.replace,
                                           self.fixed_shapes)
            # Plain containers of tensors: the DataLoader pins those (a dataclass it would pass on unpinned).
            yield {"step": progress.step, "batch": batch.__dict__.copy(), "masked": masked.__dict__.copy(),
                   "cursors": copy.deepcopy(progress.cursors)}
            progress.step += 1


class BatchStream:
    """`next(step) -> StepBatch`, for steps `first`, `first` + 1, ... in order. `ahead` = True: built by
    `workers` worker processes, each up to two of its steps ahead, and pinned (for a CUDA device); False: built
    when asked for.
    `fixed_shapes`: see `training_batch`."""

    def __init__(self, pairs: TrainingPairs, first: int, cursors: list[list[int]], options: TrainOptions,
                 data: PreparedData, replace: torch.Tensor, ahead: bool, fixed_shapes: bool = False, workers: int = 1):
        steps = _Steps(pairs, first, cursors, options, data, replace, fixed_shapes)
        if ahead:
            # fork: the worker shares the corpus instead of receiving a copy; it never touches the device.
            context = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() \
                else None
            loader = DataLoader(steps, batch_size=None, num_workers=workers, prefetch_factor=2,
                                pin_memory=torch.cuda.is_available(),
                                multiprocessing_context=context,
                                # its own seed source: drawn from the global one, it would shift the dropout stream
                                generator=torch.Generator().manual_seed(0))
            self._items = iter(loader)
        else:
            self._items = iter(steps)

    def next(self, step: int) -> StepBatch:
        item = next(self._items)
        if item["step"] != step:  # the stream and the loop disagree: a bug, never a silent skip
            raise RuntimeError(f"batch stream out of step: asked for step {step}, built step {item['step']}")
        return StepBatch(step, PairBatch(**item["batch"]), MaskedBatch(**item["masked"]), item["cursors"])

    def close(self) -> None:
        """Stops the worker, if any (its pending batches are dropped: the loop has ended)."""
        self._items = iter(())


__all__ = ["BatchStream", "StepBatch", "training_batch"]
