"""Question answering (a BertForQuestionAnswering checkpoint written by transformers) answers as transformers 4.x's
question-answering pipeline does on the same checkpoint (run in its own environment, requirements/qa-reference.txt:
transformers 5 removed the pipeline): top_k, max_answer_len, handle_impossible_answer, align_to_words, contexts
longer than the window (doc_stride, max_seq_len), offsets into contexts with accents, CJK and emoji; inputs batched
together answer as each alone; bad input gets a 4xx naming the problem."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from devkit.paths import REPO_ROOT
from tests.service.conftest import serving

pytestmark = pytest.mark.anyio
REFERENCE_PYTHON = Path(os.environ.get("BERT_QA_REFERENCE_PYTHON", REPO_ROOT / ".venv-qa-reference" / "bin" / "python"))
CONTEXT = "Ada Lovelace lived in London with her mother , and she wrote the first published program in 1843 ."
UNICODE = ("Zoë Saldaña flew from Zürich to 東京 in 2019 🙂 , then Ko\u0308ln's counterrevolutionaries met in "
           "São Paulo .")
LONG = " ".join(f"In {1800 + n} the mill by the river ground {n} sacks of wheat for the village of Marlow ."
                for n in range(18))
CASES = [
    ("where did ada live ?", CONTEXT, {}),
    ("when was the program published ?", CONTEXT, {"top_k": 4}),
    ("who lived in london ?", CONTEXT, {"top_k": 3, "max_answer_len": 2}),
    ("who lived in london ?", CONTEXT, {"top_k": 2, "handle_impossible_answer": True}),
    ("who lived in london ?", CONTEXT, {"top_k": 3, "align_to_words": False}),
    ("where did she fly ?", UNICODE, {"top_k": 3}),
    ("how many sacks ?", LONG, {"top_k": 3}),
    ("how many sacks ?", LONG, {"top_k": 2, "doc_stride": 20, "max_seq_len": 48, "handle_impossible_answer": True}),
]


def reference_answers(checkpoint: Path, cases: list) -> list[list[dict]]:
    if not REFERENCE_PYTHON.is_file():
        if os.environ.get("BERT_REQUIRE_QA_REFERENCE"):
            pytest.fail(f"{REFERENCE_PYTHON} is missing: `make test` installs requirements/qa-reference.txt there")
        pytest.skip(f"{REFERENCE_PYTHON} is missing (make test installs transformers 4.x there)")
    request = {"checkpoint": str(checkpoint),
               "cases": [{"question": q, "context": c, "parameters": p} for q, c, p in cases]}
    done = subprocess.run([str(REFERENCE_PYTHON), str(REPO_ROOT / "tests" / "qa_reference" / "drive.py")],
                          input=json.dumps(request), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    assert answer["version"].startswith("4."), answer["version"]
    return answer["answers"]


def assert_same(ours: list[dict], reference: list[dict], case) -> None:
    assert [(a["answer"], a["start"], a["end"]) for a in ours] == \
        [(a["answer"], a["start"], a["end"]) for a in reference], case
    for mine, theirs in zip(ours, reference):
        assert mine["score"] == pytest.approx(theirs["score"], rel=1e-3, abs=1e-6), case


async def test_every_option_equals_the_pipeline_batched_and_alone(tiny_question_answerer):
    want = reference_answers(tiny_question_answerer, CASES)
    async with serving(tiny_question_answerer) as client:
        alone = []
        for question, context, parameters in CASES:
            response = await client.post("/question-answering", json={
                "inputs": {"question": question, "context": context}, **parameters})
            assert response.status_code == 200, response.text
            alone.append(response.json()["results"][0])
        batched = (await client.post("/question-answering", json={
            "inputs": [{"question": q, "context": c} for q, c, _ in CASES], "top_k": 3})).json()["results"]
        root = (await client.post("/", json={"inputs": {"question": CASES[0][0], "context": CASES[0][1]}}))
    for case, ours, reference in zip(CASES, alone, want):
        assert_same(ours, reference, case)
        for answer in ours:
            assert case[1][answer["start"] : answer["end"]] == answer["answer"]
    assert len(LONG.split()) > 2 * 128  # several windows of the model's 128 tokens, read as the pipeline reads them
    singles_top3 = [(await _top3(tiny_question_answerer, q, c)) for q, c, _ in CASES]
    for one, together in zip(singles_top3, batched):
        assert [(a["answer"], a["start"]) for a in one] == [(a["answer"], a["start"]) for a in together]
        assert [a["score"] for a in one] == pytest.approx([a["score"] for a in together], abs=1e-5)
    assert root.headers["x-task"] == "question-answering"
    assert root.json()["answer"] == alone[0][0]["answer"]


async def _top3(checkpoint, question, context):
    async with serving(checkpoint) as client:
        response = await client.post("/question-answering", json={"inputs": {"question": question, "context": context},
                                                                  "top_k": 3})
    return response.json()["results"][0]


async def test_bad_input_and_a_checkpoint_without_the_head(tiny_question_answerer, tiny_checkpoint):
    async with serving(tiny_question_answerer) as client:
        no_question = await client.post("/question-answering", json={"inputs": {"context": CONTEXT}})
        no_context = await client.post("/question-answering", json={"inputs": {"question": "who ?"}})
        empty = await client.post("/question-answering", json={"inputs": {"question": "who ?", "context": ""}})
        root_empty = await client.post("/", json={"inputs": {"question": "who ?", "context": " "}})
        stride = await client.post("/question-answering", json={"inputs": {"question": "who ?", "context": CONTEXT},
                                                                "doc_stride": 400})
        top_k = await client.post("/question-answering", json={"inputs": {"question": "who ?", "context": CONTEXT},
                                                               "top_k": 0})
        info = (await client.get("/info")).json()
    assert no_question.status_code == no_context.status_code == 422
    assert "question" in no_question.json()["error"] and "context" in no_context.json()["error"]
    assert empty.status_code == 422 and "context is empty" in empty.json()["error"]
    assert root_empty.status_code == 422 and "context" in root_empty.json()["error"]
    assert stride.status_code == 422 and "doc_stride" in stride.json()["error"]
    assert top_k.status_code == 422 and "top_k" in top_k.json()["error"]
    assert info["heads"]["question_answering"] is True
    async with serving(tiny_checkpoint) as client:
        missing = await client.post("/question-answering", json={"inputs": {"question": "who ?", "context": CONTEXT}})
        root = await client.post("/", json={"inputs": {"question": "who ?", "context": CONTEXT}})
    assert missing.status_code == root.status_code == 424
    assert "question-answering head" in missing.json()["error"]
