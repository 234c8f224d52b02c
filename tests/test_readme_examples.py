"""The README's curl examples, run as written against a live server on the bundled model; their outputs
must match what the README shows (numbers to 2e-3: float rounding differs between CPUs).

After retraining the bundled model, refresh the shown outputs with:
    BERT_UPDATE_README=1 .venv/bin/python -m pytest tests/test_readme_examples.py
"""

from __future__ import annotations

import os
import re
import subprocess

from devkit.server import start_service
from service.settings import DEFAULT_CHECKPOINT
from devkit.paths import REPO_ROOT

README = REPO_ROOT / "README.md"
EXAMPLE = re.compile(r"```bash\n(curl -s http://127\.0\.0\.1:8000[^`]*?)```\n\n```(json|text)\n(.*?)```", re.DOTALL)
NUMBER = re.compile(r"-?\d+\.\d+(?:e-?\d+)?")


def run_example(command: str, url: str) -> str:
    command = command.replace("http://127.0.0.1:8000", url)
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def same_up_to_rounding(shown: str, got: str) -> bool:
    if NUMBER.sub("#", shown) != NUMBER.sub("#", got):
        return False
    return all(abs(float(a) - float(b)) <= 2e-3 for a, b in zip(NUMBER.findall(shown), NUMBER.findall(got)))


def test_readme_curl_examples_give_the_outputs_shown():
    text = README.read_text()
    examples = EXAMPLE.findall(text)
    assert {re.search(r"8000(/[a-z-]+)", c).group(1) for c, _, _ in examples} >= {"/encode", "/fill-mask", "/nsp",
                                                                                    "/health"}
    process, url = start_service(DEFAULT_CHECKPOINT)
    try:
        outputs = [run_example(command, url) for command, _, _ in examples]
    finally:
        process.terminate()
        process.wait(timeout=60)
    if os.environ.get("BERT_UPDATE_README"):
        for (command, kind, shown), got in zip(examples, outputs):
            text = text.replace(f"```bash\n{command}```\n\n```{kind}\n{shown}```",
                                f"```bash\n{command}```\n\n```{kind}\n{got}\n```")
        README.write_text(text)
        return
    for (command, _, shown), got in zip(examples, outputs):
        assert same_up_to_rounding(shown.strip(), got), f"{command}\nREADME shows:\n{shown}\nserver gave:\n{got}"
