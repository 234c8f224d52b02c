"""The two ways an input can be wrong: one row (a `Rejected`, which --on-error skip sets aside) or the whole job (a
`CorpusError`, which stops it). Both name the file and, where there is one, the row, so the user can find it."""

from __future__ import annotations

from dataclasses import asdict, dataclass

# What the user can do about a refused row when the job stops on it.
ROW_HINT = "fix or remove that row, or run with --on-error skip to write such rows to the rejects file"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


@dataclass(frozen=True)
class Rejected:
    """One input row refused, with why; under --on-error skip it goes to the rejects file instead of the shard."""

    source: str  # the file's path or URI, as listed
    row: int  # 1-based: the line number for JSONL/text/CSV (a CSV record's first line), the row for Parquet
    doc_id: str | None  # None when the row's id could not be read
    reason: str  # one line, e.g. "line is not valid JSON: ...", "empty text", "no field 'text' (fields: ...)"

    def to_json(self) -> dict:
        return asdict(self)

    def as_error(self, hint: str = ROW_HINT) -> "CorpusError":
        """The same fault as a job-stopping error (what --on-error stop raises)."""
        return CorpusError(self.source, self.reason, hint, row=self.row)


class CorpusError(Exception):
    """Stops the job. str() is one line: `<source>:<row>: <problem> (<hint>)`; row and hint only when known."""

    def __init__(self, source: str, problem: str, hint: str = "", row: int | None = None):
        self.source = source
        self.problem = _one_line(problem)
        self.hint = _one_line(hint)
        self.row = row
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.source if self.row is None else f"{self.source}:{self.row}"
        return f"{where}: {self.problem}" + (f" ({self.hint})" if self.hint else "")

    def __reduce__(self):  # rebuilt whole in another process (worker pools, Ray tasks)
        return (CorpusError, (self.source, self.problem, self.hint, self.row))

    def rejected(self, doc_id: str | None = None) -> Rejected:
        """The same fault as a row-level reject; only for faults that belong to one row."""
        if self.row is None:
            raise ValueError(f"not a row-level fault: {self}")
        return Rejected(self.source, self.row, doc_id, self.problem)
