"""Can next-sentence accuracy rise without moving the encoder? The encoder is frozen (so the served embeddings
and fill-mask stay exactly as they are) and only the pooler and the next-sentence classifier are fitted again,
on the frozen [CLS] vectors of fresh Wikipedia pairs. The refit is chosen by its accuracy on other Wikipedia
pairs (never by the held-out WikiText figure it is then measured on), and compared with the checkpoint's own
heads on both sets: if the frozen [CLS] vector held what the held-out pairs need, the refit would reach it.

    python -m bench.quality.nsp_heads_only checkpoints/minilm-wikipedia
"""

from __future__ import annotations

import argparse
import copy
import json
import random
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from devkit.paths import WIKIPEDIA_DIR, WIKITEXT_TEST
from model import load_checkpoint
from trainer.data.examples import build_pairs, collate
from trainer.data.pipeline import token_cache
from trainer.data.tokens import TokenizedCorpus
from trainer.evaluate import build_eval_set
from trainer.options import TrainOptions

PAIR_SEED = 123  # not the evaluation's seed: other pairs than the trainer's held-out ones
BATCH = 64


@torch.inference_mode()
def cls_vectors(model, batches) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, H) last-layer [CLS] vectors and (N,) next-sentence labels; `batches` yields (PairBatch, input ids)."""
    vectors, labels = [], []
    for batch, input_ids in batches:
        hidden, _ = model.bert(input_ids, token_type_ids=batch.token_type_ids, attention_mask=batch.attention_mask)
        vectors.append(hidden[:, 0])
        labels.append(batch.nsp_labels)
    return torch.cat(vectors), torch.cat(labels)


def wikipedia_vectors(model, tokenizer, corpus: TokenizedCorpus, documents: range, pairs: int, max_seq_len: int):
    part = corpus.documents(documents.start, documents.stop)
    examples = build_pairs(part, max_seq_len, seed=PAIR_SEED)
    random.Random(PAIR_SEED).shuffle(examples)
    examples = examples[:pairs]
    batches = (collate(examples[at : at + BATCH], tokenizer) for at in range(0, len(examples), BATCH))
    return cls_vectors(model, ((batch, batch.input_ids) for batch in batches))


def accuracy(pooler: nn.Linear, classifier: nn.Linear, vectors: torch.Tensor, labels: torch.Tensor) -> float:
    with torch.no_grad():
        return float((classifier(torch.tanh(pooler(vectors))).argmax(-1) == labels).float().mean())


def refit(pooler: nn.Linear, classifier: nn.Linear, fit, check, epochs: int, lr: float):
    """The heads after the epoch that scores best on `check`, and that epoch (0 = the heads as they came)."""
    pooler, classifier = copy.deepcopy(pooler), copy.deepcopy(classifier)
    best = (accuracy(pooler, classifier, *check), 0, copy.deepcopy((pooler, classifier)))
    optimizer = torch.optim.AdamW([*pooler.parameters(), *classifier.parameters()], lr=lr, weight_decay=0.01)
    vectors, labels = fit
    for epoch in range(1, epochs + 1):
        for rows in torch.randperm(len(labels)).split(BATCH):
            loss = F.cross_entropy(classifier(torch.tanh(pooler(vectors[rows]))), labels[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        score = accuracy(pooler, classifier, *check)
        if score > best[0]:
            best = (score, epoch, copy.deepcopy((pooler, classifier)))
    return best[2], best[1]


def measure(checkpoint_dir: Path, fit_pairs: int, epochs: int, lr: float) -> dict:
    torch.manual_seed(0)
    checkpoint = load_checkpoint(checkpoint_dir)
    model, tokenizer = checkpoint.model.float().eval(), checkpoint.tokenizer
    wiki_path = WIKIPEDIA_DIR / "enwiki-2021-recent.txt.xz"
    options = TrainOptions(corpus=str(wiki_path), eval_corpus=str(WIKITEXT_TEST), output=Path("unused"), progress=False)
    wiki, _ = token_cache(wiki_path, options, tokenizer)
    fit = wikipedia_vectors(model, tokenizer, wiki, range(8000), fit_pairs, options.max_seq_len)
    check = wikipedia_vectors(model, tokenizer, wiki, range(8000, 10000), 1000, options.max_seq_len)
    heldout_corpus, _ = token_cache(WIKITEXT_TEST, options, tokenizer)
    eval_set = build_eval_set(heldout_corpus, tokenizer, checkpoint.config.vocab_size, options.max_seq_len,
                              options.eval_examples)
    heldout = {"masked as the trainer evaluates": cls_vectors(model, ((b, m.input_ids) for b, m in eval_set.batches)),
               "unmasked": cls_vectors(model, ((b, b.input_ids) for b, _ in eval_set.batches))}
    own = (model.bert.pooler.dense, model.cls.seq_relationship)
    (pooler, classifier), epoch = refit(*own, fit, check, epochs, lr)
    sets = {"wikipedia pairs (choice)": check, **{f"WikiText-2 test, {k}": v for k, v in heldout.items()}}
    return {"checkpoint": checkpoint_dir.name, "fit_pairs": len(fit[1]), "epochs": epochs, "lr": lr,
            "chosen_epoch": epoch,
            "own_heads": {name: accuracy(*own, *data) for name, data in sets.items()},
            "refit_heads": {name: accuracy(pooler, classifier, *data) for name, data in sets.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--fit-pairs", type=int, default=6000)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--lr", type=float, default=1e-4)
    args = parser.parse_args()
    print(json.dumps(measure(args.checkpoint, args.fit_pairs, args.epochs, args.lr), indent=1))


if __name__ == "__main__":
    main()
