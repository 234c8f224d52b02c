"""Response encoding for token embeddings (`/encode`, pooling none): JSON floats vs base64.

Two measurements in one run:
1. In-process, one typical response body (the encoder's vectors for --batch inputs): the time to
   serialize it with the standard library (`json.dumps` of Python lists: what a FastAPI app returns
   by default), with orjson writing the float32 arrays directly (this service's float path), and as
   base64 (this service's base64 path); its size; and the client's time to turn it back into arrays.
2. Over HTTP, against the service: requests/s and latency for the same inputs, float vs base64.

    python -m bench.serving.encoding --concurrency 8 32 --duration 8
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
from pathlib import Path

import numpy as np
import orjson

from devkit.server import start_service
from bench.serving.load import drive
from bench.serving.throughput import count_tokens, sentences
from bench.serving.timing import best_ms
from service.frontend.frontdoor import EncodeOutput
from service.frontend.outputs import encode_result
from service.settings import DEFAULT_CHECKPOINT


def in_process(checkpoint: Path, texts: list[str]) -> list[dict]:
    from model import load_checkpoint
    from model.device import pick_device
    from service.engine.precision import choose
    from service.engine.loader import build_engine
    from service.tasks import EncodeItem

    ckpt = load_checkpoint(checkpoint)
    device = pick_device("auto")
    engine = build_engine(ckpt, device, choose("auto", device))
    encoded = ckpt.tokenizer.encode_batch(texts, truncate=True)
    items = [EncodeItem(e.ids, e.type_ids, pooling="none") for e in encoded]
    results = engine.run(engine.collate(items))
    tokens = [[ckpt.tokenizer.id_to_token(i) for i in e.ids] for e in encoded]

    def body(fmt: str) -> dict:
        return {"model": "m", "dim": ckpt.config.hidden_size,
                "results": [encode_result(EncodeOutput(t, r), fmt) for r, t in zip(results, tokens)]}

    def stdlib() -> bytes:  # FastAPI's default: jsonable_encoder + json.dumps over Python lists
        payload = body("float")
        for result in payload["results"]:
            result["embeddings"] = result["embeddings"].tolist()
        return json.dumps(payload).encode()

    def ours_float() -> bytes:
        return orjson.dumps(body("float"), option=orjson.OPT_SERIALIZE_NUMPY)

    def ours_base64() -> bytes:
        return orjson.dumps(body("base64"))

    def read_float(raw: bytes) -> list[np.ndarray]:
        return [np.asarray(r["embeddings"], dtype=np.float32) for r in orjson.loads(raw)["results"]]

    def read_base64(raw: bytes) -> list[np.ndarray]:
        return [np.stack([np.frombuffer(base64.b64decode(v), dtype="<f4") for v in r["embeddings"]])
                for r in orjson.loads(raw)["results"]]

    rows = []
    for name, encode, decode in (("json, stdlib lists", stdlib, read_float), ("json, orjson numpy (float)", ours_float, read_float),
                                 ("base64", ours_base64, read_base64)):
        raw = encode()
        decoded = decode(raw)
        assert all(np.allclose(d, r.vectors, atol=1e-6) for d, r in zip(decoded, results)), name  # lossless
        rows.append({"format": name, "serialize_ms": best_ms(encode), "bytes": len(raw),
                     "client_decode_ms": best_ms(lambda decode=decode, raw=raw: decode(raw))})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--batch", type=int, default=32, help="inputs in the in-process response")
    args = parser.parse_args(argv)

    from model import load_checkpoint

    tokenizer = load_checkpoint(args.checkpoint).tokenizer
    texts = sentences(2000, None, tokenizer)
    token_counts = count_tokens(tokenizer, texts)
    print(f"# in-process: one response of {args.batch} inputs, "
          f"{sum(token_counts[t] for t in texts[:args.batch])} token vectors")
    print("| format | serialize ms | bytes | client decode ms |\n|---|---|---|---|")
    for row in in_process(args.checkpoint, texts[: args.batch]):
        print(f"| {row['format']} | {row['serialize_ms']:.2f} | {row['bytes']:,} | {row['client_decode_ms']:.2f} |")

    process, url = start_service(args.checkpoint)
    print("\n# over HTTP: one input per request, pooling none\n"
          "| encoding_format | concurrency | req/s | tokens/s | p50 ms | p99 ms |\n|---|---|---|---|---|---|")
    try:
        for concurrency in args.concurrency:
            for fmt in ("float", "base64"):
                request = lambda texts, fmt=fmt: ("/encode", {"inputs": texts[0], "pooling": "none",  # noqa: E731
                                                             "truncate": True, "encoding_format": fmt})
                asyncio.run(drive(url, texts[:64], concurrency, 2.0, token_counts, request))  # warm-up
                latencies, _, tokens, seconds = asyncio.run(drive(url, texts, concurrency, args.duration,
                                                                  token_counts, request))
                p50, p99 = (float(np.percentile(latencies, q)) * 1000 for q in (50, 99))
                print(f"| {fmt} | {concurrency} | {len(latencies) / seconds:.1f} | {tokens / seconds:,.0f} | "
                      f"{p50:.1f} | {p99:.1f} |", flush=True)
    finally:
        process.terminate()
        process.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
