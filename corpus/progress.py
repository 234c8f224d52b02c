"""How far a job has come: a bar redrawn in place on a terminal, a plain line now and then in a log, and a summary.

Both count the plan's rows, the measure the plan is cut in and whose total is known before any is read: every line
of a line-format file (JSONL, text, CSV), blank lines included, and every Parquet row. The summary then says what
those rows held: documents embedded, rows rejected, and the vectors written (one per document, or one per chunk).
Rates are counted from this run's start over what this run did (a resumed job's earlier rows count in done/total,
not in rows/s); the ETA is the rows left at that rate. Rows count as the engine finishes their batches, not only
when their shard is written, so that a job of one large shard still moves (the vectors computed are turned into
rows at the ratio the shards written so far show).
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import TextIO

BAR_WIDTH = 28


@dataclass
class Summary:
    rows: int  # the plan's rows this run read (blank lines included): what the progress counts
    documents: int  # input rows embedded by this run (each gives one or more vectors)
    vectors: int  # output rows written by this run (one per chunk when chunking, else one per document)
    rejects: int  # input rows refused by this run (--on-error skip)
    tokens: int
    seconds: float
    shards: int  # shards written by this run
    already_done: int  # the plan's rows done by earlier runs
    start_seconds: float = 0.0  # before the first row: loading the model (not in `seconds`, nor in the rates)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        shards = f"{self.shards} shard{'' if self.shards == 1 else 's'}"
        text = (f"done: {self.rows} rows read, {self.documents} documents embedded ({self.rejects} rejected) -> "
                f"{self.vectors} vectors in {shards}, {self.tokens} tokens in {self.seconds:.1f} s "
                f"({self.rows_per_s:.1f} rows/s, {self.tokens / self.seconds if self.seconds > 0 else 0:.0f} "
                f"tokens/s)")
        text += f", after {self.start_seconds:.1f} s loading the model" if self.start_seconds else ""
        return text + (f"; {self.already_done} rows were done by an earlier run" if self.already_done else "")


class Progress:
    """Thread-safe counters with a display. `total_rows` are the plan's rows; `done_rows` those already done."""

    def __init__(self, total_rows: int, done_rows: int = 0, stream: TextIO | None = None,
                 log_every_s: float = 10.0, redraw_every_s: float = 0.2):
        self.stream = stream or sys.stderr
        self.on_terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        self.total_rows, self.done_before = total_rows, done_rows
        self.rows = self.documents = self.vectors = self.rejects = self.tokens = self.shards = 0
        self.computed_vectors = 0  # by the engine, written or not
        self.started = time.monotonic()
        self._every = redraw_every_s if self.on_terminal else log_every_s
        self._last_shown = self.started
        self._lock = threading.Lock()
        self.start_seconds = 0.0

    def start(self) -> None:
        """The model is loaded and rows begin: the clock of the rates starts again here."""
        now = time.monotonic()
        with self._lock:
            self.start_seconds = now - self.started
            self.started = self._last_shown = now

    def computed(self, vectors: int, tokens: int) -> None:
        """A batch of `vectors` sequences and `tokens` tokens went through the engine."""
        with self._lock:
            self.tokens += tokens
            self.computed_vectors += vectors
            self._maybe_show()

    def written(self, rows: int, documents: int, vectors: int, rejects: int) -> None:
        """A unit's shard is committed: its `rows` of the plan (blank lines among them) held `documents` embedded
        (giving `vectors` output rows) and `rejects` rejected ones."""
        with self._lock:
            self.rows += rows
            self.documents += documents
            self.vectors += vectors
            self.rejects += rejects
            self.shards += 1
            self._maybe_show(force=not self.on_terminal and self.shards == 1)

    def _maybe_show(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_shown >= self._every:
            self._last_shown = now
            self._show(now)

    def _show(self, now: float) -> None:
        elapsed = max(now - self.started, 1e-9)
        rows_per_vector = self.rows / self.vectors if self.vectors else 1.0
        # rows the engine has computed whose shard is not committed yet
        unwritten = max(self.computed_vectors - self.vectors, 0) * rows_per_vector
        this_run = min(self.rows + unwritten, self.total_rows - self.done_before)
        done = int(self.done_before + this_run)
        rate = this_run / elapsed
        left = max(self.total_rows - done, 0)
        eta = _duration(left / rate) if rate > 0 else "?"
        numbers = (f"{done}/{self.total_rows} rows, {rate:.1f} rows/s, {self.tokens / elapsed:.0f} tokens/s, "
                   f"ETA {eta}")
        if self.on_terminal:
            share = done / self.total_rows if self.total_rows else 1.0
            filled = int(share * BAR_WIDTH)
            self.stream.write(f"\r[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {share:4.0%} {numbers}\x1b[K")
        else:
            self.stream.write(f"progress: {numbers}\n")
        self.stream.flush()

    def finish(self) -> Summary:
        with self._lock:
            if self.on_terminal:
                self._show(time.monotonic())
                self.stream.write("\n")
                self.stream.flush()
            return Summary(self.rows, self.documents, self.vectors, self.rejects, self.tokens,
                           time.monotonic() - self.started, self.shards, self.done_before, self.start_seconds)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"
