"""Progress of a Hub download (files and bytes), for the log and for a caller such as the server's /health.

`snapshot_download` draws its progress with tqdm bars of a class we may choose: one counts the files done,
one the bytes written to disk (resumed bytes included, each file adding its size to the total as it starts).
`ProgressBars.tqdm_class()` is a class that draws nothing and reports those two counts instead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("model.hub")
LOG_EVERY_S = 2.0


@dataclass(frozen=True)
class DownloadProgress:
    name: str  # org/name[@revision]
    files_done: int
    files_total: int
    bytes_done: int
    bytes_total: int

    def __str__(self) -> str:
        return (f"downloading {self.name}: {self.files_done} of {self.files_total} files, "
                f"{self.bytes_done / 1e6:.1f} of {self.bytes_total / 1e6:.1f} MB")


class ProgressBars:
    def __init__(self, name: str, callback: Callable[[DownloadProgress], None] | None, expected_bytes: int = 0) -> None:
        # The library learns each file's size only as its transfer starts; the Hub's listing gave them all.
        self.name, self.callback, self.expected_bytes = name, callback, expected_bytes
        self.files = self.bytes = None  # the library's two bars, once it creates them
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.last_log = 0.0

    def tqdm_class(self) -> type:
        owner = self

        class ReportingBar:
            """The part of tqdm's interface snapshot_download uses; updates go to `owner`."""

            def __init__(self, *args, desc: str = "", total=None, initial=0, **kwargs) -> None:
                self.total, self.n = total or 0, initial or 0
                if desc.startswith("Fetching"):
                    owner.files = self
                elif desc.startswith("Reconstructing"):
                    owner.bytes = self

            def update(self, n=1) -> None:
                with owner.lock:
                    self.n += n or 0
                owner.report()

            def __enter__(self):
                return self

            def __exit__(self, *exc) -> None:
                pass

            def close(self) -> None:
                pass

            def refresh(self, *args, **kwargs) -> None:
                pass

            def set_description(self, *args, **kwargs) -> None:
                pass

            set_description_str = set_postfix_str = set_description

        return ReportingBar

    def current(self) -> DownloadProgress | None:
        if self.files is None:
            return None
        bytes_bar = self.bytes
        done, total = (int(bytes_bar.n), int(bytes_bar.total)) if bytes_bar else (0, 0)
        return DownloadProgress(self.name, int(self.files.n), int(self.files.total), done,
                                max(total, self.expected_bytes))

    def report(self) -> None:
        now = self.current()
        if now is None:
            return
        if self.callback is not None:
            self.callback(now)
        moment = time.monotonic()
        # files already in the cache finish without a byte: nothing worth a log line
        if now.bytes_total and (moment - self.last_log >= LOG_EVERY_S or now.files_done == now.files_total):
            self.last_log = moment
            log.info("%s", now)

    def finish(self) -> None:
        now = self.current()
        if now is not None and now.bytes_total:
            log.info("%s: %d files, %.1f MB fetched in %.1f s", self.name, now.files_total, now.bytes_done / 1e6,
                     time.monotonic() - self.started)
