"""The curl and Python examples of the README and docs/examples.md, run as written against a live server on
the bundled model in float32 (what the pages show: `--dtype auto` may serve bfloat16 on a CPU that has it natively,
README.md says so); their outputs must match what the pages show (numbers to 2e-3: float rounding differs between
CPUs).

After retraining the bundled model, refresh the shown outputs with:
    BERT_UPDATE_README=1 .venv/bin/python -m pytest tests/test_readme_examples.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from devkit.server import start_service
from service.settings import DEFAULT_CHECKPOINT
from devkit.paths import REPO_ROOT

PAGES = [REPO_ROOT / "README.md", REPO_ROOT / "docs" / "examples.md"]  # the first screen, then the rest
EXAMPLE = re.compile(
    r"```(bash|python)\n((?:curl -s |from )[^`]*?http://127\.0\.0\.1:8000[^`]*?)```\n\n```(json|text)\n(.*?)```",
    re.DOTALL)
NUMBER = re.compile(r"-?\d+\.\d+(?:e-?\d+)?")


# LangChain and LlamaIndex live in the clients' own environment (requirements/clients.txt).
CLIENTS_PYTHON = os.environ.get("BERT_CLIENTS_PYTHON", str(REPO_ROOT / ".venv-clients" / "bin" / "python"))


def run_example(language: str, command: str, url: str) -> str:
    command = command.replace("http://127.0.0.1:8000", url)
    python = CLIENTS_PYTHON if re.search(r"^from (langchain|llama_index)", command, re.MULTILINE) else sys.executable
    runner = ["bash", "-c"] if language == "bash" else [python, "-c"]
    result = subprocess.run([*runner, command], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def same_up_to_rounding(shown: str, got: str) -> bool:
    if NUMBER.sub("#", shown) != NUMBER.sub("#", got):
        return False
    return all(abs(float(a) - float(b)) <= 2e-3 for a, b in zip(NUMBER.findall(shown), NUMBER.findall(got)))


def test_readme_examples_give_the_outputs_shown():
    texts = {page: page.read_text() for page in PAGES}
    examples = [(page, *example) for page, text in texts.items() for example in EXAMPLE.findall(text)]
    # The README's first screen makes one call per family: ours, TEI's, OpenAI's, the Inference API's.
    first_screen = " ".join(command for _, command, _, _ in EXAMPLE.findall(texts[PAGES[0]]))
    assert all(route in first_screen for route in ("/encode", "/fill-mask", "/nsp", "/embed", "/v1", "InferenceClient"))
    assert EXAMPLE.search(texts[PAGES[1]])
    routes = {re.search(r"8000(/[a-z0-9_-]+)?", c).group(1) for _, _, c, _, _ in examples}
    assert routes >= {"/encode", "/fill-mask", "/nsp", "/health", "/embed", "/embed_all", "/tokenize", "/v1",
                      "/embed_sparse", "/similarity", "/decode"}
    assert any("InferenceClient" in c for _, _, c, _, _ in examples) and any("langchain" in c for _, _, c, _, _ in examples)
    process, url = start_service(DEFAULT_CHECKPOINT, "--dtype", "float32")
    try:
        outputs = [run_example(language, command, url) for _, language, command, _, _ in examples]
    finally:
        process.terminate()
        process.wait(timeout=60)
    if os.environ.get("BERT_UPDATE_README"):
        for (page, language, command, kind, shown), got in zip(examples, outputs):
            texts[page] = texts[page].replace(f"```{language}\n{command}```\n\n```{kind}\n{shown}```",
                                              f"```{language}\n{command}```\n\n```{kind}\n{got}\n```")
        for page, text in texts.items():
            page.write_text(text)
        return
    for (_, _, command, _, shown), got in zip(examples, outputs):
        assert same_up_to_rounding(shown.strip(), got), f"{command}\nthe page shows:\n{shown}\nserver gave:\n{got}"
