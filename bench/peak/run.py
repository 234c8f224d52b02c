"""The limit every performance claim should be read against: this machine's own peak, and the fraction of it the
engine reaches.

1. Peak (bench/peak/alu.py, matmul.py): the arithmetic peak of each precision from register-resident
   multiply-accumulate loops (int8 VNNI, or AVX2's vpmaddwd without it, float32 FMA, bfloat16 dot products), and what
   torch's large square products reach, on one core and on all of them.
2. The engine (bench/peak/engine_fraction.py): its matrix work per second, counted from the model's shape and the
   tokens run, at batch 1 and in bulk, in int8, float32 and bfloat16, for all-MiniLM-L6-v2 and the bundled model,
   over the peak of the precision it runs in, all cores.
3. Where int8's time goes in bulk (bench/peak/where_time_goes.py), when it is under the target share of the int8
   peak (issue #61: 60%).

    python -m bench.peak                      # the full run: ~6 minutes on 2 cores
    python -m bench.peak --quick              # a smoke run: seconds a part
    python -m bench.peak --json peak.json     # also write the figures
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import random
import shlex
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from bench.corpus.texts import wikitext_sentences, write_corpus
from bench.peak import alu, matmul
from bench.peak.engine_fraction import EngineRate, measure_engine
from devkit.paths import minilm_dir
from model.device import cpu_has_native_bf16
from service.settings import DEFAULT_CHECKPOINT

INT8_BULK_TARGET = 0.60  # of the int8 ALU peak, matrix work only (issue #61)
MODELS = {"minilm": "all-MiniLM-L6-v2", "bundled": "bundled"}


def cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), platform.machine())


def peak_of(peaks: list, precision: str, threads: int) -> float | None:
    return next((p.ops_per_s for p in peaks if p.precision == precision and p.threads == threads), None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--precisions", nargs="+", default=["int8", "float32", "bfloat16"],
                        choices=["int8", "float32", "bfloat16"], help="bfloat16 runs only where the CPU has it")
    parser.add_argument("--sentences", type=int, default=2000, help="WikiText-2 test sentences the engine runs")
    parser.add_argument("--seconds", type=float, default=24.0, help="the engine's timing per model and precision")
    parser.add_argument("--bulk", type=int, nargs="+", default=[64, 128], help="bulk batch sizes (the best kept)")
    parser.add_argument("--peak-seconds", type=float, default=0.5, help="each peak loop's timing (best of 3)")
    parser.add_argument("--matmul-size", type=int, default=2048, help="the square matrices' side")
    parser.add_argument("--profile-seconds", type=float, default=10.0, help="py-spy's sampling of int8 in bulk")
    parser.add_argument("--no-profile", action="store_true", help="skip where int8's time goes")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run in well under a minute a part")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.quick:
        args.sentences, args.seconds, args.bulk = 64, 1.0, [32]
        args.peak_seconds, args.matmul_size, args.profile_seconds = 0.05, 256, 2.0
    precisions = [p for p in args.precisions if p != "bfloat16" or cpu_has_native_bf16()]
    cores = alu.usable_cores()

    print(f"# peak: register-resident loops, then torch's products ({cores} cores)", file=sys.stderr, flush=True)
    alu_peaks = alu.measure(args.peak_seconds, thread_counts=sorted({1, cores}))
    matmul_peaks = matmul.measure(sorted({1, cores}), args.matmul_size, args.peak_seconds)
    texts = wikitext_sentences(args.sentences)
    random.Random(0).shuffle(texts)
    rates: list[EngineRate] = []
    for label in args.models:
        checkpoint = minilm_dir() if label == "minilm" else Path(DEFAULT_CHECKPOINT)
        for precision in precisions:
            print(f"# {MODELS[label]}: the engine in {precision}", file=sys.stderr, flush=True)
            rates += measure_engine(checkpoint, MODELS[label], precision, texts, args.seconds, tuple(args.bulk))

    int8_peak = peak_of(alu_peaks, "int8", cores)
    bulk_int8 = {r.model: r.ops_per_s / int8_peak for r in rates
                 if r.precision == "int8" and r.mode == "bulk" and int8_peak}
    profiles = {}
    if not args.no_profile:
        from bench.peak.where_time_goes import profile

        with tempfile.TemporaryDirectory() as work:
            texts_file = write_corpus(Path(work) / "texts.txt", texts)
            for label in args.models:
                if MODELS[label] in bulk_int8 and bulk_int8[MODELS[label]] < INT8_BULK_TARGET:
                    print(f"# {MODELS[label]}: where int8's time goes (py-spy)", file=sys.stderr, flush=True)
                    checkpoint = minilm_dir() if label == "minilm" else Path(DEFAULT_CHECKPOINT)
                    found = profile(checkpoint, texts_file, max(args.bulk), args.profile_seconds)
                    work = next(r.work for r in rates if r.model == MODELS[label] and r.precision == "int8")
                    found["fraction_of_one_core_int8_peak"] = _fraction(found["sentences_per_s"] * work.ops,
                                                                        peak_of(alu_peaks, "int8", 1))
                    profiles[MODELS[label]] = found

    command = "python -m bench.peak " + shlex.join(sys.argv[1:] if argv is None else argv)
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(report(cpu_model(), cores, command, date, alu_peaks, matmul_peaks, rates, bulk_int8, profiles,
                 one_core_int8=peak_of(alu_peaks, "int8", 1)))
    if args.json:
        figures = {"cpu": cpu_model(), "cores": cores, "command": command, "date": date,
                   "alu_peaks": [asdict(p) for p in alu_peaks], "matmul_peaks": [asdict(p) for p in matmul_peaks],
                   "engine": [{**asdict(r), "ops_per_s": r.ops_per_s,
                               "fraction_of_alu_peak": _fraction(r.ops_per_s, peak_of(alu_peaks, r.precision, cores)),
                               "fraction_of_matmul_peak": _fraction(r.ops_per_s,
                                                                    peak_of(matmul_peaks, r.precision, cores))}
                              for r in rates],
                   "int8_bulk_target": INT8_BULK_TARGET, "int8_bulk_fraction": bulk_int8,
                   "where_int8_time_goes": profiles}
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


def report(cpu: str, cores: int, command: str, date: str, alu_peaks, matmul_peaks, rates, bulk_int8: dict,
           profiles: dict, one_core_int8: float | None) -> str:
    """The markdown tables: peaks, the engine's fraction of them, the verdict, where int8's time goes."""
    lines = [f"\n{cpu}, {cores} cores; `{command}`; {date}\n",
             "| precision | arithmetic peak: instruction | 1 core | all cores | torch's products (square) | 1 core "
             "| all cores |", "|---|---|---|---|---|---|---|"]
    for precision in ("int8", "float32", "bfloat16"):
        loop = next((p for p in alu_peaks if p.precision == precision), None)
        product = next((p for p in matmul_peaks if p.precision == precision), None)
        if loop is None and product is None:
            continue
        call = "torch._int_mm" if precision == "int8" else "torch.matmul"
        instruction = loop.instruction if loop else "–"
        lines.append(f"| {precision} | {instruction} | {_g(peak_of(alu_peaks, precision, 1))} | "
                     f"{_g(peak_of(alu_peaks, precision, cores))} | {f'{call} {product.size}²' if product else '–'} "
                     f"| {_g(peak_of(matmul_peaks, precision, 1))} | {_g(peak_of(matmul_peaks, precision, cores))} |")
    lines += ["", "G(FL)OP/s; a multiply and an add = 2. The engine's matrix work: the Linear products and attention's "
              "QK^T and PV the sentences need (no padding).", "",
              "| model | precision | mode | arrangement | sentences/s | matrix GOP/s | of the arithmetic peak "
              "| of torch's products |", "|---|---|---|---|---|---|---|---|"]
    for r in rates:
        arrangement = f"batch {r.batch_size}" + (f" x {r.parallel} in parallel" if r.parallel > 1 else "")
        lines.append(f"| {r.model} | {r.precision} | {r.mode} | {arrangement} | {r.sentences_per_s:,.0f} | "
                     f"{r.ops_per_s / 1e9:.0f} | {_share(r.ops_per_s, peak_of(alu_peaks, r.precision, cores))} | "
                     f"{_share(r.ops_per_s, peak_of(matmul_peaks, r.precision, cores))} |")
    for model, fraction in bulk_int8.items():
        verdict = "met" if fraction >= INT8_BULK_TARGET else "**not met**"
        lines.append(f"\n{model}: int8 in bulk reaches {fraction:.0%} of the int8 arithmetic peak "
                     f"(target ≥ {INT8_BULK_TARGET:.0%}: {verdict}).")
    for model, found in profiles.items():
        products_share = found["shares"].get("int8 products", 0.0)
        work = next(r.work for r in rates if r.model == model and r.precision == "int8")
        products_rate = found["sentences_per_s"] * work.linear_ops / products_share if products_share else 0.0
        lines += [f"\nWhere int8's time goes, {model}, bulk (batch {found['batch_size']}, one core, "
                  f"{found['sentences_per_s']:,.0f} sentences/s while sampled; py-spy, native frames):", "",
                  "| part | share of the time |", "|---|---|"]
        lines += [f"| {category} | {share:.0%} |" for category, share in found["shares"].items()]
        if products_rate and one_core_int8:
            # One core alone, out of the other core's way: the steadiest figure on a shared machine.
            lines.append(f"\nOn one core while sampled the engine reaches "
                         f"{found['sentences_per_s'] * work.ops / one_core_int8:.0%} of one core's int8 arithmetic "
                         f"peak. The products themselves run at {products_rate / 1e9:.0f} GOP/s while they run, "
                         f"{products_rate / one_core_int8:.0%} of it; everything else is {1 - products_share:.0%} of "
                         f"the time.")
    return "\n".join(lines)


def _g(ops_per_s: float | None) -> str:
    return "–" if ops_per_s is None else f"{ops_per_s / 1e9:,.0f}"


def _fraction(ops_per_s: float, peak: float | None) -> float | None:
    return ops_per_s / peak if peak else None


def _share(ops_per_s: float, peak: float | None) -> str:
    return "–" if not peak else f"{ops_per_s / peak:.0%}"
