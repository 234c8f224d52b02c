"""The training peer: a plain `transformers.BertForPreTraining` loop, as a tutorial writes it.

It sees exactly what our trainer sees (same tokenizer, pairs, batches, dynamic masks, optimizer
groups, learning-rate schedule, clipping, seed and time budget) and differs only in how a step is
computed: batches padded to --max-seq-len and the model's own loss, which projects every position
onto the vocabulary. The checkpoint it writes is a Hugging Face directory, so `bench.training.speed`
evaluates it with the same code as ours.

    python -m bench.training.peer --corpus ../shared/data/wikitext-2/wiki.valid.tokens \\
        --eval-corpus ../shared/data/wikitext-2/wiki.test.tokens --output runs/peer --time-budget 10
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch
import transformers

from model.config import BertConfig
from trainer.data.batches import training_batch
from trainer.data.examples import TrainingPairs
from trainer.data.masking import replaceable_ids
from trainer.data.pipeline import prepare
from trainer.optimizer import build_optimizer, lr_factor, run_progress
from trainer.options import TrainOptions
from trainer.placement import autocast_dtype
from trainer.state import Progress

IGNORED = -100  # transformers' "no label here"
PEER_RUN_FILE = "peer_run.json"


def pad_to(tensor: torch.Tensor, width: int, value: int) -> torch.Tensor:
    return torch.nn.functional.pad(tensor, (0, width - tensor.shape[1]), value=value)


def transformers_twin(config: BertConfig) -> transformers.BertForPreTraining:
    """transformers' BertForPreTraining with our config; parameter names match, so state dicts move as they are."""
    values = {k: v for k, v in config.to_dict().items() if k != "architectures"}
    return transformers.BertForPreTraining(transformers.BertConfig(**values))


def train_peer(options: TrainOptions) -> dict:
    data = prepare(options)
    tokenizer = data.tokenizer
    torch.manual_seed(options.seed)
    dropout = {} if options.dropout is None else {"hidden_dropout_prob": options.dropout,
                                                  "attention_probs_dropout_prob": options.dropout}
    config = BertConfig.preset(options.preset, vocab_size=tokenizer.vocab_size,
                               max_position_embeddings=max(512, options.max_seq_len), pad_token_id=tokenizer.pad_id,
                               **dropout)
    model = transformers_twin(config).train()
    optimizer = build_optimizer(model, options, torch.device("cpu"))
    torch.manual_seed(options.seed * 7919)  # dropout stream
    replace = replaceable_ids(tokenizer, config.vocab_size)
    width = options.max_seq_len

    pairs = TrainingPairs(data.train, options.max_seq_len, options.seed, options.short_seq_prob, data.weights)
    # The trainer's own bookkeeping, data order, masks, schedule and precision, so both runs stop alike.
    progress = Progress(cursors=pairs.initial_cursors())
    autocast = autocast_dtype(options.precision, torch.device("cpu"))
    while (fraction := run_progress(progress, options)) < 1.0:
        step_start = time.perf_counter()
        batch, masked = training_batch(pairs, progress, options, data, replace)
        labels = torch.full_like(masked.input_ids, IGNORED)
        labels[masked.positions] = masked.labels
        for group in optimizer.param_groups:
            group["lr"] = options.lr * lr_factor(fraction, options.warmup_fraction)
        with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
            out = model(input_ids=pad_to(masked.input_ids, width, tokenizer.pad_id),
                        token_type_ids=pad_to(batch.token_type_ids, width, 0),
                        attention_mask=pad_to(batch.attention_mask, width, 0),
                        labels=pad_to(labels, width, IGNORED), next_sentence_label=batch.nsp_labels)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), options.clip_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        progress.step += 1
        progress.tokens_seen += batch.num_real_tokens
        progress.elapsed_s += time.perf_counter() - step_start

    model.save_pretrained(options.output, safe_serialization=True)
    tokenizer.save(options.output)
    # The same "progress" record as our checkpoints' metadata, so bench.training.speed reads both alike.
    summary = {"progress": asdict(progress), "transformers_version": transformers.__version__}
    (Path(options.output) / PEER_RUN_FILE).write_text(json.dumps(summary, indent=2))
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--eval-corpus")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--preset", default="mini")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=TrainOptions.lr)
    parser.add_argument("--time-budget", type=float, help="minutes of training steps")
    parser.add_argument("--max-steps", type=int)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab-size", type=int, default=TrainOptions.vocab_size)
    parser.add_argument("--dropout", type=float)
    parser.add_argument("--precision", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--cache-dir", type=Path, default=TrainOptions.cache_dir)
    args = parser.parse_args(argv)
    options = TrainOptions(corpus=args.corpus, eval_corpus=args.eval_corpus, output=args.output, preset=args.preset,
                           batch_size=args.batch_size, lr=args.lr, time_budget=args.time_budget,
                           max_steps=args.max_steps, seed=args.seed, cache_dir=args.cache_dir, progress=False,
                           vocab_size=args.vocab_size, dropout=args.dropout, precision=args.precision)
    print(json.dumps(train_peer(options)))


if __name__ == "__main__":
    main()
