"""The size of the answers that `max_response_mb` bounds, measured against its estimate: each request sent
to the bundled model in-process with the cap lifted (its real answer, bytes and seconds), then with the cap
at its default (the 422, and the estimate it names). RELIABILITY.md's 'Answer size' table comes from here.

    python -m bench.serving.answer_size
"""

from __future__ import annotations

import asyncio
import time

import httpx

from service.app import create_app
from service.settings import Settings

MASKED = "the " + " ".join(["[MASK] word"] * 50)  # 50 masks, 102 tokens
LONG = "word " * 600  # cut to 512 tokens
CASES = [
    ("fill-mask, 64 inputs x 50 masks x top_k 100", "/fill-mask", {"inputs": [MASKED] * 64, "top_k": 100}),
    ("fill-mask, 64 inputs x 3 masks x top_k 5", "/fill-mask",
     {"inputs": ["the [MASK] sat on the [MASK] near the [MASK] of the house today ."] * 64, "top_k": 5}),
    ("/encode, 64 x 512 tokens, no pooling", "/encode", {"inputs": [LONG] * 64, "truncate": True}),
    ("/encode, 64 x 512 tokens, no pooling, base64", "/encode",
     {"inputs": [LONG] * 64, "truncate": True, "encoding_format": "base64"}),
    ("/encode, 64 x 512 tokens, mean pooling", "/encode", {"inputs": [LONG] * 64, "truncate": True, "pooling": "mean"}),
]


async def answers(settings: Settings) -> list[httpx.Response]:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        await app.state.loading
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench", timeout=600) as client:
            out = []
            for _, path, body in CASES:
                started = time.perf_counter()
                response = await client.post(path, json=body)
                response.elapsed_s = time.perf_counter() - started
                out.append(response)
            return out


def main() -> None:
    lifted = asyncio.run(answers(Settings(max_response_mb=1e6, max_body_bytes=4_000_000)))
    default = Settings().max_response_mb
    capped = asyncio.run(answers(Settings(max_body_bytes=4_000_000)))
    print(f"| request | answer (cap lifted) | time | at the default cap ({default:g} MB) |")
    print("| --- | --- | --- | --- |")
    for (name, _, _), real, refused in zip(CASES, lifted, capped):
        verdict = "200" if refused.status_code == 200 else f"{refused.status_code}: {refused.json()['error']}"
        print(f"| {name} | {len(real.content) / 1e6:.1f} MB | {real.elapsed_s:.1f} s | {verdict} |")


if __name__ == "__main__":
    main()
