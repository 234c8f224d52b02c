"""The model card (README.md) of an exported checkpoint, rendered from its training metadata: how it was trained, what
it measured on held-out text, what it answers, its limits and its data's licences."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from model.flops import count_parameters
from model.provenance import portable_text
from trainer.run_files import command_history

CARD = """# {name}

A {kind} ({layers} layers, hidden size {hidden}, {heads} heads, {params:,} parameters,
{vocab:,}-token WordPiece vocabulary) {origin} with masked-LM and next-sentence prediction. It is the service's bundled default model: small enough to ship in the repository
({size_mb:.1f} MB in {dtype}), there so that `make serve` works with no download.{stacking}

## How it was trained

- Data ({train_tokens:,} word pieces in {train_docs:,} documents; share = share of training sequences):

{sources}

- Evaluated on {eval} ({eval_tokens:,} word pieces; no training file contains its articles).
- Recipe: {steps:,} optimizer steps of {batch} sequences of up to {seq_len} tokens, peak learning rate {lr},
  {mask_rate:.0%} of tokens masked in training (15% in evaluation), dropout {dropout}, {precision} steps,
  {passes:.2f} passes over the text (sentence pairs drawn afresh each pass), {device}, {minutes:.0f} minutes
  of training steps.
{commands}
- Curves: `training_curves.png`; every logged step and evaluation: `metrics.jsonl`.

## Measured quality (held-out)

| metric | value |
| --- | --- |
| masked-token accuracy (15% of tokens masked) | {mlm_accuracy:.1%} |
| MLM perplexity | {mlm_perplexity:.1f} |
| MLM loss | {mlm_loss:.3f} |
| next-sentence accuracy | {nsp_accuracy:.1%} |
| whole-word fill-mask accuracy, top-1 | {word_accuracy:.1%} |
| ... always answering the most frequent of those words instead | {word_constant:.1%} (the model: {word_ratio:.2f}x that) |
{retention}
Pre-training metrics on {pairs:,} held-out pairs with {masked:,} masked tokens (fixed pairs and masks). Whole-word
fill-mask: one word that is a single vocabulary piece masked in each of {word_sentences:,} held-out sentences, as
users call `/fill-mask`.

## What it answers

{examples}

## Limits

A {layers}-layer model trained for {minutes:.0f} minutes on {device}. {knowledge}{embeddings} It is lower-cased; it saw
sequences of at most {seq_len} tokens (it has 512 positions). Use it to try the service; serve a larger
checkpoint (`--checkpoint`) where quality matters.

## Attribution

{attribution}
"""

# Licences of the corpora this project's bundled models are trained and evaluated on, by file name.
KNOWN_SOURCES = {
    "enwiki-": "English Wikipedia articles, CC BY-SA 3.0 (and GFDL); attribution: Wikipedia contributors "
               "(https://creativecommons.org/licenses/by-sa/3.0/).",
    "brown": "The Brown Corpus (Francis and Kučera, 1961/1979), distributed with the copyright holder's permission.",
    "austen": "Jane Austen's novels, public domain (Project Gutenberg).",
    "wiki.": "WikiText-2 (Merity et al., 2016, \"Pointer Sentinel Mixture Models\"), text from Wikipedia, CC BY-SA 3.0.",
    "wikitext": "WikiText (Merity et al., 2016), text from Wikipedia, CC BY-SA 3.0.",
}
PRECISION_WORDS = {"auto": "bfloat16-autocast (where the hardware has it, else float32)", "float32": "float32",
                   "bfloat16": "bfloat16-autocast"}
FILL_MASK_EXAMPLES = ("The capital of France is [MASK] .", "He was born in [MASK] and died in 1900 .",
                      "She played the [MASK] in the orchestra .", "the game was released in [MASK] .",
                      "The doctor works at the [MASK] .", "It was raining , so she took an [MASK] .")


def licence_of(path: str) -> str:
    name = Path(path).name.lower()
    return next((text for prefix, text in KNOWN_SOURCES.items() if name.startswith(prefix)),
                "as its source states (not known to this tool)")


def training_stages(metadata: dict) -> list[dict]:
    """The runs that made this checkpoint, first to last: each --init-from run records the one it continued."""
    stages = []
    while metadata:
        stages.insert(0, metadata)
        metadata = metadata.get("started_from")
    return stages


def readable_command(stage: dict) -> str:
    """The run's commands (more than one when it was resumed with other flags), with a foreign starting
    checkpoint named instead of its path on the training machine (for a wheel, deep in a virtual environment)."""
    warm = stage.get("warm_start")
    texts = []
    for entry in command_history(stage):
        command = portable_text(entry["command"])
        if warm:
            command = re.sub(r"--init-from \S+", f"--init-from <{warm['name']} directory>", command)
        texts.append(f"`{command}`" if not texts else f"from step {entry['from_step']:,}: `{command}`")
    return "; ".join(texts)


def stage_commands(stages: list[dict]) -> str:
    if len(stages) == 1:
        return f"- Command: {readable_command(stages[0])}"
    lines = [f"- Trained in {len(stages)} runs, each continuing the one before (`--init-from`):"]
    for number, stage in enumerate(stages, 1):
        progress, options = stage.get("progress") or {}, stage.get("options") or {}
        lines.append(f"  {number}. {progress.get('step', 0):,} steps, peak learning rate {options.get('lr', '?')}, "
                     f"{progress.get('elapsed_s', 0) / 60:.0f} minutes: {readable_command(stage)}")
    return "\n".join(lines)


def warm_start_of(stages: list[dict]) -> dict | None:
    """The foreign checkpoint the first run started from (--init-from a model we did not train), if any."""
    return next((stage["warm_start"] for stage in stages if stage.get("warm_start")), None)


def origin_words(warm: dict | None) -> str:
    if warm is None:
        return "pre-trained from scratch by this project's trainer"
    new = ", ".join(warm.get("new_parts") or []) or "nothing"
    return (f"continued by this project's trainer from `{warm['name']}` (licence: {warm.get('licence') or 'unknown'}; "
            f"new at the start: {new})")


def retention_rows(evaluation: dict, starting: str) -> str:
    """Rows for how well the sentence embeddings keep the starting encoder's (a warm start's evaluation)."""
    if "embedding_nn_agreement" not in evaluation:
        return ""
    rows = [(f"| mean-pooled sentence embeddings vs {starting}'s: nearest-neighbour agreement "
             f"({evaluation['embedding_sentences']} held-out sentences) | {evaluation['embedding_nn_agreement']:.3f} |"),
            f"| ... rank correlation of pairwise similarities | {evaluation['embedding_similarity_spearman']:.3f} |"]
    if "embedding_mean_cosine" in evaluation:
        rows.append(f"| ... mean cosine to the starting encoder's vectors | {evaluation['embedding_mean_cosine']:.3f} |")
    return "\n".join(rows) + "\n"


def model_card(target: Path, metadata: dict, checkpoint) -> str:
    config = checkpoint.config
    options = metadata.get("options", {})
    data = metadata.get("data", {})
    stages = training_stages(metadata)
    # Totals over every run that trained these weights.
    progress = {key: sum((stage.get("progress") or {}).get(key, 0) for stage in stages)
                for key in ("step", "tokens_seen", "elapsed_s")}
    evaluation = metadata.get("eval") or {}
    sources = data.get("train", [])
    if isinstance(sources, str):  # older metadata: one source
        sources = [{"path": sources, "tokens": data.get("train_tokens", 0), "share": 1.0}]
    source_lines = "\n".join(f"  - `{Path(s['path']).name}`: {s['tokens']:,} word pieces, share {s['share']:.1%}"
                              for s in sources)
    files = [s["path"] for s in sources] + [str(data.get("eval", ""))]
    attribution = "\n".join(f"- `{Path(f).name}`: {licence_of(f)}" for f in files if f)
    if any("CC BY-SA" in licence_of(f) for f in files):
        attribution += ("\n\nThe model weights are a derivative of CC BY-SA text and are shared under the same "
                        "licence (CC BY-SA 3.0).")
    warm = warm_start_of(stages)
    if warm is not None:
        attribution = (f"- Starting weights: `{warm['name']}`, licence {warm.get('licence') or 'unknown'} (its own "
                       f"model card names its training data).\n") + attribution
    word_constant = evaluation.get("whole_word_constant_accuracy", float("nan"))
    kept = retention_evaluation(stages, evaluation)
    nan = float("nan")
    return CARD.format(
        # a warm start keeps its source's shape: the trainer's --preset did not choose it
        name=target.name, kind="BERT model" if warm else f"BERT `{options.get('preset', '?')}` model",
        layers=config.num_hidden_layers, hidden=config.hidden_size,
        heads=config.num_attention_heads, params=count_parameters(checkpoint.model), vocab=config.vocab_size,
        size_mb=(target / "model.safetensors").stat().st_size / 1e6, dtype=metadata["exported_dtype"],
        sources=source_lines, train_tokens=data.get("train_tokens", 0), train_docs=data.get("train_documents", 0),
        eval=Path(str(data.get("eval", "?"))).name, eval_tokens=data.get("eval_tokens", 0),
        steps=progress.get("step", 0), batch=options.get("batch_size", "?"), seq_len=options.get("max_seq_len", "?"),
        lr=" then ".join(str((stage.get("options") or {}).get("lr", "?")) for stage in stages),
        mask_rate=options.get("mask_rate", 0.15), dropout=config.hidden_dropout_prob,
        precision=PRECISION_WORDS.get(options.get("precision", "float32"), options.get("precision")),
        passes=progress.get("tokens_seen", 0) / max(data.get("train_tokens", 1), 1),
        device=metadata.get("device", "?"), minutes=progress.get("elapsed_s", 0) / 60,
        commands=stage_commands(stages), mlm_accuracy=evaluation.get("mlm_accuracy", nan),
        mlm_perplexity=evaluation.get("mlm_perplexity", nan), mlm_loss=evaluation.get("mlm_loss", nan),
        nsp_accuracy=evaluation.get("nsp_accuracy", nan), pairs=evaluation.get("pairs", 0),
        masked=evaluation.get("masked_tokens", 0), word_accuracy=evaluation.get("whole_word_accuracy", nan),
        word_constant=word_constant, word_ratio=evaluation.get("whole_word_vs_constant", nan),
        word_sentences=evaluation.get("whole_word_sentences", 0), examples=fill_mask_examples(checkpoint),
        attribution=attribution, knowledge=what_it_knows(evaluation), origin=origin_words(warm),
        retention=retention_rows(kept, f"`{warm['name']}`" if warm else "the starting encoder"),
        embeddings=embedding_words(kept, warm), stacking=stacking_words(config),
    )


def retention_evaluation(stages: list[dict], evaluation: dict) -> dict:
    """The evaluation that measured the embeddings against the warm start's encoder: the last run's, unless that
    run stacked layers on the run before it (--head-layers froze what it served, and measured against that run's
    encoder instead); then the run that started from the warm start, whose embeddings these still are."""
    last = stages[-1]
    if len(stages) > 1 and (last.get("options") or {}).get("head_layers") and stages[-2].get("warm_start"):
        return {key: value for key, value in (stages[-2].get("eval") or {}).items() if key.startswith("embedding_")}
    return evaluation


def stacking_words(config) -> str:
    """Which layer serves embeddings and which the heads read, for a model trained with --head-layers."""
    if config.embedding_layer is None:
        return ""
    return (f"\n\nIts embeddings (`/encode`, `/embed`, `/v1/embeddings`) come from layer {config.embedding_layer}, "
            f"the starting encoder's own last layer, kept frozen; the masked-LM and next-sentence heads read layer "
            f"{config.num_hidden_layers}, which the trainer stacked on it (`--head-layers`). In `transformers`, "
            f"take `hidden_states[{config.embedding_layer}]` (`output_hidden_states=True`) for the embeddings; "
            f"sentence-transformers would pool the last layer instead, so use this service or that index.")


def embedding_words(evaluation: dict, warm: dict | None) -> str:
    """What the sentence embeddings are good for, when a warm start measured how well they were kept."""
    agreement = evaluation.get("embedding_nn_agreement")
    if warm is None or agreement is None:
        return ""
    said = (f" Its mean-pooled sentence embeddings (`/v1/embeddings`, `/embed`) find {agreement:.0%} of the same "
            f"nearest neighbours as `{warm['name']}`'s")
    # 0.85: issue #25's bar for embeddings a user can search with as they did with the starting model
    return said + (", so they serve search nearly as that model does." if agreement >= 0.85 else
                   ": they have drifted from it, so search with a sentence-embedding model instead.")


def what_it_knows(evaluation: dict) -> str:
    """One honest sentence on what the measured figures say the model can do."""
    ratio = evaluation.get("whole_word_vs_constant")
    if ratio is None:
        return "Its whole-word fill-mask accuracy was not measured."
    if ratio < 1.0:
        return ("Its whole-word guesses are right less often than always answering the most frequent word: it has "
                "learned which words are frequent and the gist of a passage (next-sentence scores), but hardly yet "
                "to read a word's context, so fill-mask answers are mostly frequent words.")
    if ratio < 2.0:
        return ("Its whole-word guesses beat a constant guess, but not by much: it reads some context (word class, "
                "frequent collocations), and knows few facts.")
    return "It reads context well enough to fill in common words and frequent facts of its text, not rare ones."


@torch.inference_mode()
def top_answers(model, tokenizer, text: str, top_k: int = 5) -> list[tuple[str, float]]:
    """The top_k words for the one [MASK] in `text` with their probabilities, as `/fill-mask` computes them
    (softmax over the whole vocabulary). `model` is a BertForPreTraining in eval mode."""
    encoded = tokenizer.encode(text)
    ids = torch.tensor([encoded.ids])
    hidden, _ = model.bert(ids, torch.tensor([encoded.type_ids]))
    scores, best = model.mlm_logits(hidden, ids == tokenizer.mask_id).softmax(-1)[0].topk(top_k)
    return [(tokenizer.id_to_token(int(t)), float(p)) for t, p in zip(best, scores)]


def fill_mask_examples(checkpoint, top_k: int = 5) -> str:
    """The top answers for a few sentences, as a table (what `/fill-mask` returns for them)."""
    model, tokenizer = checkpoint.model.float().eval(), checkpoint.tokenizer
    rows = ["| input | top 5 (probability) |", "| --- | --- |"]
    for text in FILL_MASK_EXAMPLES:
        answers = ", ".join(f"{token} ({p:.2f})" for token, p in top_answers(model, tokenizer, text, top_k))
        rows.append(f"| `{text}` | {answers} |")
    return "\n".join(rows)
