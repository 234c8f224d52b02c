"""The training loop end to end on a tiny corpus: learning, resume, torchrun, outputs, errors, signals."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

from devkit.paths import REPO_ROOT
from model.provenance import portable_text
from tests.trainer.conftest import tiny_run_args
from trainer.cli import main

PYTHON = sys.executable
RUN = {"--max-steps": 40, "--lr": 3e-3}


def run_cli(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "trainer", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(directory / "model.safetensors")


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    # The `tokenizers` trainer breaks frequency ties in hash order, so two trainings of one corpus may
    # differ in a few vocabulary entries. The trainer caches the tokenizer per corpus and vocabulary
    # size; runs compared for bit-equality share that cache, as repeated runs on one machine do.
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, small_corpus, small_eval_corpus, shared_cache):
    output = tmp_path_factory.mktemp("run") / "out"
    # A process of its own, as the runs compared with it: torch's thread count (which another test in this process
    # may have set) changes the sums' rounding, so bit-equal weights need equal thread counts.
    finished = run_cli(tiny_run_args(small_corpus, small_eval_corpus, output, shared_cache, **RUN))
    assert finished.returncode == 0, finished.stderr
    return output


def test_loss_falls_and_run_files_are_written(finished_run):
    rows = [json.loads(line) for line in (finished_run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "loss" in r]
    evals = [r["eval"] for r in rows if "eval" in r]
    # Held-out loss on fixed pairs and masks falls at every evaluation (per-step loss on batch 8 is noisy).
    eval_losses = [e["mlm_loss"] for e in evals]
    assert eval_losses[-1] < eval_losses[0] - 0.15
    assert eval_losses[-1] < math.log(600) - 0.4  # well below a uniform guess over the vocabulary
    assert sum(r["mlm_loss"] for r in train[-5:]) / 5 < train[0]["mlm_loss"] - 0.3
    assert (finished_run / "training_curves.png").read_bytes()[:4] == b"\x89PNG"
    metadata = json.loads((finished_run / "training_metadata.json").read_text())
    assert metadata["eval"] == evals[-1]
    assert metadata["progress"]["step"] == 40 and metadata["data"]["train_documents"] > 2
    assert (finished_run / "checkpoints").is_dir()


def test_run_files_name_no_absolute_path(finished_run, small_corpus):
    """The metadata travels with the checkpoint: its command and options name paths as a reader elsewhere can take
    them (model.provenance), not where this machine keeps them."""
    text = (finished_run / "training_metadata.json").read_text()
    metadata = json.loads(text)
    for machine_path in (str(finished_run.parent), str(small_corpus.parent), str(Path.home()) + "/"):
        assert machine_path not in text
    assert metadata["options"]["output"] == "out" and small_corpus.name in metadata["command"]


def test_output_opens_in_transformers(finished_run):
    model = transformers.BertForPreTraining.from_pretrained(finished_run).eval()
    tokenizer = transformers.BertTokenizerFast.from_pretrained(finished_run)
    inputs = tokenizer("the river flows", "into the sea", return_tensors="pt")
    from model import load_checkpoint

    ours = load_checkpoint(finished_run)
    assert inputs["input_ids"][0].tolist() == ours.tokenizer.encode("the river flows", "into the sea").ids
    with torch.no_grad():
        theirs = model(**inputs).seq_relationship_logits
        mine = ours.model(inputs["input_ids"], inputs["token_type_ids"]).nsp_logits
    assert (theirs - mine).abs().max() < 1e-5


def test_a_continued_run_records_what_it_continued_and_its_card_tells_both(tmp_path, small_corpus, small_eval_corpus,
                                                                          finished_run, shared_cache):
    from trainer.export import export

    continued = tmp_path / "continued"
    assert main(tiny_run_args(small_corpus, small_eval_corpus, continued, shared_cache, **{
        "--init-from": finished_run, "--max-steps": 6, "--lr": 1e-3})) == 0
    metadata = json.loads((continued / "training_metadata.json").read_text())
    assert metadata["started_from"]["progress"]["step"] == 40 and metadata["progress"]["step"] == 6
    card = (export(continued, tmp_path / "exported", torch.float16) / "README.md").read_text()
    assert "Trained in 2 runs" in card and "46 optimizer steps" in card and "peak learning rate 0.003 then 0.001" in card
    assert f"`{metadata['started_from']['command']}`" in card  # the first run's command, as recorded
    assert str(tmp_path) not in card and str(finished_run) not in card


def test_a_run_resumed_with_other_rates_records_both_commands_and_its_card_tells_them(tmp_path, small_corpus,
                                                                                      small_eval_corpus, shared_cache):
    from trainer.export import export

    output = tmp_path / "out"
    first = tiny_run_args(small_corpus, small_eval_corpus, output, shared_cache, **{"--max-steps": 4, "--lr": 1e-3})
    assert main(first) == 0
    second = tiny_run_args(small_corpus, small_eval_corpus, output, shared_cache,
                           **{"--max-steps": 8, "--lr": 5e-4, "--resume": True})
    assert main(second) == 0
    metadata = json.loads((output / "training_metadata.json").read_text())
    commands = metadata["commands"]
    assert [c["from_step"] for c in commands] == [0, 4]
    assert "--lr 0.001" in commands[0]["command"] and "--lr 0.0005 --resume" in commands[1]["command"]
    assert metadata["command"] == commands[1]["command"] == portable_text("python -m trainer " + " ".join(second))
    assert main(second) == 0  # the same command again adds nothing
    assert json.loads((output / "training_metadata.json").read_text())["commands"] == commands
    card = (export(output, tmp_path / "exported", torch.float16) / "README.md").read_text()
    assert f"- Command: `{commands[0]['command']}`; from step 4: `{commands[1]['command']}`" in card


def test_second_run_reuses_the_token_cache(tmp_path, small_corpus, small_eval_corpus):
    cache = tmp_path / "cache"
    args = lambda out: tiny_run_args(small_corpus, small_eval_corpus, tmp_path / out, cache, **{"--max-steps": 1})  # noqa: E731
    assert main(args("a")) == 0
    caches = sorted((cache / "tokens").iterdir())
    stamps = [p.stat().st_mtime_ns for p in caches]
    assert main(args("b")) == 0
    assert [p.stat().st_mtime_ns for p in sorted((cache / "tokens").iterdir())] == stamps  # read, not rewritten


def test_killed_run_resumes_to_identical_weights(tmp_path, small_corpus, small_eval_corpus, finished_run, shared_cache):
    """kill -9 after the first checkpoint, then --resume: same final weights as the uninterrupted run."""
    cache = shared_cache
    output = tmp_path / "out"
    args = tiny_run_args(small_corpus, small_eval_corpus, output, cache, **RUN)
    process = subprocess.Popen([PYTHON, "-m", "trainer", *args], cwd=REPO_ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (output / "checkpoints" / "step-0000008").is_dir():
        assert process.poll() is None and time.time() < deadline, "the run ended before its second checkpoint"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert not (output / "model.safetensors").exists()  # no final checkpoint under the output name

    resumed = run_cli([*args, "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from step" in resumed.stderr
    expected = weights(finished_run)
    got = weights(output)
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


def test_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path, small_corpus, small_eval_corpus, finished_run,
                                                              shared_cache):
    output = tmp_path / "out"
    shutil.copytree(finished_run / "checkpoints", output / "checkpoints")
    newest = sorted((output / "checkpoints").iterdir())[-1]
    data = bytearray((newest / "model.safetensors").read_bytes())
    data[-100] ^= 0xFF  # one flipped byte inside a tensor: safetensors itself would not notice
    (newest / "model.safetensors").write_bytes(bytes(data))
    args = tiny_run_args(small_corpus, small_eval_corpus, output, shared_cache, **RUN)
    resumed = run_cli([*args, "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert "skipping damaged checkpoint" in resumed.stderr and "checksum mismatch" in resumed.stderr
    for name, tensor in weights(finished_run).items():
        assert torch.equal(weights(output)[name], tensor), name


def test_sigterm_saves_and_exits_cleanly(tmp_path, small_corpus, small_eval_corpus):
    output = tmp_path / "out"
    args = tiny_run_args(small_corpus, small_eval_corpus, output, tmp_path / "cache",
                         **{"--max-steps": 100000, "--save-every": 100000})
    process = subprocess.Popen([PYTHON, "-m", "trainer", *args], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (output / "metrics.jsonl").is_file():
        assert process.poll() is None and time.time() < deadline
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM
    assert "Traceback" not in stderr and "continue with --resume" in stderr
    saved = list((output / "checkpoints").iterdir())
    assert len(saved) == 1 and (saved[0] / "training_state.json").is_file()


def test_two_process_torchrun_matches_single_process(tmp_path, small_corpus, small_eval_corpus):
    # float32: bfloat16 rounding differs with how a batch is split, and this compares the split itself
    common = {"--max-steps": 6, "--dropout": 0.0, "--batch-size": 8, "--save-every": 100, "--precision": "float32"}
    single = run_cli(tiny_run_args(small_corpus, small_eval_corpus, tmp_path / "one", tmp_path / "cache", **common))
    assert single.returncode == 0, single.stderr
    torchrun = Path(PYTHON).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    double = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "trainer",
         *tiny_run_args(small_corpus, small_eval_corpus, tmp_path / "two", tmp_path / "cache", **common)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env,
    )
    assert double.returncode == 0, double.stderr[-3000:]
    one, two = weights(tmp_path / "one"), weights(tmp_path / "two")
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=2e-5, msg=name)


def test_the_fixed_shape_step_trains_as_the_step_at_each_batchs_shape(tmp_path, small_corpus, small_eval_corpus,
                                                                      shared_cache, monkeypatch):
    """The loop with the step a CUDA graph replays (`--cuda-graphs`: batches padded to --max-seq-len, masks in fixed
    slots), run eagerly on this CPU (no CUDA graphs here): the same losses step after step and the same weights."""
    common = {"--max-steps": 6, "--dropout": 0.0, "--save-every": 100, "--precision": "float32"}
    assert main(tiny_run_args(small_corpus, small_eval_corpus, tmp_path / "as-is", shared_cache, **common)) == 0
    monkeypatch.setattr("trainer.loop.replays_cuda_graphs", lambda options, placement: True)
    assert main(tiny_run_args(small_corpus, small_eval_corpus, tmp_path / "fixed", shared_cache, **common)) == 0
    runs = [[json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
            for run in ("as-is", "fixed")]
    losses = [[(r["mlm_loss"], r["nsp_loss"], r["mlm_accuracy"]) for r in rows if "loss" in r] for rows in runs]
    assert len(losses[0]) == 3
    for as_is, fixed in zip(*losses):
        assert fixed == pytest.approx(as_is, rel=1e-4, abs=1e-6)
    one, two = weights(tmp_path / "as-is"), weights(tmp_path / "fixed")
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=2e-5, msg=name)


@pytest.mark.parametrize(
    "corpus_text, message",
    [(None, "no such file or directory"), ("", "no text found"), ("just one document with one sentence.", "only 1 document(s)")],
)
def test_bad_corpora_give_clear_errors(tmp_path, corpus_text, message):
    corpus = tmp_path / "corpus.txt"
    if corpus_text is not None:
        corpus.write_text(corpus_text)
    result = run_cli(["--corpus", str(corpus), "--output", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "c"),
                      "--max-steps", "1", "--no-progress"])
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_unwritable_output_is_a_clear_error(tmp_path, small_corpus):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = run_cli(["--corpus", str(small_corpus), "--output", str(blocker / "out"), "--max-steps", "1"])
    assert result.returncode == 1
    assert "Traceback" not in result.stderr and "error:" in result.stderr
