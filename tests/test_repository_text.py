"""The repository speaks of the product alone: no tracked file names a path of the machine it was written on, or
notes on how the work was organised. Generated files (BENCHMARKS.md's report, the bundled checkpoint's metadata and
card, the GPU run summaries) are covered too; their generators write through model.provenance."""

from __future__ import annotations

import re
import subprocess

import pytest

from devkit.paths import REPO_ROOT

# Written in pieces so that this file does not match itself.
FORBIDDEN = re.compile("|".join([
    r"/wo" r"rk/", r"/ro" r"ot/", r"/ho" r"me/", r"/op" r"t/torch", r"\.lib" r"rary/",  # machine paths
    r"\b[Ss]ess" r"ions? [0-9]+", r"GPU (was |has been )?le" r"nt\b", r"no GPU le" r"nt", r"dev" r"ice tool",
    r"KIN" r"DS\.md",  # internal bookkeeping
]))


def tracked_text_files() -> list[str]:
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout ({exc}): nothing to list")
    return [name for name in listed.stdout.decode().split("\0") if name]


def test_no_tracked_file_names_a_machine_path_or_internal_bookkeeping():
    hits = []
    for name in tracked_text_files():
        path = REPO_ROOT / name
        if not path.is_file():  # deleted in the work tree, not yet committed
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            found = FORBIDDEN.search(line)
            if found:
                hits.append(f"{name}:{number}: {found.group(0)!r} in {line.strip()[:120]}")
    assert not hits, "\n".join(hits)


def test_the_pattern_catches_what_it_is_for():
    for text in ("python -m bench.report --infinity /wo" "rk/main/.venv-peers/bin/infinity_emb",
                 '"cache_dir": "/ro' 'ot/.cache/bert-serve"', "measured in sess" "ion 43", "No GPU was le" "nt to this"):
        assert FORBIDDEN.search(text), text
    for text in ("GET /v1/embeddings", "a lent-out book", "../shared/data/wikitext-2", "~/.cache/bert-serve"):
        assert not FORBIDDEN.search(text), text


def test_no_python_file_is_over_400_lines():
    """Small files with one job each: past 400 lines a file holds more than one (split it by job)."""
    long = []
    for name in tracked_text_files():
        path = REPO_ROOT / name
        if name.endswith(".py") and path.is_file():
            lines = path.read_text(encoding="utf-8").count("\n")
            if lines > 400:
                long.append(f"{name}: {lines} lines")
    assert not long, long


def test_only_the_benchmarks_tests_import_the_benchmarks():
    """bench/ is not part of the product: a test elsewhere that imports it ties the product's tests to it."""
    import ast

    found = []
    for name in tracked_text_files():
        if not (name.startswith("tests/") and name.endswith(".py")) or name.startswith("tests/bench/"):
            continue
        path = REPO_ROOT / name
        if not path.is_file():
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            found += [f"{name}:{node.lineno}: {m}" for m in modules if m == "bench" or m.startswith("bench.")]
    assert not found, found
