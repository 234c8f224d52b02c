"""The pre-training loop: MLM + NSP, steps until the budget is spent, evaluation and checkpoints on their
cadence, resume, DDP.

`train(options) -> Path` is the whole trainer; the CLI is a thin layer over it. The jobs it strings together
live beside it: where the process runs (placement.py), the optimizer and its schedule (optimizer.py), one
optimizer step over micro-batches (gradient_step.py), the run's files and checkpoint rotation (run_files.py,
state.py). Under `torchrun` every rank builds the same global batch (pairs and masks come from seeded
generators) and takes its own slice, so N processes compute the same step as one process with the same
global batch.
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel

from model.bert import BertForPreTraining
from model.config import BertConfig
from model.device import keep_freed_memory
from model.flops import model_flops_per_token
from trainer.data.batches import BatchStream
from trainer.data.examples import TrainingPairs
from trainer.data.masking import replaceable_ids
from trainer.data.pipeline import PreparedData, prepare
from trainer.evaluate import build_eval_set, evaluate
from trainer.forward import PreTrainingForward, compile_forward, cuda_graph_skips, replays_cuda_graphs
from trainer.gradient_step import GradientStep
from trainer.optimizer import build_optimizer, lr_factor, restore_optimizer, run_progress, set_learning_rate
from trainer.options import TrainOptions
from trainer.placement import Placement, autocast_dtype, leave, place
from trainer.retention import build_probe
from trainer.run_files import RunFiles, command_history, earlier_stage
from trainer.state import Progress, clean_partial_saves, newest_good
from trainer.step_fallback import EagerFallback
from trainer.warm_start import WarmStart, embedding_parameter, frozen_encoder, load_warm_start

log = logging.getLogger("trainer")


class Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# ---- the loop ------------------------------------------------------------------------------------


def train(options: TrainOptions, command: str | None = None) -> Path:
    """`command`: the command line as the user gave it, for the metadata and the model card (default: this
    process's own arguments)."""
    placement = place(options)
    if placement.device.type == "cpu":
        keep_freed_memory()  # every op's output would otherwise cost page faults (model/device.py)
    try:
        return Training(options, placement, command).run()
    finally:
        leave(placement)


class Training:
    """One training run: set up in the constructor, `run()` trains and writes the final checkpoint."""

    def __init__(self, options: TrainOptions, placement: Placement, command: str | None = None):
        self.options = options
        self.placement = placement
        self._check_batch_split()
        self.autocast = autocast_dtype(options.precision, placement.device)
        resume = newest_good(options.output) if options.resume else None
        warm = self._load_starting_checkpoint(resume)
        self.teacher = frozen_encoder(options.init_from, placement.device) if options.preserve_embeddings > 0 else None
        self.files = RunFiles(options.output, is_writer=placement.is_writer, command=command)
        self._tidy_before_resuming(resume)
        self.data = self._prepare(resume.checkpoint.tokenizer if resume else warm.tokenizer if warm else None)
        self._build_trainable_model(resume, warm)
        self.optimizer = build_optimizer(self.model, options, placement.device)
        self.pairs = TrainingPairs(self.data.train, options.max_seq_len, options.seed, options.short_seq_prob,
                                   self.data.weights)
        self._restore_or_start_progress(resume)
        self._record_what_this_run_continues(resume, warm)
        self._build_forward()
        self.eval_set = self._build_eval_set()
        self.replace = replaceable_ids(self.data.tokenizer, self.model.config.vocab_size)
        self.gradient_step = GradientStep(options, placement, self.wrapped, self.forward_model, self.optimizer,
                                          self.encoder_params, self.teacher, self.autocast,
                                          self.data.tokenizer.sep_id, self.cuda_graphs)
        self.files.compiled_step = {"compiled": options.compile, "cuda_graphs": self.cuda_graphs, "fell_back": None}
        if options.compile:  # a compilation or capture that fails trains eagerly (trainer.step_fallback)
            self.gradient_step = EagerFallback(self.gradient_step, self.wrapped, self._fell_back)
        self.flops_per_token = 3 * model_flops_per_token(self.model.config, options.max_seq_len, options.mask_rate)

    # The constructor's jobs, in the order it does them (the seeds make that order matter).

    def _check_batch_split(self) -> None:
        options, world = self.options, self.placement.world
        if options.batch_size % (world * options.grad_accum):
            raise ValueError(f"--batch-size {options.batch_size} must divide into {world} process(es) x "
                             f"--grad-accum {options.grad_accum}")

    def _load_starting_checkpoint(self, resume) -> WarmStart | None:
        """The --init-from checkpoint of a new run, checked before anything is prepared or written (a bad one
        fails here)."""
        options = self.options
        torch.manual_seed(options.seed)  # initial weights of the heads a warm start lacks
        if options.init_from is None or resume is not None:
            return None
        return load_warm_start(options.init_from, options.dropout, options.head_layers, options.head_layers_start)

    def _tidy_before_resuming(self, resume) -> None:
        options = self.options
        if not options.resume:
            return
        if self.placement.is_writer:
            clean_partial_saves(options.output)
        if resume is None:
            log.warning("--resume: no usable checkpoint under %s/checkpoints; starting a new run (%s)", options.output,
                        f"from {options.init_from}" if options.init_from is not None else "from scratch")

    def _build_trainable_model(self, resume, warm: WarmStart | None) -> None:
        torch.manual_seed(self.options.seed)  # initial weights
        self.model = self._build_model(resume, warm).to(self.placement.device).train()
        # embeddings + encoder layers up to the embedding layer (the word embeddings are also the tied MLM decoder)
        self.encoder_params = [param for name, param in self.model.named_parameters()
                               if embedding_parameter(name, self.model.config)]
        if self.model.config.embedding_layer is not None:
            # Layers stacked for the heads (--head-layers): what makes the served embeddings is never trained.
            for param in self.encoder_params:
                param.requires_grad_(False)

    def _restore_or_start_progress(self, resume) -> None:
        self.progress = Progress(cursors=self.pairs.initial_cursors())
        if resume is not None:
            restore_optimizer(self.optimizer, resume.optimizer_state, self.options)
            self.progress = resume.progress
            torch.set_rng_state(resume.rng_state)  # the dropout stream continues where it was saved
            log.info("resumed from step %d", self.progress.step)
        else:
            torch.manual_seed(self.options.seed * 7919 + self.placement.rank)  # dropout stream, one per rank

    def _record_what_this_run_continues(self, resume, warm: WarmStart | None) -> None:
        """Read once (the --init-from directory may be gone by the next save), kept in every checkpoint's metadata."""
        options = self.options
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

    def _build_forward(self) -> None:
        """The forward pass to the losses, wrapped for DDP across processes and compiled when asked."""
        options, placement, device = self.options, self.placement, self.placement.device
        self.forward_module = PreTrainingForward(self.model,
                                                 options.preserve_over if self.teacher is not None else None)
        self.wrapped = self.forward_module
        if placement.world > 1:
            self.wrapped = DistributedDataParallel(self.forward_module,
                                                   device_ids=[device.index] if device.type == "cuda" else None)
        self.cuda_graphs = replays_cuda_graphs(options, placement)
        self.told_of_skips = False
        if options.compile:
            log.info("compiling the step %s", "as CUDA graphs of one shape (--cuda-graphs)" if self.cuda_graphs else
                     "for changing shapes")
        self.forward_model = compile_forward(self.wrapped, cuda_graphs=self.cuda_graphs) if options.compile \
            else self.wrapped

    def _build_eval_set(self):
        """The held-out pairs and masks (the writing process only), with the retention probe when the run starts
        from an encoder whose sentence embeddings it should keep."""
        options, device = self.options, self.placement.device
        if not self.placement.is_writer:
            return None
        eval_set = build_eval_set(self.data.eval, self.data.tokenizer, self.model.config.vocab_size,
                                  options.max_seq_len, options.eval_examples)
        if options.init_from is not None and (self.teacher is not None or options.init_from.is_dir()):
            # How far the served sentence embeddings move from the starting encoder's, at every evaluation.
            reference = self.teacher if self.teacher is not None else frozen_encoder(options.init_from, device)
            eval_set.retention = build_probe(self.data.eval, self.data.tokenizer, reference, device)
        return eval_set

    def _fell_back(self, reason: str) -> None:
        self.cuda_graphs = False  # no CUDA-graph counts to log from here on
        self.files.compiled_step = {**self.files.compiled_step, "cuda_graphs": False, "fell_back": reason}

    def _prepare(self, tokenizer) -> PreparedData:
        # Rank 0 trains the tokenizer and fills the caches first; the others then read them.
        if self.placement.is_writer:
            data = prepare(self.options, tokenizer=tokenizer)
        self.placement.wait_for_all()
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
        window_tokens, window_start, window_input_wait = 0, time.perf_counter(), 0.0
        last_save = time.perf_counter()  # --save-every-minutes counts from here
        last_eval: dict | None = None
        batches = BatchStream(self.pairs, progress.step, progress.cursors, options, self.data, self.replace,
                              ahead=self.placement.device.type == "cuda", fixed_shapes=self.cuda_graphs,
                              workers=options.batch_workers)
        try:
            while run_progress(progress, options) < 1.0:
                step_start = time.perf_counter()
                taken = batches.next(progress.step)
                window_input_wait += time.perf_counter() - step_start  # a stream that cannot keep up shows here
                batch, masked, progress.cursors = taken.batch, taken.masked, taken.cursors
                factor = lr_factor(run_progress(progress, options), options.warmup_fraction)
                set_learning_rate(self.optimizer, options, factor)
                stats = self.gradient_step(batch, masked, progress.step)
                progress.step += 1
                progress.tokens_seen += batch.num_real_tokens
                window_tokens += batch.num_real_tokens
                progress.elapsed_s += time.perf_counter() - step_start

                if progress.step % options.log_every == 0:
                    values = stats.values()  # the one wait for the device between logged steps
                    window_s = max(time.perf_counter() - window_start, 1e-9)
                    tokens_per_s = window_tokens / window_s
                    # The share of the window spent waiting for the next batch: near 0 when the device (or the step
                    # on a CPU) is the bound, large when the input pipeline is.
                    row = {"step": progress.step, "passes": round(progress.tokens_seen / self.pairs.total_tokens, 4),
                           "lr": options.lr * factor, "tokens_per_s": tokens_per_s,
                           "input_wait": round(window_input_wait / window_s, 4),
                           "elapsed_s": round(progress.elapsed_s, 2), **values}
                    if self.placement.device.type == "cuda":
                        row["model_tflops"] = tokens_per_s * self.flops_per_token / 1e12
                    if self.cuda_graphs:
                        row["cuda_graph_skips"] = skipped = cuda_graph_skips()
                        if skipped and not self.told_of_skips:
                            self.told_of_skips = True
                            log.warning("%d graph(s) of the compiled step run without CUDA graphs "
                                        "(TORCH_LOGS=cudagraphs says why)", skipped)
                    self.files.log(row)
                    window_tokens, window_start, window_input_wait = 0, time.perf_counter(), 0.0
                    bar.set_postfix(loss=f"{values['loss']:.3f}", tok_s=f"{tokens_per_s:,.0f}",
                                    eta=self.files.eta(progress, run_progress(progress, options)))
                bar.update(1)
                done = run_progress(progress, options) >= 1.0
                if self.placement.is_writer and (progress.step % options.eval_every == 0 or done):
                    last_eval = evaluate(self.model, self.eval_set, self.placement.device)
                    self.files.log({"step": progress.step, "eval": last_eval})
                due = options.save_every_minutes > 0 and \
                    time.perf_counter() - last_save >= 60 * options.save_every_minutes
                if (progress.step % options.save_every == 0 or self._agreed(due)) and not done:
                    self._save_resumable()
                    last_save = time.perf_counter()
                if stop_signal:
                    raise Interrupted(stop_signal[0])
        except Interrupted as interrupt:
            bar.close()
            self._save_resumable()
            log.warning("stopped by %s at step %d; checkpoint saved, continue with --resume", interrupt, progress.step)
            raise
        finally:
            batches.close()
            for s, handler in previous_handlers.items():
                signal.signal(s, handler)
            bar.close()

        self._save_resumable()
        if self.placement.is_writer:
            if last_eval is None:
                last_eval = evaluate(self.model, self.eval_set, self.placement.device)
            self.files.finish(self.model, self.data, options, progress, self.placement.device, last_eval)
        self.placement.wait_for_all()
        return options.output

    def _agreed(self, due: bool) -> bool:
        """A time-based save: the writer's clock decides, every rank saves at the same step."""
        if self.placement.world == 1:
            return due
        flag = torch.tensor([int(due)], device=self.placement.device)
        torch.distributed.broadcast(flag, src=0)
        return bool(flag.item())

    def _save_resumable(self) -> None:
        if self.placement.is_writer:
            self.files.save_resumable(self.model, self.optimizer, self.data, self.options, self.progress,
                                      self.placement.device)
        self.placement.wait_for_all()


__all__ = ["Interrupted", "Training", "train"]
