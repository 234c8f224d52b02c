"""Resumable training state: what a checkpoint needs beyond the model, and finding the newest good one.

Written inside each checkpoint directory (atomically, with it):
  training_state.safetensors  optimizer moments and the torch RNG state
  training_state.json         step, data position, elapsed time, optimizer hyper-parameters
  checksums.json              sha256 of every file, so a damaged checkpoint is detected, not loaded
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from model.checkpoint import Checkpoint, CheckpointError, load_checkpoint

STATE_TENSORS = "training_state.safetensors"
STATE_JSON = "training_state.json"
CHECKSUMS = "checksums.json"
log = logging.getLogger("trainer")


@dataclass
class Progress:
    step: int = 0  # optimizer steps done
    cursors: list[list[int]] = field(default_factory=list)  # per training source: [passes done, chunks taken]
    elapsed_s: float = 0.0  # training wall-clock so far (drives a time-budget schedule)
    tokens_seen: int = 0


def state_writer(optimizer: torch.optim.Optimizer, progress: Progress):
    """A `write_extra` callback for `save_checkpoint`."""

    def write(directory: Path) -> None:
        state = optimizer.state_dict()
        tensors = {"rng.torch": torch.get_rng_state()}
        for index, values in state["state"].items():
            for key, value in values.items():
                tensors[f"optimizer.{index}.{key}"] = value.detach().cpu().contiguous()
        save_file(tensors, str(directory / STATE_TENSORS))
        groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in state["param_groups"]]
        (directory / STATE_JSON).write_text(json.dumps({"progress": asdict(progress), "param_groups": groups}, indent=1))
        sums = {p.name: _sha256(p) for p in sorted(directory.iterdir()) if p.is_file()}
        (directory / CHECKSUMS).write_text(json.dumps(sums, indent=1))

    return write


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify(directory: Path) -> None:
    path = directory / CHECKSUMS
    try:
        sums = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: unreadable ({exc})") from None
    for name, expected in sums.items():
        file = directory / name
        if not file.is_file():
            raise CheckpointError(f"{file}: missing")
        if _sha256(file) != expected:
            raise CheckpointError(f"{file}: checksum mismatch (damaged)")


@dataclass
class ResumePoint:
    checkpoint: Checkpoint
    progress: Progress
    optimizer_state: dict
    rng_state: torch.Tensor


def load_resume_point(directory: Path) -> ResumePoint:
    verify(directory)
    checkpoint = load_checkpoint(directory)
    try:
        tensors = load_file(str(directory / STATE_TENSORS))
        saved = json.loads((directory / STATE_JSON).read_text())
        progress = Progress(**saved["progress"])
    except (SafetensorError, OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{directory}: training state unreadable ({exc})") from None
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        if name.startswith("optimizer."):
            _, index, key = name.split(".", 2)
            state.setdefault(int(index), {})[key] = tensor
    groups = [{k: (tuple(v) if k == "betas" else v) for k, v in g.items()} for g in saved["param_groups"]]
    return ResumePoint(checkpoint, progress, {"state": state, "param_groups": groups}, tensors["rng.torch"])


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """Complete checkpoints, newest first (temporaries of an interrupted save are not listed)."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-")]
    return sorted(found, key=lambda p: int(p.name.removeprefix("step-")), reverse=True)


def newest_good(run_dir: Path) -> ResumePoint | None:
    for directory in checkpoint_dirs(run_dir):
        try:
            return load_resume_point(directory)
        except CheckpointError as exc:
            log.warning("skipping damaged checkpoint %s: %s", directory, exc)
    return None


def clean_partial_saves(run_dir: Path) -> None:
    root = run_dir / "checkpoints"
    if root.is_dir():
        for leftover in root.glob(".step-*"):
            shutil.rmtree(leftover, ignore_errors=True)


def prune(run_dir: Path, keep: int) -> None:
    for old in checkpoint_dirs(run_dir)[keep:]:
        shutil.rmtree(old, ignore_errors=True)
