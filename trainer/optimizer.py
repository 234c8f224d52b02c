"""The optimizer and its schedule: AdamW's parameter groups, restoring them on --resume without losing
this invocation's flags, and the learning rate at each point of the run (warm-up, then linear decay)."""

from __future__ import annotations

import logging

import torch

from trainer.options import TrainOptions
from trainer.state import Progress
from trainer.warm_start import embedding_parameter

log = logging.getLogger("trainer")


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
    """How much of the run is done, 0 to 1: of --max-steps or of --time-budget, whichever is further."""
    parts = []
    if options.max_steps is not None:
        parts.append(progress.step / options.max_steps)
    if options.time_budget is not None:
        parts.append(progress.elapsed_s / (options.time_budget * 60))
    return max(parts)


def set_learning_rate(optimizer: torch.optim.AdamW, options: TrainOptions, factor: float) -> None:
    """The schedule's rate for the next step, scaled in each group by its `lr_scale`."""
    for group in optimizer.param_groups:
        group["lr"] = options.lr * factor * group.get("lr_scale", 1.0)
