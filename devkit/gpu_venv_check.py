"""Rehearse bench.gpu on a Python shaped like the GPU machines' (`python -m devkit.gpu_venv_check`).

There, `python3` is itself a virtual environment holding torch and little of what the service needs. This
builds one like it here: a venv with only torch, transformers, tokenizers, safetensors, httpx, pytest, numpy and
matplotlib (at the pins of requirements/serve.txt and dev.txt), in a copy of the committed tree; then
`make gpu-wheels` for this Python (network: PyPI); then WikiText-2 copied into the tree's .data/wikitext-2, as it
is carried to the GPU machine (nothing is beside the tree); then `python -m bench.gpu --dry-run` with the network cut
(`unshare -rn`, where it works), which must install the wheels itself and pass. Minutes; needs PyPI.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from devkit.paths import REPO_ROOT, WIKITEXT_DIR

ONLY = ("torch", "transformers", "tokenizers", "safetensors", "httpx", "pytest", "numpy", "matplotlib")


def pinned(names: tuple[str, ...]) -> list[str]:
    text = "\n".join((REPO_ROOT / "requirements" / f).read_text() for f in ("serve.txt", "dev.txt"))
    pins = {}
    for name in names:
        match = re.search(rf"^{re.escape(name)}==(\S+)", text, re.MULTILINE | re.IGNORECASE)
        pins[name] = f"{name}=={match.group(1)}" if match else name
    return list(pins.values())


def offline(command: list[str]) -> list[str]:
    """`command` in a network namespace of its own (no network but loopback, which starts down there and
    the benchmarks' servers need), where unprivileged namespaces and `ip` work; else as it is."""
    works = shutil.which("unshare") and shutil.which("ip") and \
        subprocess.run(["unshare", "-rn", "ip", "link", "set", "lo", "up"], capture_output=True).returncode == 0
    return ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *command] if works else command


def check(work: Path) -> int:
    tree = work / "tree"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", "HEAD"], cwd=REPO_ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    (tree / ".data").mkdir()
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    steps = [
        [str(python), "-m", "pip", "install", "-q", *pinned(ONLY)],
        ["make", "-C", str(tree), "gpu-wheels", f"PYTHON={python}",
         f"GPU_PYTHON={sys.version_info.major}.{sys.version_info.minor}"],
        # as on the GPU machine: no BERT_WIKITEXT_DIR, the copy in .data/wikitext-2 (docs/gpu.md)
        ["cp", "-r", str(WIKITEXT_DIR), str(tree / ".data" / "wikitext-2")],
        offline(["env", "-u", "BERT_WIKITEXT_DIR", str(python), "-m", "bench.gpu", "--dry-run",
                 "--out", str(work / "out")]),
    ]
    for step in steps:
        print("$ " + " ".join(step), flush=True)
        if subprocess.run(step, cwd=tree).returncode:
            print(f"failed: {' '.join(step)}", file=sys.stderr)
            return 1
    print((work / "out" / "gpu-summary.md").read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", type=Path, default=None, help="work here and keep it (default: a temporary folder)")
    args = parser.parse_args(argv)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        return check(args.keep)
    with tempfile.TemporaryDirectory(prefix="gpu-venv-check-") as scratch:
        return check(Path(scratch))


if __name__ == "__main__":
    sys.exit(main())
