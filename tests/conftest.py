"""Shared fixtures: a small tokenizer trained on real text, tiny random checkpoints.

The real text is the slices of WikiText-2 in tests/data/wikitext-2 (its README says what and whence): the suite
needs nothing beside the repository. BERT_WIKITEXT_DIR is set here, before anything reads devkit.paths, so that
the benchmarks the tests run (in this process and in the processes they start) read the slices too."""

from __future__ import annotations

import os
from pathlib import Path

TEST_WIKITEXT = Path(__file__).resolve().parent / "data" / "wikitext-2"
os.environ["BERT_WIKITEXT_DIR"] = str(TEST_WIKITEXT)

import pytest  # noqa: E402
import torch  # noqa: E402

from devkit.paths import wikitext_split  # noqa: E402
from model import BertConfig, BertForPreTraining, WordPieceTokenizer, save_checkpoint  # noqa: E402


def wikitext_lines(split: str = "valid", limit: int | None = None) -> list[str]:
    path = wikitext_split(split, TEST_WIKITEXT)
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    lines = [line for line in lines if line and not line.startswith("=")]
    return lines[:limit] if limit else lines


@pytest.fixture(scope="session")
def tokenizer() -> WordPieceTokenizer:
    return WordPieceTokenizer.train(wikitext_lines("valid", limit=1500), vocab_size=2000)


def tiny_config(vocab_size: int, **overrides) -> BertConfig:
    values = dict(
        vocab_size=vocab_size, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=128,
    )
    values.update(overrides)
    return BertConfig(**values)


def random_model(vocab_size: int, seed: int = 0, **overrides) -> BertForPreTraining:
    torch.manual_seed(seed)
    model = BertForPreTraining(tiny_config(vocab_size, **overrides))
    # Non-trivial biases and LayerNorm parameters, so that a wrong wiring cannot hide behind zeros/ones.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "bias" in name or "LayerNorm" in name:
                param.add_(torch.randn_like(param) * 0.1)
    return model.eval()


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, tokenizer) -> Path:
    directory = tmp_path_factory.mktemp("ckpt") / "tiny"
    save_checkpoint(directory, random_model(tokenizer.vocab_size), tokenizer, metadata={"note": "random weights"})
    return directory


def small_wikitext(path: Path, lines: int = 400) -> Path:
    """The first articles of WikiText-2's validation split, kept in WikiText format."""
    source = wikitext_split("valid", TEST_WIKITEXT).read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(source[:lines]), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    return small_wikitext(tmp_path_factory.mktemp("corpus") / "small.tokens")


@pytest.fixture(scope="session")
def small_eval_corpus(tmp_path_factory) -> Path:
    source = wikitext_split("test", TEST_WIKITEXT).read_text(encoding="utf-8").splitlines(keepends=True)
    path = tmp_path_factory.mktemp("corpus") / "eval.tokens"
    path.write_text("".join(source[:200]), encoding="utf-8")
    return path


def sequence_classifier(directory: Path, tokenizer: WordPieceTokenizer, num_labels: int, seed: int = 11,
                        **config_fields) -> Path:
    """A BertForSequenceClassification directory as `transformers` writes it (random weights, our vocabulary):
    a cross-encoder with one output, or a classifier with named labels."""
    import transformers

    source = random_model(tokenizer.vocab_size, seed=seed)
    config = transformers.BertConfig(**source.config.to_dict(), num_labels=num_labels, **config_fields)
    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification(config).eval()
    model.bert.load_state_dict({k[len("bert."):]: v for k, v in source.state_dict().items() if k.startswith("bert.")})
    with torch.no_grad():  # logits of a useful spread, so that sorting and activations are exercised
        model.classifier.weight.normal_(0, 1.0)
        model.classifier.bias.normal_(0, 0.5)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_cross_encoder(tmp_path_factory, tokenizer) -> Path:
    return sequence_classifier(tmp_path_factory.mktemp("ckpt") / "cross-encoder", tokenizer, num_labels=1)


@pytest.fixture(scope="session")
def tiny_classifier(tmp_path_factory, tokenizer) -> Path:
    return sequence_classifier(tmp_path_factory.mktemp("ckpt") / "classifier", tokenizer, num_labels=3,
                               id2label={0: "negative", 1: "neutral", 2: "positive"},
                               label2id={"negative": 0, "neutral": 1, "positive": 2},
                               problem_type="single_label_classification")


NER_LABELS = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC", 5: "MISC"}  # MISC: a tag without B-/I-


def task_checkpoint(directory: Path, tokenizer: WordPieceTokenizer, architecture: str, seed: int = 13,
                    **config_fields) -> Path:
    """A BertForTokenClassification or BertForQuestionAnswering directory as `transformers` writes it: random
    weights (biases and LayerNorms perturbed, the head's weights of a useful spread), our vocabulary."""
    import transformers

    source = random_model(tokenizer.vocab_size, seed=seed)
    config = transformers.BertConfig(**source.config.to_dict(), **config_fields)
    torch.manual_seed(seed)
    model = getattr(transformers, architecture)(config).eval()
    model.bert.load_state_dict({k[len("bert."):]: v for k, v in source.state_dict().items()
                                if k.startswith("bert.") and not k.startswith("bert.pooler.")})
    head = model.classifier if architecture == "BertForTokenClassification" else model.qa_outputs
    with torch.no_grad():
        head.weight.normal_(0, 0.5)
        head.bias.normal_(0, 0.5)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save(directory, model_max_length=config.max_position_embeddings)  # the pipelines' windows: the model's
    return directory


@pytest.fixture(scope="session")
def tiny_token_classifier(tmp_path_factory, tokenizer) -> Path:
    return task_checkpoint(tmp_path_factory.mktemp("ckpt") / "ner", tokenizer, "BertForTokenClassification",
                           id2label=NER_LABELS, label2id={v: k for k, v in NER_LABELS.items()})


@pytest.fixture(scope="session")
def tiny_question_answerer(tmp_path_factory, tokenizer) -> Path:
    return task_checkpoint(tmp_path_factory.mktemp("ckpt") / "qa", tokenizer, "BertForQuestionAnswering", seed=17)


@pytest.fixture(scope="session")
def tiny_colbert(tmp_path_factory, tokenizer) -> Path:
    """A ColBERT in PyLate's layout (tests/colbert_checkpoints.py): short queries and documents, so that expansion,
    truncation and windows show in a few words."""
    from tests.colbert_checkpoints import pylate_checkpoint

    return pylate_checkpoint(tmp_path_factory.mktemp("ckpt") / "colbert", tokenizer, dims=(32,), query_length=16,
                             document_length=24)


@pytest.fixture(scope="session")
def tiny_colbert_ai(tmp_path_factory, tokenizer) -> Path:
    """A ColBERT in colbert-ai's layout, its expansion tokens attended to."""
    from tests.colbert_checkpoints import colbert_ai_checkpoint

    return colbert_ai_checkpoint(tmp_path_factory.mktemp("ckpt") / "colbert-ai", tokenizer, dim=20, query_maxlen=20,
                                 doc_maxlen=32, attend_to_mask_tokens=True)
