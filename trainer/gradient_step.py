"""One optimizer step over this process's share of the global batch, in micro-batches (--grad-accum).

Losses are sums divided by global counts (masked tokens, pairs), scaled by the world size that DDP's
gradient averaging divides by again: the gradient is exactly that of the global mean. With
--preserve-embeddings, the cosine distance to a frozen starting encoder's sentence vectors joins the loss.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F

from trainer.data.examples import PairBatch
from trainer.data.masking import MaskedBatch
from trainer.forward import first_segments, mean_pooled, vector_inputs
from trainer.options import TrainOptions
from trainer.placement import Placement


_SUMS = ("mlm_loss", "nsp_loss", "mlm_correct", "nsp_correct", "drift")


class StepStats:
    """One step's losses and accuracies, still on the device: `values()` reads them (and waits for the step)."""

    def __init__(self, sums: torch.Tensor, masked: int, pairs: int, preserve_embeddings: float | None):
        self.sums, self.masked, self.pairs, self.preserve_embeddings = sums, masked, pairs, preserve_embeddings

    def values(self) -> dict:
        totals = dict(zip(_SUMS, self.sums.tolist()))
        mlm = totals["mlm_loss"] / max(self.masked, 1)
        nsp = totals["nsp_loss"] / self.pairs
        stats = {"loss": mlm + nsp, "mlm_loss": mlm, "nsp_loss": nsp,
                 "mlm_accuracy": totals["mlm_correct"] / max(self.masked, 1),
                 "nsp_accuracy": totals["nsp_correct"] / self.pairs}
        if self.preserve_embeddings is not None:
            stats["embedding_drift"] = totals["drift"] / self.pairs
            stats["loss"] += self.preserve_embeddings * stats["embedding_drift"]
        return stats


class GradientStep:
    """`step(batch, masked, step_number) -> StepStats`: forward, backward and the optimizer's update.

    `wrapped` is the step module as DDP wraps it (its `no_sync` skips the all-reduce of all but the last
    micro-batch); `forward_model` is what runs forward (the wrapped module, compiled or not). `cuda_graphs`: the
    forward_model replays CUDA graphs (`trainer.forward.compile_forward`), so batches come in fixed slots and each step
    tells it that the last one's outputs may be overwritten."""

    def __init__(self, options: TrainOptions, placement: Placement, wrapped: torch.nn.Module,
                 forward_model: torch.nn.Module, optimizer: torch.optim.Optimizer, encoder_params: list,
                 teacher: torch.nn.Module | None, autocast: torch.dtype | None, sep_id: int, cuda_graphs: bool = False):
        self.options, self.placement = options, placement
        self.wrapped, self.forward_model, self.optimizer = wrapped, forward_model, optimizer
        self.encoder_params, self.teacher, self.autocast, self.sep_id = encoder_params, teacher, autocast, sep_id
        self.cuda_graphs = cuda_graphs

    def __call__(self, batch: PairBatch, masked: MaskedBatch, step_number: int) -> dict:
        options, device, world, rank = self.options, self.placement.device, self.placement.world, self.placement.rank
        per_rank = options.batch_size // world
        micro = per_rank // options.grad_accum
        total_masked = int(masked.positions.sum())  # (the batch is on the host: no wait for the device)
        fixed = masked.slots is not None  # every shape fixed: the width, the slots, the clean segments, the mask
        # Summed on the device: reading a value back each micro-batch made the host wait for the device four
        # times a micro-batch, and the device then idled while the host queued the next work.
        sums = torch.zeros(len(_SUMS), device=device)
        # where each row's labels end in the row-major `labels` (a fixed-shape batch has them in its rows' slots)
        label_offsets = None if fixed else torch.cumsum(masked.positions.sum(dim=1), 0)
        for index in range(options.grad_accum):
            lo = rank * per_rank + index * micro
            hi = lo + micro
            part = batch.slice(lo, hi)
            # non_blocking: the batches come pinned on a GPU (trainer/data/batches.py), so the host need not wait for the
            # device to finish the last step before queueing this one.
            if fixed:
                labels = masked.slot_labels[lo:hi].flatten().to(device, non_blocking=True)
                slots = masked.slots[lo:hi].to(device, non_blocking=True)
            else:
                first_label = int(label_offsets[lo - 1]) if lo > 0 else 0
                labels = masked.labels[first_label : int(label_offsets[hi - 1])].to(device, non_blocking=True)
                slots = None
            positions = masked.positions[lo:hi].to(device, non_blocking=True)
            last = index == options.grad_accum - 1
            inputs = tuple(t.to(device, non_blocking=True) for t in (masked.input_ids[lo:hi], part.token_type_ids,
                                                                     part.attention_mask))
            # read on the host (asked of the device, it waits for it); a fixed-shape step always masks (one graph)
            padded = fixed or not bool(part.attention_mask.all())
            clean = None
            if self.teacher is not None and options.preserve_over == "clean":  # the unmasked ids, first segments
                clean = tuple(t.to(device) for t in first_segments(part.input_ids, part.token_type_ids,
                                                                   part.attention_mask, self.sep_id, fixed_width=fixed))
            nsp_labels = part.nsp_labels.to(device, non_blocking=True)
            if self.cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()  # the last replay's outputs are read: reuse their memory
            with nullcontext() if (last or world == 1) else self.wrapped.no_sync():
                with torch.autocast(device.type, dtype=self.autocast, enabled=self.autocast is not None):
                    mlm_sum, nsp_sum, mlm_correct, nsp_correct, vectors = self.forward_model(
                        *inputs, positions, labels, nsp_labels, clean, padded, slots)
                loss = mlm_sum / total_masked + nsp_sum / options.batch_size
                if self.teacher is not None:
                    drift_sum = self._drift(inputs, positions, clean, vectors).sum()
                    loss = loss + options.preserve_embeddings * drift_sum / options.batch_size
                    sums[4] += drift_sum.detach()
                (loss * world).backward()
            sums[0] += mlm_sum.detach()
            sums[1] += nsp_sum.detach()
            sums[2] += mlm_correct
            sums[3] += nsp_correct
        if step_number < options.freeze_encoder_steps:
            # The fresh heads learn against the encoder as it is: its gradients are dropped, so the optimizer
            # (AdamW skips parameters without one) neither moves nor decays it. DDP-safe: nothing is unhooked.
            for param in self.encoder_params:
                param.grad = None
        if options.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.wrapped.parameters(), options.clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        local_masked = int(masked.positions[rank * per_rank : (rank + 1) * per_rank].sum())
        preserve = self.options.preserve_embeddings if self.teacher is not None else None
        return StepStats(sums, local_masked, per_rank, preserve)

    def _drift(self, inputs: tuple[torch.Tensor, ...], positions: torch.Tensor,
               clean: tuple[torch.Tensor, torch.Tensor] | None, vectors: torch.Tensor) -> torch.Tensor:
        """(B,) cosine distance between the model's mean-pooled vectors and the frozen starting encoder's of
        the same tokens (`vector_inputs`: the masked pairs as trained, or the clean first segments)."""
        ids, types, attention, pooled = vector_inputs(self.options.preserve_over, *inputs, positions, clean)
        with torch.no_grad(), torch.autocast(self.placement.device.type, dtype=self.autocast,
                                             enabled=self.autocast is not None):
            hidden, _ = self.teacher(ids, types, attention)
            reference = mean_pooled(hidden, pooled)
        return 1.0 - F.cosine_similarity(vectors.float(), reference.float(), dim=-1)
