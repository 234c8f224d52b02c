"""Runs transformers 4.x's `question-answering` pipeline (removed in transformers 5) on a checkpoint; runs in its
own environment (.venv-qa-reference, requirements/qa-reference.txt).

    python tests/qa_reference/drive.py < {"checkpoint": DIR, "cases": [{"question", "context", "parameters"}]}

prints a JSON list: for each case, the pipeline's answers as a list (best first).
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    from transformers import pipeline

    request = json.load(sys.stdin)
    answerer = pipeline("question-answering", model=request["checkpoint"], tokenizer=request["checkpoint"],
                        device="cpu")
    found = []
    for case in request["cases"]:
        answer = answerer(question=case["question"], context=case["context"], **case.get("parameters", {}))
        found.append(answer if isinstance(answer, list) else [answer])
    print(json.dumps({"version": __import__("transformers").__version__, "answers": found}))


if __name__ == "__main__":
    main()
