"""The counts RELIABILITY.md states for the bad-input tests are the tests' own: a test that grows or shrinks
makes this fail until the document says so."""

from __future__ import annotations

import re
from pathlib import Path

from tests.service.frontend import test_fuzz, test_hostile_fuzz, test_nasty_inputs

DOC = (Path(__file__).resolve().parents[3] / "RELIABILITY.md").read_text(encoding="utf-8")


def test_the_nasty_table_count():
    assert f"| nasty-input table | {len(test_nasty_inputs.CASES)} cases (" in DOC


def test_the_schemathesis_counts():
    posts = [path for path, operations in test_fuzz.schema.raw_schema["paths"].items() if "post" in operations]
    classifier = [path for path in posts if re.match(test_fuzz.CLASSIFIER_ROUTES, path)]
    per_operation = test_fuzz.EXAMPLES_PER_OPERATION
    assert (f"{per_operation} examples per operation on the {len(posts) - len(classifier)} POST routes of a masked-LM "
            f"checkpoint and {per_operation // 2} on the {len(classifier)} classifier routes") in DOC


def test_the_hostile_body_counts():
    """RELIABILITY.md's request counts per class, as the fuzz module's constants make them (the split by stage is the
    test's own print-out, read off a run)."""
    fuzz = test_hostile_fuzz
    routes, fields = len(fuzz.FIELDS), sum(map(len, fuzz.FIELDS.values()))
    assert f"Every field of every POST route ({routes} routes; their {fields} field paths" in DOC
    assert f"{fuzz.EXAMPLES} per class and route in `make test`, {fuzz.SLOW_EXAMPLES} more in the long" in \
        " ".join(DOC.split())
    drawn = fuzz.EXAMPLES * routes
    swept = 2 * fields  # each field as the value and as a one-element list
    wrong = len(fuzz.WRONG_TYPES) * fields
    rows = {line.split(" | ")[0].lstrip("| "): line for line in DOC.splitlines() if line.startswith("| ")}
    for kind in fuzz.CLASSES:
        assert f"| {drawn} |" in rows[f"{kind}, drawn"], rows[f"{kind}, drawn"]
    assert f"| {len(fuzz.SWEEP)} x {swept} |" in rows["sweep, each of the four first classes"]
    assert f"| {wrong:,} |" in rows["wrong types"]
    per_arrangement = len(fuzz.CLASSES) * drawn + len(fuzz.SWEEP) * swept + wrong
    total = per_arrangement * len(fuzz.ARRANGEMENTS)
    assert f"That is {per_arrangement:,} requests per arrangement, {total:,} in all" in DOC
    assert set(fuzz.CLASSES) == {*fuzz.SWEEP, "encodings"}
