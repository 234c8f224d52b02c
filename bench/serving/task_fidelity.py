"""Whether a faster precision changes the task heads' answers (bench.serving.task_heads): each precision's answers to
the benchmark's own inputs against the float32 service's, and the float32 service's against the plain peer's.

A random head on a trained encoder gives logits a hair apart (weights of std 0.02), so any noise would flip a
label and the check would say nothing; `sharpen_heads` first scales each head (weights and bias, so every logit
by one factor) until its margins look like a trained head's: token classification's median top-two label margin
over the benchmark's tokens becomes `LABEL_MARGIN` logits, and on the closer of the benchmark's questions the best
answer span outscores the runner-up by `SPAN_MARGIN` in log score. Scaling keeps every ordering, so the labels
and spans are the unscaled head's; only how far apart they stand changes.
"""

from __future__ import annotations

import httpx
import torch

LABEL_MARGIN = 4.0  # logits: the top label's softmax about 0.95 on the median token; a trained tagger's is wider
SPAN_MARGIN = 2.0  # log score: the best span e^2 = 7.4 times the runner-up on the closer question
MAX_ANSWER_TOKENS = 15  # the service's and the peer's default max_answer_len
EVERY_TOKEN = {"aggregation_strategy": "none", "ignore_labels": []}  # one entry per token, "O" included


@torch.no_grad()
def label_margins(model, tokenizer, sentences: list[str]) -> torch.Tensor:
    """Top label's logit minus the next one's, at every token of `sentences` ([CLS] and [SEP] left out)."""
    batch = tokenizer(sentences, padding=True, return_tensors="pt", return_special_tokens_mask=True)
    special = batch.pop("special_tokens_mask").bool()
    top_two = model(**batch).logits.topk(2, dim=-1).values  # (B, T, 2)
    return (top_two[..., 0] - top_two[..., 1])[batch["attention_mask"].bool() & ~special]


@torch.no_grad()
def span_margins(model, tokenizer, pairs: list[tuple[str, str]]) -> torch.Tensor:
    """Per (question, context): the best context span's log score (log P(start) + log P(end), start <= end <
    start + 15) minus the runner-up's; one window each, as the benchmark's contexts fit one."""
    batch = tokenizer([q for q, _ in pairs], [c for _, c in pairs], padding=True, return_tensors="pt",
                      return_special_tokens_mask=True)
    context = (batch.pop("special_tokens_mask") == 0) & (batch["token_type_ids"] == 1)  # (B, T)
    out = model(**batch)
    margins = []
    for n in range(len(pairs)):
        start = out.start_logits[n].masked_fill(~context[n], -1e4).log_softmax(-1)
        end = out.end_logits[n].masked_fill(~context[n], -1e4).log_softmax(-1)
        allowed = torch.ones(len(start), len(start), dtype=torch.bool).triu().tril(MAX_ANSWER_TOKENS - 1)
        allowed &= context[n][:, None] & context[n][None, :]
        best_two = (start[:, None] + end[None, :]).masked_fill(~allowed, float("-inf")).flatten().topk(2).values
        margins.append(best_two[0] - best_two[1])
    return torch.stack(margins)


@torch.no_grad()
def sharpen_heads(tagger, answerer, tokenizer, sentences: list[str], pairs: list[tuple[str, str]]) -> dict:
    """Scale the heads of `tagger` (a BertForTokenClassification) and `answerer` (a BertForQuestionAnswering) in
    place to the margins above; returns the margins they then have, to be reported beside the fidelity."""
    for head, margins, target in ((tagger.classifier, lambda: label_margins(tagger, tokenizer, sentences).median(),
                                   LABEL_MARGIN),
                                  (answerer.qa_outputs, lambda: span_margins(answerer, tokenizer, pairs).min(),
                                   SPAN_MARGIN)):
        factor = target / float(margins())
        head.weight.mul_(factor)
        head.bias.mul_(factor)
    labels, spans = label_margins(tagger, tokenizer, sentences), span_margins(answerer, tokenizer, pairs)
    return {"label_margin_median": float(labels.median()), "label_margin_min": float(labels.min()),
            "label_margins_under_1": float((labels < 1).float().mean()),
            "span_margins": [round(float(m), 3) for m in spans]}


def gather(url: str, ner_bodies: list[dict], qa_bodies: list[dict], every_token: bool = True) -> dict:
    """One server's answers to the benchmark's bodies, one request each: the entities as the benchmark asks
    for them, every token's label (`every_token`; the peer has no such option) and the answers."""
    with httpx.Client(timeout=120) as http:
        def ask(route: str, body: dict) -> list[dict]:
            response = http.post(url + route, json=body)
            response.raise_for_status()
            return response.json()["results"][0]

        return {"entities": [ask("/token-classification", body) for body in ner_bodies],
                "tokens": [ask("/token-classification", {**body, **EVERY_TOKEN}) for body in ner_bodies]
                if every_token else None,
                "answers": [ask("/question-answering", body)[0] for body in qa_bodies]}


def compare(reference: dict, other: dict) -> dict:
    """Shares of `other`'s answers equal to `reference`'s (1.0: all) and the largest score difference."""
    def entity_key(entities: list[dict]) -> list[tuple]:
        return [(e.get("entity_group", e.get("entity")), e["start"], e["end"]) for e in entities]

    same_lists = [entity_key(a) == entity_key(b) for a, b in zip(reference["entities"], other["entities"])]
    same_spans = [(a["start"], a["end"]) == (b["start"], b["end"])
                  for a, b in zip(reference["answers"], other["answers"])]
    found = {"token_classification_entities_identical": sum(same_lists) / len(same_lists),
             "question_answering_same_span": sum(same_spans) / len(same_spans),
             "question_answering_max_score_diff": max(abs(a["score"] - b["score"])
                                                      for a, b in zip(reference["answers"], other["answers"]))}
    if reference["tokens"] is not None and other["tokens"] is not None:
        pairs = [(a, b) for x, y in zip(reference["tokens"], other["tokens"]) for a, b in zip(x, y, strict=True)]
        found["token_classification_label_agreement"] = sum(a["entity"] == b["entity"] for a, b in pairs) / len(pairs)
        found["token_classification_max_score_diff"] = max(abs(a["score"] - b["score"]) for a, b in pairs)
    else:  # scores of the entities both found alike
        pairs = [(a, b) for x, y, same in zip(reference["entities"], other["entities"], same_lists) if same
                 for a, b in zip(x, y)]
        found["token_classification_max_score_diff"] = max((abs(a["score"] - b["score"]) for a, b in pairs),
                                                           default=None)
    return found


def fidelity(service_urls: dict[str, tuple[str, str]], peer_url: str | None, ner_bodies: list[dict],
             qa_bodies: list[dict]) -> dict:
    """Each precision's answers against the float32 service's, gathered before them (float32 again: whether
    the service repeats itself); `service_urls` maps a precision to its (token classification, QA) servers."""
    def answers(ner_url: str, qa_url: str) -> dict:
        return {**gather(ner_url, ner_bodies, []), "answers": gather(qa_url, [], qa_bodies)["answers"]}

    reference = answers(*service_urls["float32"])
    found = {dtype: compare(reference, answers(*urls)) for dtype, urls in service_urls.items()}
    if peer_url is not None:
        found["peer_vs_float32"] = compare(reference, gather(peer_url, ner_bodies, qa_bodies, every_token=False))
    return found
