"""A document far longer than the model's window, embedded in one request with "long_input": "chunk": it must equal the
mean of its windows embedded one by one (weighted by their tokens), and its tokens/s must stay near short inputs'
(passages of about 100 words, 16 a request), both at one client."""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx
import numpy as np

from devkit.server import start_service
from model.checkpoint_files import load_checkpoint_files
from service.frontend.token_windows import window_overlap, window_starts
from service.settings import Settings


@dataclass
class LongInputs:
    words: int
    tokens: int
    windows: int
    cosine_to_windows: float
    long_tokens_per_s: float  # the document's own tokens a second
    short_tokens_per_s: float
    computed_tokens_per_s: float  # the windows' tokens a second (overlaps and each window's [CLS], [SEP] included)

    @property
    def ratio(self) -> float:
        return self.long_tokens_per_s / self.short_tokens_per_s


def _rate(client: httpx.Client, bodies: list[dict], repeats: int) -> float:
    """Seconds per pass over `bodies`, the best of `repeats` passes after one to warm up."""
    best = float("inf")
    for attempt in range(repeats + 1):
        started = time.perf_counter()
        for body in bodies:
            answer = client.post("/embed", json=body)
            assert answer.status_code == 200, answer.text
        if attempt:
            best = min(best, time.perf_counter() - started)
    return best


def measure(checkpoint, document: str, passages: list[str], repeats: int) -> LongInputs:
    tokenizer = load_checkpoint_files(checkpoint).tokenizer
    ids = tokenizer.encode(document).ids
    pieces, room = ids[1:-1], tokenizer.model_max_length - 2
    overlap = window_overlap(room, Settings.model_fields["long_input_overlap"].default)
    windows = [[ids[0], *pieces[a:b], ids[-1]] for a, b in window_starts(len(pieces), room, overlap)]
    short_tokens = sum(len(e.ids) for e in tokenizer.encode_batch(passages))
    process, url = start_service(checkpoint, timeout_s=600)
    try:
        with httpx.Client(base_url=url, timeout=600) as client:
            chunked = client.post("/embed", json={"inputs": document, "long_input": "chunk", "normalize": False})
            assert chunked.status_code == 200, chunked.text
            alone = [client.post("/embed", json={"inputs": w, "normalize": False}).json()[0] for w in windows]
            weights = np.array([len(w) for w in windows], dtype=np.float64)
            want = weights @ np.asarray(alone, dtype=np.float64) / weights.sum()
            got = np.asarray(chunked.json()[0], dtype=np.float64)
            cosine = float(got @ want / np.linalg.norm(got) / np.linalg.norm(want))
            long_s = _rate(client, [{"inputs": document, "long_input": "chunk"}], repeats)
            short_s = _rate(client, [{"inputs": passages[i : i + 16]} for i in range(0, len(passages), 16)], repeats)
    finally:
        process.terminate()
        process.wait(timeout=60)
    return LongInputs(len(document.split()), len(ids), len(windows), cosine, len(ids) / long_s,
                      short_tokens / short_s, float(weights.sum()) / long_s)
