"""bench.quality.nsp_heads_only's refit: it learns what the vectors hold, is chosen on the check set only, and leaves the
checkpoint's own heads untouched."""

from __future__ import annotations

import torch
from torch import nn

from bench.quality.nsp_heads_only import accuracy, refit


def separable(count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    vectors = torch.randn(count, 16, generator=generator)
    return vectors, (vectors[:, 3] > 0).long()


def test_refit_learns_the_labels_the_vectors_hold_and_keeps_the_originals():
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    fit, check = separable(512, generator), separable(256, generator)
    pooler, classifier = nn.Linear(16, 16), nn.Linear(16, 2)
    before = [p.detach().clone() for p in (*pooler.parameters(), *classifier.parameters())]
    (new_pooler, new_classifier), epoch = refit(pooler, classifier, fit, check, epochs=15, lr=1e-2)
    assert accuracy(pooler, classifier, *check) < 0.75
    assert accuracy(new_pooler, new_classifier, *check) > 0.95
    assert epoch > 0
    assert all(torch.equal(a, b) for a, b in zip(before, (*pooler.parameters(), *classifier.parameters())))


def test_refit_keeps_the_heads_as_they_came_when_no_epoch_beats_them_on_the_check_set():
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(2)
    fit = separable(512, generator)
    vectors = torch.randn(256, 16, generator=generator)
    pooler, classifier = nn.Linear(16, 16), nn.Linear(16, 2)
    # Labels the heads as they came already get all right: fitting on `fit` cannot beat them on this check set.
    check = (vectors, classifier(torch.tanh(pooler(vectors))).argmax(-1).detach())
    (new_pooler, new_classifier), epoch = refit(pooler, classifier, fit, check, epochs=5, lr=1e-2)
    assert epoch == 0
    assert torch.equal(new_pooler.weight, pooler.weight) and torch.equal(new_classifier.weight, classifier.weight)
