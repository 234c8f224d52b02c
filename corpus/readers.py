"""A work unit's rows as documents: one `Document` or `Rejected` for every row of the unit, in order.

A row's own faults (a malformed JSONL line or CSV record, an empty or non-string text, a missing field, bytes
that are not UTF-8) come back as `Rejected`, so --on-error skip can set them aside; a fault of the whole file
(gone, unreadable, a column missing from a Parquet or CSV header) raises `CorpusError`. Blank lines of the line
formats are separators, not documents: they give nothing back.

Ids: --id-column's value as a string (a string or an integer; anything else is a reject), or, with no id column,
`<file>:<row>` (the file's path below INPUT, its 1-based line or row). Duplicate ids are kept: rows are the unit
of exactness, and an id column is the user's data, not ours to judge."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from dataclasses import dataclass

import orjson
import pyarrow as pa

from corpus.errors import CorpusError, Rejected
from corpus.inputs import InputFile
from corpus.plan import WorkUnit, parquet_file
from corpus.streams import UTF8_BOM, CsvRecords, iter_lines, open_checked, open_input

DEFAULT_TEXT_COLUMN = "text"
PARQUET_BATCH_ROWS = 4096  # rows decoded at a time: bounds memory when documents are long
_COLUMN_HINT = "name the right one with --text-column / --id-column"


@dataclass(frozen=True)
class Document:
    doc_id: str  # --id-column's value as str, or generated: f"{file's path below INPUT}:{row}"
    text: str
    source: str  # the file's URI
    row: int  # 1-based, as Rejected.row


def generated_id(file: InputFile, row: int) -> str:
    return f"{file.name or file.uri}:{row}"


def _id_of(value) -> tuple[str | None, str | None]:
    """(id, None) or (None, why the value cannot be an id)."""
    if isinstance(value, str):
        return (value, None) if value else (None, "empty id")
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value), None
    return None, "id is null" if value is None else f"id is {type(value).__name__}, not a string or an integer"


def _text_problem(text) -> str | None:
    if text is None:
        return "text is null"
    if not isinstance(text, str):
        return f"text is {type(text).__name__}, not a string"
    if not text.strip():
        return "empty text"
    return None


def _utf8_problem(raw: bytes) -> str | None:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return (f"line is not valid UTF-8 (byte 0x{raw[error.start]:02x} at byte {error.start + 1} of the line; "
                "is the file in another encoding? convert it with iconv)")
    return None


def _unit_lines(unit: WorkUnit, storage_options: dict | None) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, line without its line ending) for every line of a line-format unit."""
    with open_input(unit.file, storage_options, unit.byte_offset or 0, resume=True) as stream:
        # zip takes from the range first: the stream is not read past the unit's last line, so a compressed
        # stream left open for the next unit is still at or before that unit's first byte
        for number, raw in zip(range(unit.row_start + 1, unit.row_stop + 1), iter_lines(stream.read)):
            line = raw[:-1] if raw.endswith(b"\n") else raw
            if line.endswith(b"\r"):
                line = line[:-1]
            if number == 1 and line.startswith(UTF8_BOM):
                line = line[len(UTF8_BOM):]
            yield number, line


def _read_text(unit: WorkUnit, text_column, id_column, storage_options) -> Iterator[Document | Rejected]:
    file = unit.file
    for number, line in _unit_lines(unit, storage_options):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            yield Rejected(file.uri, number, generated_id(file, number), _utf8_problem(line))
            continue
        if text.strip():
            yield Document(generated_id(file, number), text, file.uri, number)


def _read_jsonl(unit: WorkUnit, text_column, id_column, storage_options) -> Iterator[Document | Rejected]:
    file = unit.file
    field = text_column or DEFAULT_TEXT_COLUMN
    for number, line in _unit_lines(unit, storage_options):
        if not line.strip():
            continue
        generated = generated_id(file, number)
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError as error:
            yield Rejected(file.uri, number, None if id_column else generated,
                           _utf8_problem(line) or f"line is not valid JSON: {error}")
            continue
        if isinstance(value, str) and text_column is None and id_column is None:
            value = {field: value}  # a line that is a bare JSON string is the document
        if not isinstance(value, dict):
            yield Rejected(file.uri, number, None if id_column else generated,
                           f"line is a JSON {type(value).__name__}, not an object")
            continue
        doc_id, id_problem = (generated, None) if id_column is None else (
            _id_of(value[id_column]) if id_column in value else (None, f"no field {id_column!r}"))
        if field not in value:
            fields = ", ".join(map(repr, list(value)[:10]))
            problem = f"no field {field!r} (fields: {fields or 'none'}; {_COLUMN_HINT})"
        else:
            problem = id_problem or _text_problem(value[field])
        if problem:
            yield Rejected(file.uri, number, doc_id, problem)
        else:
            yield Document(doc_id, value[field], file.uri, number)


def _column_index(file: InputFile, header: list[str], column: str) -> int:
    if column not in header:
        raise CorpusError(file.uri, f"no column {column!r} (columns: {', '.join(map(repr, header))})", _COLUMN_HINT)
    return header.index(column)


def csv_header(file: InputFile, storage_options: dict | None = None) -> list[str]:
    with open_input(file, storage_options) as stream:
        for line, _offset, fields in CsvRecords(stream.read):
            if isinstance(fields, csv.Error):
                raise CorpusError(file.uri, f"the header is not valid CSV: {fields}", "fix the first line",
                                  row=line + 1)
            if fields[0].startswith("\ufeff"):
                fields[0] = fields[0][1:]
            return fields
    return []


def _has_surrogates(text: str) -> bool:
    # CsvRecords decodes with surrogateescape: a lone surrogate is a byte that was not UTF-8.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _read_csv(unit: WorkUnit, text_column, id_column, storage_options) -> Iterator[Document | Rejected]:
    file = unit.file
    header = csv_header(file, storage_options)
    text_at = _column_index(file, header, text_column or DEFAULT_TEXT_COLUMN)
    id_at = None if id_column is None else _column_index(file, header, id_column)
    with open_input(file, storage_options, unit.byte_offset or 0, resume=True) as stream:
        records = CsvRecords(stream.read, unit.row_start, unit.byte_offset or 0)
        for line, _offset, fields in records.until(unit.row_stop):
            number = line + 1
            generated = None if id_column else generated_id(file, number)
            if isinstance(fields, csv.Error):
                yield Rejected(file.uri, number, generated, f"not a valid CSV record: {fields}")
                continue
            if len(fields) != len(header):
                plural = "" if len(fields) == 1 else "s"
                yield Rejected(file.uri, number, generated,
                               f"the record has {len(fields)} field{plural} where the header has {len(header)}")
                continue
            doc_id, problem = (generated, None) if id_at is None else _id_of(fields[id_at])
            text = fields[text_at]
            if _has_surrogates(text) or (doc_id is not None and _has_surrogates(doc_id)):
                doc_id = None if doc_id is None or _has_surrogates(doc_id) else doc_id
                problem = "the record is not valid UTF-8 (is the file in another encoding? convert it with iconv)"
            problem = problem or _text_problem(text)
            if problem:
                yield Rejected(file.uri, number, doc_id, problem)
            else:
                yield Document(doc_id, text, file.uri, number)


def _is_text_type(kind: pa.DataType, binary: bool = False) -> bool:
    """A string column; with `binary`, bytes too (datasets often store UTF-8 text as binary: each value is
    decoded, and one that is not UTF-8 is a refused row)."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind) or (
        binary and (pa.types.is_binary(kind) or pa.types.is_large_binary(kind) or pa.types.is_binary_view(kind)))


def _decoded(value):
    """(text, None) or (None, why): a binary Parquet value as text."""
    if not isinstance(value, bytes):
        return value, None
    try:
        return value.decode("utf-8"), None
    except UnicodeDecodeError as error:
        return None, f"text is not valid UTF-8 (byte 0x{value[error.start]:02x} at byte {error.start + 1})"


def _parquet_columns(file: InputFile, schema: pa.Schema, text_column, id_column) -> list[str]:
    """The columns to read, after checking that they exist and have usable types."""
    text = text_column or DEFAULT_TEXT_COLUMN
    _column_index(file, schema.names, text)
    if not _is_text_type(schema.field(text).type, binary=True):
        raise CorpusError(file.uri, f"column {text!r} is {schema.field(text).type}, not text", _COLUMN_HINT)
    if id_column is None:
        return [text]
    _column_index(file, schema.names, id_column)
    kind = schema.field(id_column).type
    if not (_is_text_type(kind) or pa.types.is_integer(kind)):
        raise CorpusError(file.uri, f"id column {id_column!r} is {kind}, not a string or an integer", _COLUMN_HINT)
    return [text] if id_column == text else [text, id_column]


def _read_parquet(unit: WorkUnit, text_column, id_column, storage_options) -> Iterator[Document | Rejected]:
    file = unit.file
    with open_checked(file, storage_options) as handle:
        parquet = parquet_file(handle, file.uri)
        columns = _parquet_columns(file, parquet.schema_arrow, text_column, id_column)
        groups, first_row, row = [], None, 0  # the row groups that hold the unit's rows
        for index in range(parquet.metadata.num_row_groups):
            rows = parquet.metadata.row_group(index).num_rows
            if row < unit.row_stop and row + rows > unit.row_start:
                groups.append(index)
                first_row = row if first_row is None else first_row
            row += rows
        row = first_row or 0
        try:
            batches = parquet.iter_batches(PARQUET_BATCH_ROWS, row_groups=groups, columns=columns)
            for batch in batches:
                low, high = max(unit.row_start - row, 0), min(unit.row_stop - row, batch.num_rows)
                if high > low:
                    texts = batch.column(columns[0]).slice(low, high - low).to_pylist()
                    ids = batch.column(columns[-1]).slice(low, high - low).to_pylist() if id_column else None
                    for offset, value in enumerate(texts):
                        number = row + low + offset + 1
                        doc_id, problem = (generated_id(file, number), None) if ids is None else _id_of(ids[offset])
                        text, undecodable = _decoded(value)
                        problem = problem or undecodable or _text_problem(text)
                        yield Rejected(file.uri, number, doc_id, problem) if problem else \
                            Document(doc_id, text, file.uri, number)
                row += batch.num_rows
                if row >= unit.row_stop:
                    return
        except (OSError, pa.ArrowException) as error:
            raise CorpusError(file.uri, f"cannot read rows {unit.row_start + 1}-{unit.row_stop}: {error}",
                              "check that the file is whole") from None


def _check_text_file(file: InputFile, text_column, id_column) -> None:
    if text_column is not None or id_column is not None:
        raise CorpusError(file.uri, "a plain text file has no columns (one document a line)",
                          "drop --text-column / --id-column, or give JSONL, CSV or Parquet")


_READERS = {"jsonl": _read_jsonl, "csv": _read_csv, "parquet": _read_parquet, "text": _read_text}


def read_unit(unit: WorkUnit, text_column: str | None, id_column: str | None,
              storage_options: dict | None = None) -> Iterator[Document | Rejected]:
    """One Document or Rejected for every row of the unit (blank lines excepted), in file order."""
    if unit.file.format == "text":
        _check_text_file(unit.file, text_column, id_column)
    yield from _READERS[unit.file.format](unit, text_column, id_column, storage_options)


def check_columns(files: list[InputFile], text_column: str | None, id_column: str | None,
                  storage_options: dict | None = None) -> None:
    """Fail before any work if a file's header or schema lacks the columns (a JSONL line is checked as read)."""
    for file in files:
        if file.format == "text":
            _check_text_file(file, text_column, id_column)
        elif file.format == "csv":
            header = csv_header(file, storage_options)
            if header:
                _column_index(file, header, text_column or DEFAULT_TEXT_COLUMN)
                if id_column is not None:
                    _column_index(file, header, id_column)
        elif file.format == "parquet":
            with open_checked(file, storage_options) as handle:
                _parquet_columns(file, parquet_file(handle, file.uri).schema_arrow, text_column, id_column)
