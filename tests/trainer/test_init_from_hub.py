"""--init-from takes a Hub id as --checkpoint does (through the local stand-in, tests/hub_stand_in.py)."""

from __future__ import annotations

import json

from tests.hub_stand_in import HubStandIn, files_of, use_stand_in
from tests.trainer.conftest import encoder_directory, tiny_run_args
from trainer.cli import main


def test_init_from_a_hub_id(tmp_path, tokenizer, small_corpus, small_eval_corpus, monkeypatch, capsys):
    hub = HubStandIn()
    commit = hub.add("test-org/encoder", files_of(encoder_directory(tmp_path / "start", tokenizer)))
    use_stand_in(monkeypatch, hub.start(), tmp_path / "hf")
    try:
        output = tmp_path / "out"
        args = tiny_run_args(small_corpus, small_eval_corpus, output, tmp_path / "cache",
                             **{"--init-from": "test-org/encoder", "--max-steps": 2, "--eval-every": 2})
        assert main(args) == 0
        metadata = json.loads((output / "training_metadata.json").read_text())
        assert metadata["warm_start"]["licence"] == "apache-2.0"  # read from the model card it fetched
        assert (output / "vocab.txt").read_text() == (tmp_path / "start" / "vocab.txt").read_text()
        assert any(path.endswith(f"/resolve/{commit}/model.safetensors") for path in hub.fetched())
        capsys.readouterr()
        bad = tiny_run_args(small_corpus, small_eval_corpus, tmp_path / "out2", tmp_path / "cache",
                            **{"--init-from": "test-org/no-such-encoder"})
        assert main(bad) == 2
        error = capsys.readouterr().err.strip().splitlines()
        assert error == [error[0]] and error[0].startswith("error: test-org/no-such-encoder: no such directory here")
    finally:
        hub.stop()
