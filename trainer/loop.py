"""The pre-training loop: MLM + NSP, AdamW, warm-up then linear decay, checkpoints, resume, DDP.

`train(options) -> Path` is the whole trainer; the CLI is a thin layer over it.
Single process by default; under `torchrun` it runs DistributedDataParallel (nccl on GPU, gloo on
CPU). Every rank builds the same global batch (pairs and masks come from seeded generators) and
takes its own slice, so N processes compute the same step as one process with the same global batch.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from model.bert import BertForPreTraining, model_flops_per_token
from model.checkpoint import load_checkpoint, save_checkpoint
from model.config import BertConfig
from trainer.data import prepare
from trainer.evaluate import build_eval_set, evaluate
from trainer.examples import PairBatch, build_pairs, collate
from trainer.masking import mask_tokens, replaceable_ids
from trainer.options import TrainOptions
from trainer.plot import plot_metrics
from trainer.state import Progress, clean_partial_saves, newest_good, prune, state_writer

log = logging.getLogger("trainer")
SAVE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# ---- set-up --------------------------------------------------------------------------------------


def _distributed() -> tuple[int, int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend)
    return (dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0"))) if world > 1 else (0, 1, 0)


def _device(choice: str, local_rank: int) -> torch.device:
    if choice == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(choice)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but CUDA is not available")
    return device


def build_optimizer(model: torch.nn.Module, options: TrainOptions, device: torch.device) -> torch.optim.AdamW:
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 or "LayerNorm" in name else decay).append(param)
    groups = [{"params": decay, "weight_decay": options.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=options.lr, betas=(0.9, 0.98), eps=1e-6, fused=device.type == "cuda")


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


# ---- the loop ------------------------------------------------------------------------------------


def train(options: TrainOptions) -> Path:
    rank, world, local_rank = _distributed()
    try:
        return _train(options, rank, world, local_rank)
    finally:
        if world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _train(options: TrainOptions, rank: int, world: int, local_rank: int) -> Path:
    output = options.output
    is_writer = rank == 0
    micro_batches = world * options.grad_accum
    if options.batch_size % micro_batches:
        raise ValueError(f"--batch-size {options.batch_size} must divide into {world} process(es) x "
                         f"--grad-accum {options.grad_accum}")
    if is_writer:
        _check_writable(output)
    device = _device(options.device, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    autocast_dtype = torch.bfloat16 if device.type == "cuda" else None

    resume = newest_good(output) if options.resume else None
    if options.resume:
        if is_writer:
            clean_partial_saves(output)
        if resume is None:
            log.warning("--resume: no usable checkpoint under %s/checkpoints; starting from scratch", output)

    # Rank 0 trains the tokenizer and fills the token cache first; the others then read the cache.
    if is_writer:
        data = prepare(options, tokenizer=resume.checkpoint.tokenizer if resume else None)
    if world > 1:
        dist.barrier()
    if not is_writer:
        data = prepare(options, tokenizer=resume.checkpoint.tokenizer if resume else None)

    torch.manual_seed(options.seed)  # initial weights
    model = _build_model(options, data, resume)
    config = model.config
    model.to(device).train()
    optimizer = build_optimizer(model, options, device)
    progress = Progress()
    if resume is not None:
        optimizer.load_state_dict(resume.optimizer_state)
        progress = resume.progress
        torch.set_rng_state(resume.rng_state)  # the dropout stream continues where it was saved
        log.info("resumed from step %d", progress.step)
    else:
        torch.manual_seed(options.seed * 7919 + rank)  # dropout stream, one per rank

    step_module = _PreTrainingStep(model)
    wrapped = (DistributedDataParallel(step_module, device_ids=[device.index] if device.type == "cuda" else None)
               if world > 1 else step_module)
    # Batch widths and masked-token counts change every step: compile for dynamic shapes, not one graph per shape.
    step_model = torch.compile(wrapped, dynamic=True) if options.compile else wrapped
    eval_set = build_eval_set(data.eval, data.tokenizer, config.vocab_size, options.max_seq_len,
                              options.mask_rate, options.eval_examples) if is_writer else None
    replace = replaceable_ids(data.tokenizer, config.vocab_size)
    flops_per_token = 3 * model_flops_per_token(config, options.max_seq_len, options.mask_rate)

    metrics_path = output / "metrics.jsonl"
    history: list[dict] = _read_history(metrics_path) if (resume is not None and is_writer) else []
    if is_writer and resume is None:
        output.mkdir(parents=True, exist_ok=True)
        metrics_path.unlink(missing_ok=True)

    def save_resumable() -> None:
        if is_writer:
            target = output / "checkpoints" / f"step-{progress.step:07d}"
            save_checkpoint(target, model, data.tokenizer, metadata=_metadata(options, data, progress, history, device),
                            write_extra=state_writer(optimizer, progress))
            prune(output, options.keep_checkpoints)
        if world > 1:
            dist.barrier()

    def log_row(row: dict) -> None:
        history.append(row)
        with open(metrics_path, "a") as handle:
            handle.write(json.dumps(row) + "\n")

    stop_signal: list[int] = []
    previous_handlers = {s: signal.signal(s, lambda signum, _frame: stop_signal.append(signum))
                         for s in (signal.SIGINT, signal.SIGTERM)}
    bar = _progress_bar(options, progress, enabled=is_writer and options.progress)
    examples = epoch_examples(data, options, progress.epoch)
    window_tokens, window_start = 0, time.perf_counter()
    last_eval: dict | None = None
    try:
        while run_progress(progress, options) < 1.0:
            step_start = time.perf_counter()
            start = progress.batch_in_epoch * options.batch_size
            if start + options.batch_size > len(examples):
                progress.epoch += 1
                progress.batch_in_epoch = 0
                examples = epoch_examples(data, options, progress.epoch)
                continue
            batch = collate(examples[start : start + options.batch_size], data.tokenizer)
            generator = torch.Generator().manual_seed(options.seed * 1_000_003 + progress.step)
            masked = mask_tokens(batch.input_ids, batch.special_mask, generator, data.tokenizer.mask_id, replace,
                                 options.mask_rate)
            factor = lr_factor(run_progress(progress, options), options.warmup_fraction)
            for group in optimizer.param_groups:
                group["lr"] = options.lr * factor
            stats = _step(step_model, wrapped, optimizer, batch, masked, options, rank, world, device, autocast_dtype)
            progress.step += 1
            progress.batch_in_epoch += 1
            progress.tokens_seen += batch.num_real_tokens
            window_tokens += batch.num_real_tokens
            progress.elapsed_s += time.perf_counter() - step_start

            if is_writer and (progress.step % options.log_every == 0):
                seconds = time.perf_counter() - window_start
                tokens_per_s = window_tokens / max(seconds, 1e-9)
                row = {"step": progress.step, "epoch": progress.epoch, "lr": options.lr * factor,
                       "tokens_per_s": tokens_per_s, "elapsed_s": round(progress.elapsed_s, 2), **stats}
                if device.type == "cuda":
                    row["model_tflops"] = tokens_per_s * flops_per_token / 1e12
                log_row(row)
                window_tokens, window_start = 0, time.perf_counter()
                bar.set_postfix(loss=f"{stats['loss']:.3f}", tok_s=f"{tokens_per_s:,.0f}",
                                eta=_eta(progress, options))
            bar.update(1)
            done = run_progress(progress, options) >= 1.0
            if is_writer and (progress.step % options.eval_every == 0 or done):
                last_eval = evaluate(model, eval_set, device, autocast_dtype)
                log_row({"step": progress.step, "eval": last_eval})
            if progress.step % options.save_every == 0 and not done:
                save_resumable()
            if stop_signal:
                raise Interrupted(stop_signal[0])
    except Interrupted as interrupt:
        bar.close()
        save_resumable()
        log.warning("stopped by %s at step %d; checkpoint saved, continue with --resume", interrupt, progress.step)
        raise
    finally:
        for s, handler in previous_handlers.items():
            signal.signal(s, handler)
        bar.close()

    save_resumable()
    if is_writer:
        if last_eval is None:
            last_eval = evaluate(model, eval_set, device, autocast_dtype)
        plot_metrics(history, output / "training_curves.png")
        metadata = _metadata(options, data, progress, history, device, final_eval=last_eval)
        save_checkpoint(output, model, data.tokenizer, metadata=metadata, dtype=SAVE_DTYPES[options.save_dtype],
                        write_extra=_keep_run_files(output))
        log.info("final eval: %s", json.dumps(last_eval))
    if world > 1:
        dist.barrier()
    return output


class _PreTrainingStep(torch.nn.Module):
    """DDP and torch.compile wrap a module's `forward`; this one's is the model's `pretraining_logits`."""

    def __init__(self, model: BertForPreTraining):
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids, attention_mask, mlm_positions):
        return self.model.pretraining_logits(input_ids, token_type_ids, attention_mask, mlm_positions)


def _build_model(options: TrainOptions, data, resume) -> BertForPreTraining:
    """The resumed model, the --init-from one, or a new model of the preset sized to the tokenizer."""
    if resume is not None:
        return resume.checkpoint.model
    if options.init_from is not None:
        model = load_checkpoint(options.init_from).model
        if not (model.has_mlm_head and model.has_nsp_head):
            raise ValueError(f"--init-from {options.init_from}: the checkpoint lacks the MLM or NSP head")
        return model
    overrides = {"vocab_size": data.tokenizer.vocab_size, "max_position_embeddings": max(512, options.max_seq_len),
                 "pad_token_id": data.tokenizer.pad_id}
    if options.dropout is not None:
        overrides.update(hidden_dropout_prob=options.dropout, attention_probs_dropout_prob=options.dropout)
    return BertForPreTraining(BertConfig.preset(options.preset, **overrides))


def _step(step_model, wrapped, optimizer, batch: PairBatch, masked, options: TrainOptions, rank: int, world: int,
          device: torch.device, autocast_dtype) -> dict:
    """One optimizer step over this rank's share of the global batch, in micro-batches.

    Losses are sums divided by global counts (masked tokens, pairs), scaled by the world size that
    DDP's gradient averaging divides by again: the gradient is exactly that of the global mean.
    """
    per_rank = options.batch_size // world
    micro = per_rank // options.grad_accum
    total_masked = int(masked.positions.sum())
    totals = {"mlm_loss": 0.0, "nsp_loss": 0.0, "mlm_correct": 0, "nsp_correct": 0}
    label_offsets = torch.cumsum(masked.positions.sum(dim=1), 0)
    for index in range(options.grad_accum):
        lo = rank * per_rank + index * micro
        hi = lo + micro
        first_label = int(label_offsets[lo - 1]) if lo > 0 else 0
        labels = masked.labels[first_label : int(label_offsets[hi - 1])].to(device)
        part = batch.slice(lo, hi)
        positions = masked.positions[lo:hi].to(device)
        sync = nullcontext() if (index == options.grad_accum - 1 or world == 1) else wrapped.no_sync()
        with sync:
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                mlm_logits, nsp_logits = step_model(masked.input_ids[lo:hi].to(device), part.token_type_ids.to(device),
                                                    part.attention_mask.to(device), positions)
            mlm_logits, nsp_logits = mlm_logits.float(), nsp_logits.float()
            nsp_labels = part.nsp_labels.to(device)
            mlm_sum = F.cross_entropy(mlm_logits, labels, reduction="sum")
            nsp_sum = F.cross_entropy(nsp_logits, nsp_labels, reduction="sum")
            loss = (mlm_sum / total_masked + nsp_sum / options.batch_size) * world
            loss.backward()
        totals["mlm_loss"] += mlm_sum.item()
        totals["nsp_loss"] += nsp_sum.item()
        totals["mlm_correct"] += int((mlm_logits.argmax(-1) == labels).sum())
        totals["nsp_correct"] += int((nsp_logits.argmax(-1) == nsp_labels).sum())
    if options.clip_norm > 0:
        torch.nn.utils.clip_grad_norm_(wrapped.parameters(), options.clip_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    local_masked = int(masked.positions[rank * per_rank : (rank + 1) * per_rank].sum())
    mlm = totals["mlm_loss"] / max(local_masked, 1)
    nsp = totals["nsp_loss"] / per_rank
    return {"loss": mlm + nsp, "mlm_loss": mlm, "nsp_loss": nsp,
            "mlm_accuracy": totals["mlm_correct"] / max(local_masked, 1), "nsp_accuracy": totals["nsp_correct"] / per_rank}


def epoch_examples(data, options: TrainOptions, epoch: int) -> list:
    """Pairs are re-drawn every epoch (new A/B cuts and random partners), then shuffled."""
    examples = build_pairs(data.train, options.max_seq_len, seed=options.seed * 1000 + epoch,
                           short_seq_prob=options.short_seq_prob)
    random.Random(options.seed * 1000 + epoch).shuffle(examples)
    if len(examples) < options.batch_size:
        raise ValueError(f"the training corpus yields {len(examples)} pairs per epoch, fewer than --batch-size "
                         f"{options.batch_size}; use a smaller batch or more text")
    return examples


def _check_writable(output: Path) -> None:
    try:
        output.mkdir(parents=True, exist_ok=True)
        probe = output / f".write-test-{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise OSError(exc.errno, f"output directory {output} is not writable: {exc.strerror}") from None


def _keep_run_files(output: Path):
    """Carry the run's files into the final checkpoint directory by hard link (no copy, and the
    old directory stays intact until the atomic swap)."""

    def link(tmp: Path) -> None:
        for name in ("metrics.jsonl", "training_curves.png", "checkpoints"):
            source = output / name
            if source.is_dir():
                shutil.copytree(source, tmp / name, copy_function=_link_or_copy)
            elif source.is_file():
                _link_or_copy(source, tmp / name)

    return link


def _link_or_copy(src, dst) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _read_history(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line cut by a crash ends the usable history
    return rows


def _metadata(options: TrainOptions, data, progress: Progress, history: list[dict], device: torch.device,
              final_eval: dict | None = None) -> dict:
    speeds = [r["tokens_per_s"] for r in history if "tokens_per_s" in r]
    return {
        "format": "bert-serve/1",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, "-m", "trainer", *sys.argv[1:]]),
        "options": options.to_json(),
        "data": data.description,
        "progress": asdict(progress),
        "train_tokens_per_s": sum(speeds) / len(speeds) if speeds else None,
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        "torch_version": torch.__version__,
        "eval": final_eval,
    }


class _NoBar:
    def update(self, _n: int) -> None: ...
    def set_postfix(self, **_kw) -> None: ...
    def close(self) -> None: ...


def _progress_bar(options: TrainOptions, progress: Progress, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=options.max_steps, initial=progress.step, unit="step", dynamic_ncols=True, file=sys.stderr)


def _eta(progress: Progress, options: TrainOptions) -> str:
    fraction = run_progress(progress, options)
    if fraction <= 0:
        return "?"
    remaining = progress.elapsed_s * (1 - fraction) / fraction
    return time.strftime("%H:%M:%S", time.gmtime(max(0.0, remaining)))


__all__ = ["Interrupted", "build_optimizer", "epoch_examples", "lr_factor", "run_progress", "train"]
