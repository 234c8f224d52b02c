"""A document far longer than the model's window, embedded in one request with "long_input": "chunk": it must equal the
mean of its windows embedded one by one (weighted by their tokens), and its tokens/s must stay near short inputs',
passages of about 100 words sent as one request of about as many tokens as the document's windows (so that both
fill the same batches), both at one client.

The two requests go in turn, round after round, and each round gives one ratio of the two rates: the figure is the
median of those ratios. On a shared machine a neighbour's burst slows one request of a round or both, and the best of
each side taken apart (also reported) pairs a quiet moment of one with a quiet moment of the other; the median of the
pairs holds within a few hundredths where the best-of ratio moved by a tenth from run to run.

With several overlaps (`--overlaps` of `python -m bench.rerank`), one server each, every run's chunked vector is also
compared with the others': what the overlap changes in the answer, beside what it costs."""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx
import numpy as np

from devkit.server import start_service
from model.checkpoint_files import load_checkpoint_files
from service.frontend.token_windows import window_overlap, window_starts


@dataclass
class LongInputs:
    words: int
    tokens: int
    windows: int
    overlap: int  # pieces shared by consecutive windows, as the server was started
    cosine_to_windows: float
    long_tokens_per_s: float  # the document's own tokens a second
    short_tokens_per_s: float
    computed_tokens_per_s: float  # the windows' tokens a second (overlaps and each window's [CLS], [SEP] included)
    round_ratios: list[float]  # each round's long tokens/s over its short tokens/s
    vector: list[float]  # the document's chunked vector (not normalised): runs with other overlaps compare to it

    @property
    def ratio(self) -> float:
        """The median round's ratio: the benchmark's figure."""
        return float(np.median(self.round_ratios))

    @property
    def ratio_quartiles(self) -> tuple[float, float]:
        """How far the rounds spread around the median."""
        low, high = np.percentile(self.round_ratios, [25, 75])
        return float(low), float(high)

    @property
    def computed_ratio(self) -> float:
        """The median round's ratio over the windows' tokens: the gap left once the overlaps and each window's [CLS]
        and [SEP] count as work done."""
        return self.ratio * self.computed_tokens_per_s / self.long_tokens_per_s

    @property
    def best_of_ratio(self) -> float:
        return self.long_tokens_per_s / self.short_tokens_per_s


def cosine(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def _round_seconds(client: httpx.Client, bodies: list[dict], rounds: int) -> np.ndarray:
    """Seconds of each body (columns) in each round (rows), after one round to warm up; the bodies are sent in turn
    within a round, so a busy neighbour weighs on a round's bodies alike."""
    seconds = np.empty((rounds, len(bodies)))
    for attempt in range(rounds + 1):
        for index, body in enumerate(bodies):
            started = time.perf_counter()
            answer = client.post("/embed", json=body)
            assert answer.status_code == 200, answer.text
            if attempt:
                seconds[attempt - 1, index] = time.perf_counter() - started
    return seconds


def measure(checkpoint, document: str, passages: list[str], rounds: int, overlap: int | None = None) -> LongInputs:
    """`overlap`: the server's --long-input-overlap (its default where None)."""
    tokenizer = load_checkpoint_files(checkpoint).tokenizer
    ids = tokenizer.encode(document).ids
    encoded = tokenizer.encode_batch(passages)
    flags = () if overlap is None else ("--long-input-overlap", str(overlap))
    process, url = start_service(checkpoint, *flags, timeout_s=600)
    try:
        with httpx.Client(base_url=url, timeout=600) as client:
            limits = client.get("/info").json()["limits"]  # the windows as the server cuts them
            pieces, room = ids[1:-1], limits["long_input_window"] - 2
            overlap = window_overlap(room, limits["long_input_overlap"])
            windows = [[ids[0], *pieces[a:b], ids[-1]] for a, b in window_starts(len(pieces), room, overlap)]
            chunked = client.post("/embed", json={"inputs": document, "long_input": "chunk", "normalize": False})
            assert chunked.status_code == 200, chunked.text
            alone = [client.post("/embed", json={"inputs": w, "normalize": False}).json()[0] for w in windows]
            weights = np.array([len(w) for w in windows], dtype=np.float64)
            count = int(np.searchsorted(np.cumsum([len(e.ids) for e in encoded]), weights.sum())) + 1
            short = passages[:count]  # about the windows' tokens
            short_tokens = sum(len(e.ids) for e in encoded[:count])
            want = weights @ np.asarray(alone, dtype=np.float64) / weights.sum()
            got = np.asarray(chunked.json()[0], dtype=np.float64)
            cosine_to_windows = cosine(got, want)
            seconds = _round_seconds(client, [{"inputs": document, "long_input": "chunk"}, {"inputs": short}], rounds)
    finally:
        process.terminate()
        process.wait(timeout=60)
    long_s, short_s = seconds.min(axis=0)
    ratios = (len(ids) / seconds[:, 0]) / (short_tokens / seconds[:, 1])
    return LongInputs(len(document.split()), len(ids), len(windows), overlap, cosine_to_windows, len(ids) / long_s,
                      short_tokens / short_s, float(weights.sum()) / long_s, [round(float(r), 4) for r in ratios],
                      [float(v) for v in got])
