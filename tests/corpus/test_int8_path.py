"""An int8 output holds vectors of one kind: its manifest records the int8 path that made them
(kernels.int8_path_identity), and a resume on a host whose int8 path gives other bits is refused, naming both."""

from __future__ import annotations

import subprocess
import sys

import pytest

from devkit.paths import REPO_ROOT
from kernels import int8_layer, int8_path_identity
from tests.corpus.job_helpers import embed_args, manifest, read_output, run_cli, sentences, write_jsonl

# `python -m corpus` on a host without the whole-layer C kernel (no AVX512-VNNI, or no compiler): its int8 layers
# run as modules, with torch's attention above the attention kernel's longest sequence.
WITHOUT_THE_C_LAYER = """
import sys
from kernels import int8_layer
int8_layer.kernel = lambda: None
from corpus.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.skipif(int8_layer.kernel() is None, reason=f"no C layer here to differ from: {int8_layer.why_not()}")
def test_a_resume_on_a_host_with_another_int8_path_is_refused_naming_both(tmp_path, tiny_checkpoint):
    source = write_jsonl(tmp_path / "corpus.jsonl", sentences(24))
    output = tmp_path / "out"
    args = embed_args(source, output, tiny_checkpoint, "--dtype", "int8", "--rows-per-shard", "8")
    other_host = subprocess.run([sys.executable, "-c", WITHOUT_THE_C_LAYER, *args], cwd=REPO_ROOT,
                                capture_output=True, text=True, timeout=300)
    assert other_host.returncode == 0, other_host.stderr
    theirs, ours = manifest(output)["identity"]["int8_path"], int8_path_identity()
    assert theirs != ours and f"attention in C ({int8_layer.kernel().attention}) at every length" in ours
    written = read_output(output)

    refused = run_cli(args)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert f"this output was made with --int8-path {theirs}, this run asks for {ours}" in refused.stderr
    assert read_output(output)["id"] == written["id"]  # nothing of ours was added

    fresh = tmp_path / "fresh"
    done = run_cli(embed_args(source, fresh, tiny_checkpoint, "--dtype", "int8", "--rows-per-shard", "8"))
    assert done.returncode == 0, done.stderr
    assert manifest(fresh)["identity"]["int8_path"] == ours and run_cli(
        embed_args(source, fresh, tiny_checkpoint, "--dtype", "int8", "--rows-per-shard", "8")).returncode == 0


def test_only_int8_outputs_record_an_int8_path(tmp_path, tiny_checkpoint):
    source = write_jsonl(tmp_path / "corpus.jsonl", sentences(4))
    done = run_cli(embed_args(source, tmp_path / "out", tiny_checkpoint, "--dtype", "float32"))
    assert done.returncode == 0, done.stderr
    assert "int8_path" not in manifest(tmp_path / "out")["identity"]
