"""Every trainer option in one dataclass; the CLI is generated from it (help text = field metadata)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

from model.config import PRESETS
from trainer.data.download import DEFAULT_CACHE


# What --preserve-over may name (trainer.forward.vector_inputs says what each embeds and averages).
VECTOR_SOURCES = ("all", "unmasked", "clean")
# How layers stacked for the heads start (trainer.warm_start.stack_head_layers).
HEAD_LAYER_STARTS = ("identity", "copy")


def option(default, help: str, **extra):  # noqa: A002 - mirrors argparse's name
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class TrainOptions:
    corpus: list[str] = option(None, "Training text: a file (plain, .gz or .xz), a directory of text files, or the name "
                                     "of a public corpus (wikitext-2, wikitext-103) to download into --cache-dir. "
                                     "Repeat the flag to mix sources; PATH:WEIGHT sets a source's share of the "
                                     "training sequences (give all weights or none: none = in proportion to size).",
                               required=True)
    output: Path = option(None, "Checkpoint directory to write (servable, opens in transformers). Run files "
                                "(metrics.jsonl, training_curves.png, checkpoints/) go inside it.", required=True)
    eval_corpus: str | None = option(None, "Held-out text for evaluation. Default: the named corpus' validation "
                                           "split, or the last --eval-fraction of the training documents.")
    eval_fraction: float = option(0.05, "Share of training documents held out when no --eval-corpus is given.")
    preset: str = option("mini", f"Model size: {', '.join(PRESETS)} (Turc et al. 2019).", choices=list(PRESETS))
    vocab_size: int = option(16384, "WordPiece vocabulary size when a tokenizer is trained on the corpus.")
    tokenizer_sample: int = option(500_000, "Sentences sampled (uniformly, one pass) to train the vocabulary on.")
    init_from: Path | None = option(None, "Start from this BERT checkpoint's weights and tokenizer instead of scratch: "
                                          "ours, or any BertForPreTraining, BertForMaskedLM or BertModel directory "
                                          "(sentence-transformers models included), or a Hugging Face Hub id "
                                          "(org/name[@revision], fetched into the Hub cache); heads it lacks start "
                                          "fresh.")
    preserve_embeddings: float = option(0.0, "Weight of the embedding-preservation term (needs --init-from): the "
                                             "cosine distance between the mean-pooled sentence vectors of each "
                                             "training batch and those of the frozen starting encoder, added to the "
                                             "loss, so continued MLM training keeps what a sentence-embedding model "
                                             "was good at. 0 turns it off; costs a forward pass of the frozen encoder.")
    preserve_over: str = option("all", "What the preservation term compares: all (the training pair as it is, "
                                       "[MASK]s included), unmasked (the same without the masked-LM positions), "
                                       "or clean (each pair's first segment without masks, embedded alone as "
                                       "users embed a passage; an extra forward and backward over those tokens).",
                                choices=list(VECTOR_SOURCES))
    head_layers: int = option(0, "New encoder layers to stack on the --init-from encoder for the masked-LM and "
                                 "next-sentence heads to read. The starting encoder (embeddings and every layer) "
                                 "is then frozen and stays the one the embedding routes serve (config "
                                 "embedding_layer), so a sentence-embedding model keeps its embeddings exactly while "
                                 "the new layers learn to fill masks. See --head-layers-start for how they start.")
    head_layers_start: str = option("identity", "How the --head-layers layers start: identity (near it, so the heads "
                                                "first answer as before) or copy (copies of the encoder's top "
                                                "--head-layers layers in order, as in progressive stacking, Gong et "
                                                "al. 2019: the new layers compute from the first step on).",
                                    choices=list(HEAD_LAYER_STARTS))
    freeze_encoder_steps: int = option(0, "Steps at the start of the run in which only the heads and pooler learn "
                                          "(the encoder and embeddings stay as --init-from gave them), so that fresh "
                                          "heads do not push the encoder with their first, random gradients.")
    encoder_lr_scale: float = option(1.0, "The encoder's and embeddings' learning rate as a share of --lr (the heads "
                                          "and pooler get all of it). Below 1 a warm start keeps more of what its "
                                          "encoder was good at while fresh heads learn at full speed.")
    max_seq_len: int = option(128, "Tokens per pre-training pair, [CLS] A [SEP] B [SEP] included.")
    mask_rate: float = option(0.15, "Share of non-special tokens chosen for masked-LM prediction in training "
                                    "(evaluation always masks 15%, so runs compare).")
    short_seq_prob: float = option(0.1, "Probability of a shorter target length for a pair (as in BERT).")
    dropout: float | None = option(None, "Hidden and attention dropout of a new or --init-from model (default: the "
                                           "preset's 0.1, or the checkpoint's); --resume keeps the run's.")
    batch_size: int = option(32, "Sequences per optimizer step, across all processes.")
    grad_accum: int = option(1, "Micro-batches per optimizer step (each is batch-size / processes / grad-accum).")
    lr: float = option(1e-3, "Peak learning rate (AdamW).")
    weight_decay: float = option(0.01, "AdamW weight decay; never applied to biases and LayerNorm.")
    warmup_fraction: float = option(0.06, "Share of the run spent warming the learning rate up; then linear decay to 0.")
    clip_norm: float = option(1.0, "Gradient clipping by global norm (0 turns it off).")
    max_steps: int | None = option(None, "Optimizer steps to run. Default 1000 when --time-budget is not given.")
    time_budget: float | None = option(None, "Wall-clock minutes to train; the LR schedule follows elapsed time.")
    eval_every: int = option(200, "Evaluate every N steps (and always at the end).")
    eval_examples: int = option(1024, "Held-out pairs used per evaluation (fixed pairs and masks).")
    save_every: int = option(500, "Write a resumable checkpoint every N steps (and at the end, and on SIGINT/SIGTERM).")
    batch_workers: int = option(1, "On a GPU, processes building the training batches ahead of the step. One "
                                "builds ~1M tokens/s of 128-token pairs on a fast host; more take more host cores "
                                "(each also walks every step's pairs, a quarter of a batch's host time).")
    save_every_minutes: float = option(0.0, "Also write a resumable checkpoint when this many minutes of wall-clock "
                                       "have passed since the last (0: by steps only). For runs on a machine "
                                       "that may be taken back at any moment; each save costs the checkpoint's write.")
    keep_checkpoints: int = option(2, "Resumable checkpoints kept under OUTPUT/checkpoints.")
    log_every: int = option(10, "Log training metrics to metrics.jsonl every N steps.")
    seed: int = option(0, "Seed for weights, pairs, masks and dropout; CPU runs are reproducible.")
    device: str = option("auto", "auto (CUDA if available), cpu, cuda, or cuda:N.")
    compile: bool = option(False, "torch.compile the model (CUDA).")
    cuda_graphs: bool = option(True, "With --compile on one CUDA device and --grad-accum 1: pad every batch to "
                                     "--max-seq-len and its masked positions to a fixed number of slots a pair, so "
                                     "that the step keeps one shape and replays as CUDA graphs (torch.compile's "
                                     "reduce-overhead) instead of launching its kernels one by one. "
                                     "--no-cuda-graphs: compiled for changing shapes, nothing padded.")
    precision: str = option("auto", "Compute precision of training steps: auto = bfloat16 autocast on GPUs and on CPUs "
                                    "that compute bfloat16 natively (AVX512-BF16, AMX), else float32. Weights, optimizer "
                                    "state, losses and evaluation stay float32.", choices=["auto", "float32", "bfloat16"])
    workers: int = option(0, "Processes that split corpora into sentences (0 = one per core).")
    save_dtype: str = option("float32", "Weight dtype of the final checkpoint.", choices=["float32", "float16", "bfloat16"])
    cache_dir: Path = option(DEFAULT_CACHE, "Where downloads, trained tokenizers and token-id caches are kept.")
    resume: bool = option(False, "Continue from the newest good checkpoint in OUTPUT/checkpoints (weights, Adam's moments, data position, schedule); this command's --lr, --encoder-lr-scale and --weight-decay apply from there on.")
    progress: bool = option(True, "Show a progress bar.")

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"--{name.replace('_', '-')} {why}")

        if self.max_steps is None and self.time_budget is None:
            self.max_steps = 1000
        if isinstance(self.corpus, (str, Path)):
            self.corpus = [str(self.corpus)]
        if not self.corpus:
            raise bad("corpus", "is required")
        for name in ("batch_size", "grad_accum", "vocab_size", "tokenizer_sample", "eval_every", "save_every", "log_every",
                     "keep_checkpoints", "eval_examples"):
            if getattr(self, name) < 1:
                raise bad(name, "must be at least 1")
        if self.max_steps is not None and self.max_steps < 1:
            raise bad("max_steps", "must be at least 1")
        if self.time_budget is not None and self.time_budget <= 0:
            raise bad("time_budget", "must be positive (minutes)")
        if not 8 <= self.max_seq_len <= 512:
            raise bad("max_seq_len", "must be between 8 and 512")
        if self.workers < 0:
            raise bad("workers", "must be 0 (one per core) or more")
        if not 0 < self.mask_rate < 1:
            raise bad("mask_rate", "must be between 0 and 1")
        if not 0 <= self.eval_fraction < 1:
            raise bad("eval_fraction", "must be in [0, 1)")
        if not 0 < self.encoder_lr_scale <= 1:
            raise bad("encoder_lr_scale", "must be in (0, 1]")
        if self.freeze_encoder_steps < 0:
            raise bad("freeze_encoder_steps", "must be 0 (off) or more")
        if self.preserve_embeddings < 0:
            raise bad("preserve_embeddings", "must be 0 (off) or positive")
        if self.preserve_embeddings > 0 and self.init_from is None:
            raise bad("preserve_embeddings", "needs --init-from (the encoder whose embeddings to preserve)")
        if self.head_layers < 0:
            raise bad("head_layers", "must be 0 (off) or more")
        if self.head_layers and self.init_from is None:
            raise bad("head_layers", "needs --init-from (the encoder to stack the new layers on)")
        if self.head_layers_start != "identity" and not self.head_layers:
            raise bad("head_layers_start", "needs --head-layers (the layers it starts)")
        if self.head_layers and self.preserve_embeddings > 0:
            raise bad("head_layers", "freezes the starting encoder, so its embeddings stay exactly as they were: "
                                     "leave out --preserve-embeddings")
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise bad("dropout", "must be in [0, 1)")
        if self.lr <= 0:
            raise bad("lr", "must be positive")
        self.output = Path(self.output)
        self.cache_dir = Path(self.cache_dir)
        if self.init_from is not None:
            self.init_from = Path(self.init_from)

    def to_json(self) -> dict:
        return {f.name: (str(v) if isinstance(v, Path) else v) for f in fields(self) for v in [getattr(self, f.name)]}
