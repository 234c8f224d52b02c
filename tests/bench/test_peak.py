"""bench.peak: the CPU's arithmetic peak measured, the engine's matrix work counted from the model's weights, the
engine's fraction of the peak, and py-spy's samples put in their categories."""

from __future__ import annotations

import json
import platform

import pytest
from safetensors import safe_open

from bench.corpus.texts import wikitext_sentences
from bench.peak import alu, matmul
from bench.peak.engine_fraction import matrix_work, measure_engine
from bench.peak.where_time_goes import PYTHON, TORCH_OPS, UNRESOLVED, categorize, shares
from devkit.paths import minilm_dir
from model import load_checkpoint
from model.flops import packed_batch_flops

needs_int8_peak = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or not alu.runnable_loops()
    or alu.runnable_loops()[0].precision != "int8", reason="an x86-64 CPU with VNNI or AVX2")


@needs_int8_peak
def test_int8_peak_is_measured_against_float32s():
    peaks = {p.precision: p for p in alu.measure(seconds=0.05, repeats=2, thread_counts=[1])}
    assert peaks["int8"].ops_per_s > 1e9 and peaks["float32"].ops_per_s > 1e8
    # One VNNI instruction does 4 products a lane where FMA does 1, at the same width and (on every VNNI CPU) at
    # least half the rate. Without VNNI, vpmaddwd + vpaddd do 2 products a 32-bit lane where FMA does 1, at FMA's
    # rate (Zen, Skylake) or half of it (Haswell's one vpmaddwd a cycle). AMX's tile product does 16,384 in 16
    # cycles, 1,024 a cycle against two AVX-512 FMAs' 32 (Sapphire Rapids). A miscounted or folded loop breaks these.
    instruction = peaks["int8"].instruction
    low, high = (8, 64) if "AMX" in instruction else (2, 12) if "VNNI" in instruction else (0.8, 2.6)
    assert low <= peaks["int8"].ops_per_s / peaks["float32"].ops_per_s <= high


def test_torch_products_are_timed():
    found = matmul.measure([1], size=128, seconds=0.02, repeats=1)
    assert {p.precision for p in found} >= {"int8", "float32"}
    assert all(p.ops_per_s > 1e7 for p in found)


def test_matrix_work_is_the_linears_weights_and_attention_of_each_sentence():
    loaded = load_checkpoint(minilm_dir())
    config = loaded.config
    with safe_open(minilm_dir() / "model.safetensors", "pt") as weights:
        linear_weights = sum(weights.get_slice(name).get_shape()[0] * weights.get_slice(name).get_shape()[1]
                             for name in weights.keys()
                             if name.endswith(".weight") and ".encoder.layer." in f".{name}"
                             and "LayerNorm" not in name)
    lengths = [7, 30, 12]
    work = matrix_work(config, lengths)
    assert work.linear_ops == pytest.approx(2 * linear_weights * sum(lengths) / 3)
    attention = config.num_hidden_layers * 2 * 2 * config.hidden_size * sum(n * n for n in lengths) / 3  # QK^T, PV
    assert work.attention_ops == pytest.approx(attention)
    total, _ = packed_batch_flops(config, 3, 30, sum(lengths), sum(n * n for n in lengths), True)
    assert work.ops * 3 == pytest.approx(total)  # the service's own pricing of the same batch, no padding


@needs_int8_peak
def test_int8_engine_reaches_a_plausible_fraction_of_the_peak():
    peak = max(p.ops_per_s for p in alu.measure(seconds=0.05, repeats=2) if p.precision == "int8")
    rates = measure_engine(minilm_dir(), "all-MiniLM-L6-v2", "int8", wikitext_sentences(24), 0.5, (8,))
    assert [r.mode for r in rates] == ["batch 1", "bulk"]
    for rate in rates:
        assert 0 < rate.ops_per_s / peak < 1.5, rate
    assert rates[1].batch_size == 8 and rates[0].batch_size == 1


def test_samples_go_to_the_innermost_named_part():
    raw = [
        "thread (1): MainThread;run (engine.py:3);int8_layer;int8_layer._omp_fn.0;rows_times_blocks 60",
        "thread (1): MainThread;run (engine.py:3);int8_layer;int8_layer._omp_fn.0 10",
        "thread (1): MainThread;run (engine.py:3);int8_layer;attention_share 20",
        "thread (1): MainThread;run (engine.py:3);at::native::mean 5",
        "thread (1): MainThread;run (engine.py:3);0x7f00abcd 3",
        "thread (1): MainThread;collate (engine.py:9) 2",
        "not a sample",
    ]
    found = shares(raw)
    assert found == pytest.approx({"int8 products": 0.6, "attention (float32)": 0.2,
                                   "dequantize + GELU (inlined in int8_layer)": 0.1, TORCH_OPS: 0.05,
                                   UNRESOLVED: 0.03, PYTHON: 0.02})
    assert categorize(["main (a.py:1)", "quantize_rows"]) == "quantize rows"


@needs_int8_peak
def test_quick_run_prints_the_tables_and_writes_the_figures(tmp_path, capsys):
    from bench.peak.run import main

    main(["--quick", "--models", "minilm", "--precisions", "int8", "--no-profile", "--sentences", "16",
          "--json", str(tmp_path / "peak.json")])
    printed = capsys.readouterr().out
    assert ("| int8 | AVX" in printed or "| int8 | AMX" in printed) and "| all-MiniLM-L6-v2 | int8 | bulk |" in printed
    figures = json.loads((tmp_path / "peak.json").read_text())
    assert 0 < figures["int8_bulk_fraction"]["all-MiniLM-L6-v2"] < 1.5
