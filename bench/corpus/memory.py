"""Peak memory of the corpus job at 1x, 10x and 100x the rows: the job streams, so its peak RSS should not grow with
the corpus.

The model is the bundled one cut to 1 layer (random weights: only the memory and the pipeline matter here, and one
layer makes 100x the rows a matter of minutes). The corpus is WikiText-2's test sentences, repeated to each size,
in a plain text file. Each size runs `python -m corpus embed` in a process of its own; its peak RSS is the
kernel's count for that process (wait4's ru_maxrss).

    .venv/bin/python -m bench.corpus.memory                      # 1x, 10x, 100x of 4,000 sentences
    .venv/bin/python -m bench.corpus.memory --base-rows 1000 --multiples 1 10
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devkit.paths import REPO_ROOT, WIKITEXT_TEST
from service.settings import DEFAULT_CHECKPOINT


def one_layer_checkpoint(into: Path) -> Path:
    """The bundled model's shape and tokenizer with one encoder layer of random weights."""
    from dataclasses import replace

    import torch

    from model import BertForPreTraining, load_checkpoint, save_checkpoint

    bundled = load_checkpoint(DEFAULT_CHECKPOINT)
    torch.manual_seed(0)
    model = BertForPreTraining(replace(bundled.config, num_hidden_layers=1)).eval()
    save_checkpoint(into, model, bundled.tokenizer, metadata={"note": "1 layer, random weights: bench.corpus.memory"})
    return into


def sentences() -> list[str]:
    from trainer.data.corpus import read_documents

    return [s for d in read_documents(WIKITEXT_TEST) for s in d.sentences if 4 <= len(s.split()) <= 100]


def write_corpus(path: Path, base: list[str], rows: int) -> Path:
    with open(path, "w", encoding="utf-8") as handle:
        for index in range(rows):
            handle.write(base[index % len(base)] + "\n")
    return path


def peak_rss(command: list[str]) -> tuple[int, float, str]:
    """(peak RSS in bytes, seconds, stdout) of `command` run to its end."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    stdout = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)}: exit status {process.returncode}")
    return usage.ru_maxrss * 1024, seconds, stdout  # ru_maxrss is in KiB on Linux


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-rows", type=int, default=4000, help="rows at 1x")
    parser.add_argument("--multiples", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args(argv)
    base = sentences()
    with tempfile.TemporaryDirectory(prefix="corpus-memory-") as work:
        work = Path(work)
        checkpoint = one_layer_checkpoint(work / "one-layer")
        print(f"# corpus job's peak RSS, {len(base)} WikiText-2 test sentences repeated; 1-layer model; "
              f"--dtype {args.dtype}; {os.cpu_count()} CPUs")
        print("| rows | peak RSS (MiB) | seconds | rows/s |\n|---:|---:|---:|---:|")
        for multiple in args.multiples:
            rows = args.base_rows * multiple
            corpus = write_corpus(work / f"corpus-{rows}.txt", base, rows)
            output = work / f"out-{rows}"
            rss, seconds, _ = peak_rss([sys.executable, "-m", "corpus", "embed", str(corpus), "--output", str(output),
                                        "--checkpoint", str(checkpoint), "--dtype", args.dtype, "--truncate"])
            print(f"| {rows:,} | {rss / 2**20:.0f} | {seconds:.1f} | {rows / seconds:.0f} |", flush=True)
            corpus.unlink()
            subprocess.run(["rm", "-rf", str(output)], check=True)


if __name__ == "__main__":
    main()
