"""What a run writes into its output directory: metrics.jsonl, resumable checkpoints, the curves, and
at the end the servable checkpoint itself. Only the writer rank (rank 0) writes."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import torch

from model.checkpoint import read_metadata, save_checkpoint
from model.provenance import portable, portable_text
from trainer.plot import plot_metrics
from trainer.state import Progress, prune, state_writer

SAVE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def earlier_stage(init_from: Path) -> dict | None:
    """What an --init-from run continues: the earlier run's command, options, progress and evaluation
    (and, nested, whatever that one continued), so that a model card can tell the whole training."""
    earlier = read_metadata(Path(init_from))
    return {key: earlier.get(key) for key in ("command", "commands", "options", "progress", "device", "eval", "started_from",
                                              "warm_start")} \
        if earlier else None


def command_line(argv: list[str] | None = None) -> str:
    """The trainer's command as recorded in the metadata: `argv` as main() was given it, else this process's."""
    return shlex.join(["python", "-m", "trainer", *(sys.argv[1:] if argv is None else map(str, argv))])


def command_history(metadata: dict) -> list[dict]:
    """The commands that trained a run, each with the step it took over at (metadata written before the history
    was kept has only its latest command)."""
    return metadata.get("commands") or [{"from_step": 0, "command": metadata.get("command", "?")}]


class RunFiles:
    def __init__(self, output: Path, is_writer: bool, command: str | None = None):
        self.output = output
        self.command = portable_text(command or command_line())  # the paths in it as a reader elsewhere can take them
        self.is_writer = is_writer
        self.metrics_path = output / "metrics.jsonl"
        self.history: list[dict] = []
        self.started_from: dict | None = None  # see earlier_stage; set by start()
        self.warm_start: dict | None = None  # a foreign starting checkpoint (trainer.warm_start.describe_source)
        self.compiled_step: dict | None = None  # --compile, CUDA graphs, and why the step fell back to eager (if it did)
        if is_writer:
            _check_writable(output)

    def start(self, resumed: bool, started_from: dict | None = None, warm_start: dict | None = None,
              earlier_commands: list[dict] | None = None, at_step: int = 0) -> None:
        """A resumed run continues its metrics; a new one starts them afresh. `started_from`: what the
        run continues (earlier_stage), `warm_start`: the checkpoint it started from when we did not
        train that one; both recorded in every checkpoint's metadata. `earlier_commands`: a resumed run's
        command history, which gains this command if it differs (a run resumed with other rates says so)."""
        self.started_from = started_from
        self.warm_start = warm_start
        self.commands = list(earlier_commands or [])
        if not self.commands or self.commands[-1]["command"] != self.command:
            self.commands.append({"from_step": at_step, "command": self.command})
        if not self.is_writer:
            return
        if resumed:
            self.history = _read_history(self.metrics_path)
        else:
            self.output.mkdir(parents=True, exist_ok=True)
            self.metrics_path.unlink(missing_ok=True)

    def log(self, row: dict) -> None:
        if not self.is_writer:
            return
        self.history.append(row)
        with open(self.metrics_path, "a") as handle:
            handle.write(json.dumps(row) + "\n")

    def metadata(self, options, data, progress: Progress, device: torch.device, final_eval: dict | None = None) -> dict:
        """What training_metadata.json records: no absolute path of this machine (model.provenance)."""
        speeds = [r["tokens_per_s"] for r in self.history if "tokens_per_s" in r]
        return portable({
            "format": "bert-serve/1",
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": self.command,
            "commands": self.commands,  # every command that trained this run, with the step it took over at
            "options": options.to_json(),
            "data": data.description,
            "progress": asdict(progress),
            "train_tokens_per_s": sum(speeds) / len(speeds) if speeds else None,
            "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
            "torch_version": torch.__version__,
            "eval": final_eval,
            "started_from": self.started_from,
            "warm_start": self.warm_start,
            "compiled_step": self.compiled_step,
        })

    def save_resumable(self, model, optimizer, data, options, progress: Progress, device: torch.device) -> None:
        target = self.output / "checkpoints" / f"step-{progress.step:07d}"
        save_checkpoint(target, model, data.tokenizer, metadata=self.metadata(options, data, progress, device),
                        write_extra=state_writer(optimizer, progress))
        prune(self.output, options.keep_checkpoints)

    def finish(self, model, data, options, progress: Progress, device: torch.device, final_eval: dict) -> None:
        """The curves, then the servable checkpoint under the output name, with the run's files beside it."""
        plot_metrics(self.history, self.output / "training_curves.png")
        metadata = self.metadata(options, data, progress, device, final_eval=final_eval)
        save_checkpoint(self.output, model, data.tokenizer, metadata=metadata, dtype=SAVE_DTYPES[options.save_dtype],
                        write_extra=self._keep_run_files)

    def _keep_run_files(self, tmp: Path) -> None:
        """Carry the run's files into the final checkpoint directory by hard link (no copy, and the old
        directory stays intact until the atomic swap)."""
        for name in ("metrics.jsonl", "training_curves.png", "checkpoints"):
            source = self.output / name
            if source.is_dir():
                shutil.copytree(source, tmp / name, copy_function=_link_or_copy)
            elif source.is_file():
                _link_or_copy(source, tmp / name)

    def progress_bar(self, options, progress: Progress, enabled: bool):
        if not (enabled and self.is_writer):
            return _NoBar()
        from tqdm import tqdm

        return tqdm(total=options.max_steps, initial=progress.step, unit="step", dynamic_ncols=True, file=sys.stderr)

    @staticmethod
    def eta(progress: Progress, fraction: float) -> str:
        if fraction <= 0:
            return "?"
        remaining = progress.elapsed_s * (1 - fraction) / fraction
        return time.strftime("%H:%M:%S", time.gmtime(max(0.0, remaining)))


class _NoBar:
    def update(self, _n: int) -> None: ...
    def set_postfix(self, **_kw) -> None: ...
    def close(self) -> None: ...


def _check_writable(output: Path) -> None:
    try:
        output.mkdir(parents=True, exist_ok=True)
        probe = output / f".write-test-{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise OSError(exc.errno, f"output directory {output} is not writable: {exc.strerror}") from None


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
