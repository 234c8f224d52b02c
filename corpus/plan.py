"""The job cut into work units: consecutive rows of one file, each unit one output shard. The same inputs always
give the same units with the same names, so a resumed run knows which shards are done by their names alone.

For the line formats (JSONL, text, CSV) a unit's rows are counted in lines of the file: row_start/row_stop are
0-based line indices, a unit holds `rows_per_shard` lines (blank lines included: they are separators, no
documents) and `byte_offset` is where its first line starts, so a reader seeks straight there. CSV units hold
`rows_per_shard` records and start at a record's first line (a quoted field may span lines). Parquet units are
rows, found from the file's metadata (no data is read to plan it)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow.parquet as pq

from corpus.errors import CorpusError
from corpus.inputs import InputFile
from corpus.streams import SNIFF_BYTES, CsvRecords, count_lines, open_checked, open_input, refuse_other_encodings

# Files are counted in parallel: an object store's latency, not the CPU, bounds a plan over many files.
PLAN_THREADS = 8


@dataclass(frozen=True)
class WorkUnit:
    file_index: int  # index into the sorted input list
    file: InputFile
    row_start: int  # 0-based, inclusive: a line index for the line formats, a row index for Parquet
    row_stop: int  # exclusive
    byte_offset: int | None  # where row_start begins (in the decompressed stream), for line formats; else None

    @property
    def name(self) -> str:
        """The shard's file stem: stable for the same inputs and rows_per_shard."""
        return f"part-{self.file_index:05d}-{self.row_start:012d}"

    def to_json(self) -> dict:
        return {"file_index": self.file_index, "file": self.file.to_json(), "row_start": self.row_start,
                "row_stop": self.row_stop, "byte_offset": self.byte_offset}

    @classmethod
    def from_json(cls, data: dict) -> "WorkUnit":
        return cls(data["file_index"], InputFile.from_json(data["file"]), data["row_start"], data["row_stop"],
                   data["byte_offset"])


def _line_units(index: int, file: InputFile, rows_per_shard: int, storage_options: dict | None) -> list[WorkUnit]:
    with open_input(file, storage_options) as stream:
        first = stream.read(SNIFF_BYTES)
        refuse_other_encodings(first, file.uri)
        replay = [first]  # the bytes already read go first, then the rest of the stream

        def read(size: int) -> bytes:
            return replay.pop() if replay else stream.read(size)

        lines, offsets = count_lines(read, rows_per_shard)
    return [WorkUnit(index, file, i * rows_per_shard, min(lines, (i + 1) * rows_per_shard), offset)
            for i, offset in enumerate(offsets)]


def _csv_units(index: int, file: InputFile, rows_per_shard: int, storage_options: dict | None) -> list[WorkUnit]:
    starts: list[tuple[int, int]] = []  # (line, byte offset) of every rows_per_shard-th record after the header
    with open_input(file, storage_options) as stream:
        first = stream.read(SNIFF_BYTES)
        refuse_other_encodings(first, file.uri)
        replay = [first]

        def read(size: int) -> bytes:
            return replay.pop() if replay else stream.read(size)

        records = CsvRecords(read)
        for number, (line, offset, _fields) in enumerate(records):
            if number and (number - 1) % rows_per_shard == 0:  # record 0 is the header
                starts.append((line, offset))
        total_lines = records.line
    stops = [line for line, _ in starts[1:]] + [total_lines]
    return [WorkUnit(index, file, line, stop, offset) for (line, offset), stop in zip(starts, stops)]


def _parquet_units(index: int, file: InputFile, rows_per_shard: int, storage_options: dict | None) -> list[WorkUnit]:
    with open_checked(file, storage_options) as handle:
        rows = parquet_file(handle, file.uri).metadata.num_rows
    return [WorkUnit(index, file, start, min(rows, start + rows_per_shard), None)
            for start in range(0, rows, rows_per_shard)]


def parquet_file(handle, uri: str) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(handle)
    except Exception as error:  # pyarrow raises ArrowInvalid, OSError, ... for a file that is not Parquet
        raise CorpusError(uri, f"not a readable Parquet file: {error}",
                          "check that it is whole, or pass the right --format") from None


_PLANNERS = {"jsonl": _line_units, "text": _line_units, "csv": _csv_units, "parquet": _parquet_units}


def make_plan(files: list[InputFile], rows_per_shard: int, storage_options: dict | None = None) -> list[WorkUnit]:
    """The work units of all files, in file order then row order. One counting pass over each line-format file
    (newlines counted in blocks; CSV parsed, since quoted fields may hold newlines), metadata only for Parquet.
    An empty file has no units."""
    if rows_per_shard <= 0:
        raise ValueError(f"rows_per_shard must be positive, not {rows_per_shard}")
    with ThreadPoolExecutor(max_workers=min(PLAN_THREADS, max(1, len(files)))) as pool:
        per_file = list(pool.map(lambda item: _PLANNERS[item[1].format](item[0], item[1], rows_per_shard,
                                                                        storage_options), enumerate(files)))
    return [unit for units in per_file for unit in units]


def plan_to_json(units: list[WorkUnit]) -> list[dict]:
    return [unit.to_json() for unit in units]


def plan_from_json(data: list[dict]) -> list[WorkUnit]:
    return [WorkUnit.from_json(item) for item in data]
