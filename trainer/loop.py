"""The pre-training loop: MLM + NSP, AdamW, warm-up then linear decay, checkpoints, resume, DDP.

`train(options) -> Path` is the whole trainer; the CLI is a thin layer over it.
Single process by default; under `torchrun` it runs DistributedDataParallel (nccl on GPU, gloo on
CPU). Every rank builds the same global batch (pairs and masks come from seeded generators) and
takes its own slice, so N processes compute the same step as one process with the same global batch.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from model.bert import BertForPreTraining
from model.config import BertConfig
from model.device import fast_half_dtype, keep_freed_memory, pick_device
from model.flops import model_flops_per_token
from trainer.data import PreparedData, prepare
from trainer.evaluate import build_eval_set, evaluate
from trainer.examples import PairBatch, TrainingPairs, collate
from trainer.masking import MaskedBatch, mask_tokens, replaceable_ids
from trainer.options import TrainOptions
from trainer.retention import build_probe
from trainer.run_files import RunFiles, command_history, earlier_stage
from trainer.state import Progress, clean_partial_saves, newest_good
from trainer.step import PreTrainingStep, first_segments, mean_pooled, vector_inputs
from trainer.warm_start import WarmStart, embedding_parameter, frozen_encoder, load_warm_start

log = logging.getLogger("trainer")


class Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# ---- set-up --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Where this process runs: its rank among `world` processes and its device."""

    rank: int
    world: int
    device: torch.device

    @property
    def is_writer(self) -> bool:
        return self.rank == 0


def _placement(options: TrainOptions) -> Placement:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    rank, local_rank = (dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0"))) if world > 1 else (0, 0)
    return Placement(rank, world, pick_device(options.device, local_rank))


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast type of a training step (None: plain float32)."""
    if precision == "float32":
        return None
    if precision == "bfloat16":
        if device.type == "cpu" and fast_half_dtype(device) is None:
            log.warning("--precision bfloat16: this CPU has no native bfloat16 (AVX512-BF16/AMX); it will be slow")
        return torch.bfloat16
    return fast_half_dtype(device) if device.type == "cpu" else torch.bfloat16


def build_optimizer(model: torch.nn.Module, options: TrainOptions, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only; with --encoder-lr-scale, the encoder and embeddings (the word
    embeddings are the tied MLM decoder too) in groups of their own whose `lr_scale` the schedule applies."""
    groups: dict[tuple[bool, float], list] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        scale = options.encoder_lr_scale if embedding_parameter(name, model.config) else 1.0
        groups.setdefault((param.ndim < 2 or "LayerNorm" in name, scale), []).append(param)
    param_groups = [{"params": params, "weight_decay": 0.0 if no_decay else options.weight_decay, "lr_scale": scale}
                    for (no_decay, scale), params in sorted(groups.items(), key=lambda kv: (kv[0][1] != 1.0, kv[0][0]))]
    return torch.optim.AdamW(param_groups, lr=options.lr, betas=(0.9, 0.98), eps=1e-6, fused=device.type == "cuda")


def restore_optimizer(optimizer: torch.optim.AdamW, state: dict, options: TrainOptions) -> None:
    """Load a saved optimizer's moments into `optimizer`, keeping every group setting this invocation built
    (--encoder-lr-scale's lr_scale, --weight-decay, ...): load_state_dict alone would bring back the saved ones and
    silently ignore the flags, while --lr is honoured; a resumed run may change its rates, as a staged recipe does."""
    chosen = [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]
    saved_scales = sorted({group.get("lr_scale", 1.0) for group in state["param_groups"]})
    try:
        optimizer.load_state_dict(state)
    except ValueError:  # another group layout: an encoder scale of 1 puts the encoder in the heads' groups
        raise ValueError(f"--resume: the run's optimizer was saved with encoder learning-rate scale(s) {saved_scales}, "
                         f"which group the parameters differently from --encoder-lr-scale {options.encoder_lr_scale}; "
                         "resume with a scale on the same side of 1, or start a new --output") from None
    for group, settings in zip(optimizer.param_groups, chosen):
        changed = {key: f"{value} (saved {group.get(key)})" for key, value in settings.items()
                   if key != "lr" and group.get(key) != value}  # the schedule sets lr at every step
        if changed:
            log.info("resumed with %s for %d tensors", ", ".join(f"{k} {v}" for k, v in changed.items()),
                     len(group["params"]))
        group.update(settings)


def lr_factor(progress: float, warmup: float) -> float:
    """Linear warm-up to the peak over `warmup` of the run, then linear decay to 0."""
    if progress < warmup:
        return max(progress / warmup, 1e-3)
    return max(0.0, (1.0 - progress) / max(1e-9, 1.0 - warmup))


def run_progress(progress: Progress, options: TrainOptions) -> float:
    parts = []
    if options.max_steps is not None:
        parts.append(progress.step / options.max_steps)
    if options.time_budget is not None:
        parts.append(progress.elapsed_s / (options.time_budget * 60))
    return max(parts)


def training_batch(pairs: TrainingPairs, progress: Progress, options: TrainOptions, data: PreparedData,
                   replace: torch.Tensor) -> tuple[PairBatch, MaskedBatch]:
    """Step `progress.step`'s pairs and masks (advancing the data cursors): the same on every rank,
    and the same again after a resume."""
    batch = collate(pairs.batch(progress.step, options.batch_size, progress.cursors), data.tokenizer)
    generator = torch.Generator().manual_seed(options.seed * 1_000_003 + progress.step)
    masked = mask_tokens(batch.input_ids, batch.special_mask, generator, data.tokenizer.mask_id, replace,
                         options.mask_rate)
    return batch, masked


# ---- the loop ------------------------------------------------------------------------------------


def train(options: TrainOptions, command: str | None = None) -> Path:
    """`command`: the command line as the user gave it, for the metadata and the model card (default: this
    process's own arguments)."""
    placement = _placement(options)
    if placement.device.type == "cpu":
        keep_freed_memory()  # every op's output would otherwise cost page faults (model/device.py)
    try:
        return Training(options, placement, command).run()
    finally:
        if placement.world > 1 and dist.is_initialized():
            dist.destroy_process_group()


class Training:
    """One training run: set up in the constructor, `run()` trains and writes the final checkpoint."""

    def __init__(self, options: TrainOptions, placement: Placement, command: str | None = None):
        self.options = options
        self.placement = placement
        if options.batch_size % (placement.world * options.grad_accum):
            raise ValueError(f"--batch-size {options.batch_size} must divide into {placement.world} process(es) x "
                             f"--grad-accum {options.grad_accum}")
        device = placement.device
        if device.type == "cuda":
            torch.cuda.set_device(device)
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self.autocast = autocast_dtype(options.precision, device)
        resume = newest_good(options.output) if options.resume else None
        # The starting checkpoint is checked before anything is prepared or written (a bad one fails here).
        torch.manual_seed(options.seed)  # initial weights of the heads a warm start lacks
        warm = load_warm_start(options.init_from, options.dropout, options.head_layers,
                               options.head_layers_start) \
            if options.init_from is not None and resume is None else None
        self.teacher = frozen_encoder(options.init_from, device) if options.preserve_embeddings > 0 else None
        self.files = RunFiles(options.output, is_writer=placement.is_writer, command=command)
        if options.resume:
            if placement.is_writer:
                clean_partial_saves(options.output)
            if resume is None:
                log.warning("--resume: no usable checkpoint under %s/checkpoints; starting a new run (%s)", options.output,
                            f"from {options.init_from}" if options.init_from is not None else "from scratch")
        self.data = self._prepare(resume.checkpoint.tokenizer if resume else warm.tokenizer if warm else None)

        torch.manual_seed(options.seed)  # initial weights
        self.model = self._build_model(resume, warm).to(device).train()
        # embeddings + encoder layers up to the embedding layer (the word embeddings are also the tied MLM decoder)
        self.encoder_params = [param for name, param in self.model.named_parameters()
                               if embedding_parameter(name, self.model.config)]
        if self.model.config.embedding_layer is not None:
            # Layers stacked for the heads (--head-layers): what makes the served embeddings is never trained.
            for param in self.encoder_params:
                param.requires_grad_(False)
        self.optimizer = build_optimizer(self.model, options, device)
        self.pairs = TrainingPairs(self.data.train, options.max_seq_len, options.seed, options.short_seq_prob,
                                   self.data.weights)
        self.progress = Progress(cursors=self.pairs.initial_cursors())
        if resume is not None:
            restore_optimizer(self.optimizer, resume.optimizer_state, options)
            self.progress = resume.progress
            torch.set_rng_state(resume.rng_state)  # the dropout stream continues where it was saved
            log.info("resumed from step %d", self.progress.step)
        else:
            torch.manual_seed(options.seed * 7919 + placement.rank)  # dropout stream, one per rank
        # What this run continues: read once (the --init-from directory may be gone by the next save).
        if resume is not None:
            started_from = resume.checkpoint.metadata.get("started_from")
            warm_source = resume.checkpoint.metadata.get("warm_start")
            earlier_commands = command_history(resume.checkpoint.metadata)
        else:
            earlier_commands = None
            started_from = earlier_stage(options.init_from) if options.init_from is not None else None
            warm_source = warm.source if warm is not None and started_from is None else None
        self.files.start(resumed=resume is not None, started_from=started_from, warm_start=warm_source,
                         earlier_commands=earlier_commands, at_step=self.progress.step)

        self.step_module = PreTrainingStep(self.model, options.preserve_over if self.teacher is not None else None)
        self.wrapped = (DistributedDataParallel(self.step_module, device_ids=[device.index] if device.type == "cuda" else None)
                        if placement.world > 1 else self.step_module)
        # Batch widths and masked-token counts change every step: compile for dynamic shapes, not one graph per shape.
        self.step_model = torch.compile(self.wrapped, dynamic=True) if options.compile else self.wrapped
        config = self.model.config
        self.eval_set = build_eval_set(self.data.eval, self.data.tokenizer, config.vocab_size,
                                       options.max_seq_len, options.eval_examples) if placement.is_writer else None
        if self.eval_set is not None and options.init_from is not None and \
                (self.teacher is not None or options.init_from.is_dir()):
            # How far the served sentence embeddings move from the starting encoder's, at every evaluation.
            reference = self.teacher if self.teacher is not None else frozen_encoder(options.init_from, device)
            self.eval_set.retention = build_probe(self.data.eval, self.data.tokenizer, reference, device)
        self.replace = replaceable_ids(self.data.tokenizer, config.vocab_size)
        self.flops_per_token = 3 * model_flops_per_token(config, options.max_seq_len, options.mask_rate)

    def _prepare(self, tokenizer) -> PreparedData:
        # Rank 0 trains the tokenizer and fills the caches first; the others then read them.
        if self.placement.is_writer:
            data = prepare(self.options, tokenizer=tokenizer)
        if self.placement.world > 1:
            dist.barrier()
        if not self.placement.is_writer:
            data = prepare(self.options, tokenizer=tokenizer)
        return data

    def _build_model(self, resume, warm: WarmStart | None) -> BertForPreTraining:
        """The resumed model, the --init-from one, or a new model of the preset sized to the tokenizer."""
        options = self.options
        if resume is not None:
            return resume.checkpoint.model
        if warm is not None:
            return warm.model
        tokenizer = self.data.tokenizer
        overrides = {"vocab_size": tokenizer.vocab_size, "max_position_embeddings": max(512, options.max_seq_len),
                     "pad_token_id": tokenizer.pad_id}
        if options.dropout is not None:
            overrides.update(hidden_dropout_prob=options.dropout, attention_probs_dropout_prob=options.dropout)
        return BertForPreTraining(BertConfig.preset(options.preset, **overrides))

    def run(self) -> Path:
        options, progress = self.options, self.progress
        stop_signal: list[int] = []
        previous_handlers = {s: signal.signal(s, lambda signum, _frame: stop_signal.append(signum))
                             for s in (signal.SIGINT, signal.SIGTERM)}
        bar = self.files.progress_bar(options, progress, enabled=options.progress)
        window_tokens, window_start = 0, time.perf_counter()
        last_eval: dict | None = None
        try:
            while run_progress(progress, options) < 1.0:
                step_start = time.perf_counter()
                batch, masked = training_batch(self.pairs, progress, options, self.data, self.replace)
                factor = lr_factor(run_progress(progress, options), options.warmup_fraction)
                for group in self.optimizer.param_groups:
                    group["lr"] = options.lr * factor * group.get("lr_scale", 1.0)
                stats = self._step(batch, masked)
                progress.step += 1
                progress.tokens_seen += batch.num_real_tokens
                window_tokens += batch.num_real_tokens
                progress.elapsed_s += time.perf_counter() - step_start

                if progress.step % options.log_every == 0:
                    tokens_per_s = window_tokens / max(time.perf_counter() - window_start, 1e-9)
                    row = {"step": progress.step, "passes": round(progress.tokens_seen / self.pairs.total_tokens, 4),
                           "lr": options.lr * factor, "tokens_per_s": tokens_per_s,
                           "elapsed_s": round(progress.elapsed_s, 2), **stats}
                    if self.placement.device.type == "cuda":
                        row["model_tflops"] = tokens_per_s * self.flops_per_token / 1e12
                    self.files.log(row)
                    window_tokens, window_start = 0, time.perf_counter()
                    bar.set_postfix(loss=f"{stats['loss']:.3f}", tok_s=f"{tokens_per_s:,.0f}",
                                    eta=self.files.eta(progress, run_progress(progress, options)))
                bar.update(1)
                done = run_progress(progress, options) >= 1.0
                if self.placement.is_writer and (progress.step % options.eval_every == 0 or done):
                    last_eval = evaluate(self.model, self.eval_set, self.placement.device)
                    self.files.log({"step": progress.step, "eval": last_eval})
                if progress.step % options.save_every == 0 and not done:
                    self._save_resumable()
                if stop_signal:
                    raise Interrupted(stop_signal[0])
        except Interrupted as interrupt:
            bar.close()
            self._save_resumable()
            log.warning("stopped by %s at step %d; checkpoint saved, continue with --resume", interrupt, progress.step)
            raise
        finally:
            for s, handler in previous_handlers.items():
                signal.signal(s, handler)
            bar.close()

        self._save_resumable()
        if self.placement.is_writer:
            if last_eval is None:
                last_eval = evaluate(self.model, self.eval_set, self.placement.device)
            self.files.finish(self.model, self.data, options, progress, self.placement.device, last_eval)
        if self.placement.world > 1:
            dist.barrier()
        return options.output

    def _save_resumable(self) -> None:
        if self.placement.is_writer:
            self.files.save_resumable(self.model, self.optimizer, self.data, self.options, self.progress,
                                      self.placement.device)
        if self.placement.world > 1:
            dist.barrier()

    def _step(self, batch: PairBatch, masked: MaskedBatch) -> dict:
        """One optimizer step over this rank's share of the global batch, in micro-batches.

        Losses are sums divided by global counts (masked tokens, pairs), scaled by the world size that
        DDP's gradient averaging divides by again: the gradient is exactly that of the global mean.
        """
        options, device, world, rank = self.options, self.placement.device, self.placement.world, self.placement.rank
        per_rank = options.batch_size // world
        micro = per_rank // options.grad_accum
        total_masked = int(masked.positions.sum())
        totals = {"mlm_loss": 0.0, "nsp_loss": 0.0, "mlm_correct": 0, "nsp_correct": 0, "drift": 0.0}
        label_offsets = torch.cumsum(masked.positions.sum(dim=1), 0)
        for index in range(options.grad_accum):
            lo = rank * per_rank + index * micro
            hi = lo + micro
            first_label = int(label_offsets[lo - 1]) if lo > 0 else 0
            labels = masked.labels[first_label : int(label_offsets[hi - 1])].to(device)
            part = batch.slice(lo, hi)
            positions = masked.positions[lo:hi].to(device)
            last = index == options.grad_accum - 1
            inputs = (masked.input_ids[lo:hi].to(device), part.token_type_ids.to(device), part.attention_mask.to(device))
            clean = None
            if self.teacher is not None and options.preserve_over == "clean":  # the unmasked ids, first segments
                clean = tuple(t.to(device) for t in first_segments(part.input_ids, part.token_type_ids,
                                                                   part.attention_mask, self.data.tokenizer.sep_id))
            with nullcontext() if (last or world == 1) else self.wrapped.no_sync():
                with torch.autocast(device.type, dtype=self.autocast, enabled=self.autocast is not None):
                    mlm_logits, nsp_logits, vectors = self.step_model(*inputs, positions, clean)
                mlm_logits, nsp_logits = mlm_logits.float(), nsp_logits.float()  # losses in float32
                nsp_labels = part.nsp_labels.to(device)
                mlm_sum = F.cross_entropy(mlm_logits, labels, reduction="sum")
                nsp_sum = F.cross_entropy(nsp_logits, nsp_labels, reduction="sum")
                loss = mlm_sum / total_masked + nsp_sum / options.batch_size
                if self.teacher is not None:
                    drift_sum = self._drift(inputs, positions, clean, vectors).sum()
                    loss = loss + options.preserve_embeddings * drift_sum / options.batch_size
                    totals["drift"] += drift_sum.item()
                (loss * world).backward()
            totals["mlm_loss"] += mlm_sum.item()
            totals["nsp_loss"] += nsp_sum.item()
            totals["mlm_correct"] += int((mlm_logits.argmax(-1) == labels).sum())
            totals["nsp_correct"] += int((nsp_logits.argmax(-1) == nsp_labels).sum())
        if self.progress.step < options.freeze_encoder_steps:
            # The fresh heads learn against the encoder as it is: its gradients are dropped, so the optimizer
            # (AdamW skips parameters without one) neither moves nor decays it. DDP-safe: nothing is unhooked.
            for param in self.encoder_params:
                param.grad = None
        if options.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.wrapped.parameters(), options.clip_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        local_masked = int(masked.positions[rank * per_rank : (rank + 1) * per_rank].sum())
        mlm = totals["mlm_loss"] / max(local_masked, 1)
        nsp = totals["nsp_loss"] / per_rank
        stats = {"loss": mlm + nsp, "mlm_loss": mlm, "nsp_loss": nsp,
                 "mlm_accuracy": totals["mlm_correct"] / max(local_masked, 1),
                 "nsp_accuracy": totals["nsp_correct"] / per_rank}
        if self.teacher is not None:
            stats["embedding_drift"] = totals["drift"] / per_rank
            stats["loss"] += self.options.preserve_embeddings * stats["embedding_drift"]
        return stats

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


__all__ = ["Interrupted", "Training", "autocast_dtype", "build_optimizer", "lr_factor", "run_progress",
           "train", "training_batch"]
