"""model.provenance: recorded commands and facts name no machine's absolute paths."""

from __future__ import annotations

from pathlib import Path

from model.provenance import portable, portable_path, portable_text

ROOT, HOME = Path("/srv/checkout/bert-serve"), Path("/u/someone")


def test_paths_are_written_relative_to_the_repository_its_parent_or_home():
    assert portable_path("/srv/checkout/bert-serve/checkpoints/x", ROOT, HOME) == "checkpoints/x"
    assert portable_path("/srv/checkout/bert-serve", ROOT, HOME) == "."
    assert portable_path("/srv/checkout/shared/data/wikitext-2", ROOT, HOME) == "../shared/data/wikitext-2"
    assert portable_path("/u/someone/.cache/bert-serve", ROOT, HOME) == "~/.cache/bert-serve"
    assert portable_path("/opt/v/lib/python3.12/site-packages/pkg/model", ROOT, HOME) == "<site-packages>/pkg/model"


def test_other_paths_keep_their_last_name_and_routes_stay():
    # /usr exists on any machine that runs this test: a machine path, shortened to the program's name
    assert portable_text("/usr/bin/python3 -m service --port 1", ROOT, HOME) == "python3 -m service --port 1"
    # no machine has a folder /v1: a route, not a path
    assert portable_text("POST /v1/embeddings, GET http://127.0.0.1:8000/live", ROOT, HOME) == \
        "POST /v1/embeddings, GET http://127.0.0.1:8000/live"


def test_json_values_are_rewritten_throughout():
    value = {"command": "python -m bench.gpu --out /u/someone/out", "steps": [1, "/srv/checkout/bert-serve/runs"],
             "ok": True, "n": 3.5}
    assert portable(value, ROOT, HOME) == {"command": "python -m bench.gpu --out ~/out", "steps": [1, "runs"],
                                           "ok": True, "n": 3.5}
