"""Bytes in, lines out: opening an input (seeking, or decompressing up to, a work unit's first byte), splitting it
into lines in large blocks, counting lines without a Python loop per line, and cutting CSV into records the way
both the plan and the reader must agree on."""

from __future__ import annotations

import atexit
import contextlib
import csv
import lzma
import os
import threading
import weakref
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa

from corpus.errors import CorpusError
from corpus.inputs import InputFile, fingerprint, open_filesystem

BLOCK_BYTES = 1 << 22  # 4 MiB: large enough that per-block Python work vanishes, small enough to stream
_BYTE_ORDER_MARKS = {b"\xff\xfe": "UTF-16", b"\xfe\xff": "UTF-16"}
UTF8_BOM = b"\xef\xbb\xbf"
OBJECT_STORE_BLOCK_BYTES = 1 << 23
SNIFF_BYTES = 1 << 16  # what the plan looks at to tell a file that is not UTF-8 text at all
# Long documents are normal in a corpus; the csv module's default cap (128 KiB a field) is not.
csv.field_size_limit(2**31 - 1)

Read = Callable[[int], bytes]


class _CheckedReader:
    """A file's read(n) whose failures (a truncated or corrupt compressed stream, a dropped connection) become
    CorpusErrors naming the file."""

    def __init__(self, read: Read, uri: str):
        self._read, self._uri = read, uri

    def read(self, size: int) -> bytes:
        try:
            return self._read(size)
        except (OSError, EOFError, lzma.LZMAError, pa.ArrowException) as error:
            raise CorpusError(self._uri, f"cannot read it: {type(error).__name__}: {error}",
                              "check that the file is whole (a compressed file must not be truncated)") from None


def _decompressed(raw, compression: str | None):
    if compression is None:
        return raw
    if compression == "xz":
        return lzma.LZMAFile(raw)
    return pa.CompressedInputStream(pa.PythonFile(raw, mode="r"), compression)


_GONE_HINT = "restore it, or start again in a new output directory"


def _open_raw(file: InputFile, storage_options: dict | None):
    """The file opened for reading as stored (seekable), after checking that it is the file the job planned on."""
    fs, path = open_filesystem(file.uri, storage_options)
    try:
        info = fs.info(path)
        if fingerprint(info) != file.fingerprint:
            raise CorpusError(file.uri, f"the file changed since the job was planned ({file.fingerprint} then, "
                                        f"{fingerprint(info)} now)", _GONE_HINT)
        # An object store's file reads ahead in ranged requests of block_size (s3fs's default is 50 MiB, far more
        # than a work unit needs when it seeks into a large file).
        return fs.open(path, "rb", block_size=OBJECT_STORE_BLOCK_BYTES)
    except FileNotFoundError:
        raise CorpusError(file.uri, "the file is gone (it was there when the job was planned)", _GONE_HINT) from None
    except PermissionError as error:
        raise CorpusError(file.uri, f"not allowed to read it: {error}",
                          "check its permissions or the credentials") from None
    except OSError as error:
        raise CorpusError(file.uri, f"cannot open it: {type(error).__name__}: {error}",
                          "check the path, the network and the credentials") from None


@contextlib.contextmanager
def open_checked(file: InputFile, storage_options: dict | None = None):
    """The file opened as stored (seekable). A file that is gone, unreadable or changed since the job listed it
    is a CorpusError: byte offsets and row counts planned on another version would be wrong."""
    with _open_raw(file, storage_options) as raw:
        yield raw


class _Cursor:
    """A compressed file decompressed forward once for all its units: where the stream is, and the last block it
    gave, so that the next unit of the file starts from there instead of decompressing from the file's start
    again (which made reading a file of U units cost U/2 decompressions of it)."""

    def __init__(self, file: InputFile, storage_options: dict | None):
        self.file, self.pid = file, os.getpid()
        self.raw = _open_raw(file, storage_options)
        self.decompressed = _decompressed(self.raw, file.compression)
        self.stream = _CheckedReader(self.decompressed.read, file.uri)
        _open_cursors.add(self)
        self.position, self.last = 0, b""  # self.last holds the stream's bytes [position - len(last), position)

    def _read(self, size: int) -> bytes:
        data = self.stream.read(size)
        self.position += len(data)
        self.last = data
        return data

    def reads_from(self, offset: int) -> Read | None:
        """A read(n) that starts at `offset` of the decompressed stream; None if the stream is already past it."""
        last_start = self.position - len(self.last)
        if offset < last_start:
            return None
        head = [self.last[offset - last_start:]] if offset <= self.position else []
        left = max(offset - self.position, 0)
        while left > 0:
            skipped = len(self._read(min(left, BLOCK_BYTES)))
            if not skipped:
                raise CorpusError(self.file.uri, "the file is shorter than when the job was planned", _GONE_HINT)
            left -= skipped

        def read(size: int) -> bytes:
            if head:
                data = head.pop()
                if data:
                    return data
            return self._read(size)

        return read

    def close(self) -> None:
        _open_cursors.discard(self)
        with contextlib.suppress(Exception):  # closing a broken stream must not hide why it broke
            self.decompressed.close()
        self.raw.close()


_open_cursors: weakref.WeakSet = weakref.WeakSet()
# Closed before the interpreter tears down: pyarrow's stream would otherwise call into a half-gone Python.
atexit.register(lambda: [cursor.close() for cursor in list(_open_cursors)])
_KEPT_CURSORS = 4  # per thread: a reader that alternates between a few compressed files keeps each one's place
_cursors = threading.local()


def _take_cursor(file: InputFile) -> _Cursor | None:
    kept: dict = _cursors.__dict__.setdefault("by_uri", {})
    cursor = kept.pop(file.uri, None)
    if cursor is not None and (cursor.file != file or cursor.pid != os.getpid()):
        return None  # another version of the file, or a copy inherited by a forked process: never share it
    return cursor


def _keep_cursor(cursor: _Cursor) -> None:
    kept: dict = _cursors.__dict__.setdefault("by_uri", {})
    kept[cursor.file.uri] = cursor
    while len(kept) > _KEPT_CURSORS:
        kept.pop(next(iter(kept))).close()


@contextlib.contextmanager
def open_input(file: InputFile, storage_options: dict | None = None, byte_offset: int = 0,
               resume: bool = False) -> Iterator[_CheckedReader]:
    """The file's bytes from `byte_offset` on. A compressed file cannot seek: its offsets are into the
    decompressed stream, which is read and dropped up to there; with `resume`, a stream this thread left open
    at or before the offset (its previous unit of the file) goes on from there, and is left open in turn."""
    if file.compression is None:
        with _open_raw(file, storage_options) as raw:
            raw.seek(byte_offset)
            yield _CheckedReader(raw.read, file.uri)
        return
    cursor = _take_cursor(file) if resume else None
    read = cursor.reads_from(byte_offset) if cursor is not None else None
    if read is None:
        if cursor is not None:
            cursor.close()
        cursor = _Cursor(file, storage_options)
        try:
            read = cursor.reads_from(byte_offset)
        except BaseException:
            cursor.close()
            raise
    else:
        _open_raw(file, storage_options).close()  # the same checks as a fresh open: gone, changed, unreadable
    try:
        yield _CheckedReader(read, file.uri)
    except BaseException:
        cursor.close()
        raise
    if resume:
        _keep_cursor(cursor)
    else:
        cursor.close()


def refuse_other_encodings(first_bytes: bytes, uri: str) -> None:
    """A file that is not UTF-8 text as a whole (UTF-16, binary, compressed under a plain name) is one fault of
    the file, not a million bad lines: say so once, from its first bytes. UTF-8 text never holds a NUL byte."""
    encoding = _BYTE_ORDER_MARKS.get(first_bytes[:2])
    if encoding:
        raise CorpusError(uri, f"the file is {encoding}, not UTF-8",
                          f"convert it, e.g. iconv -f {encoding} -t UTF-8 IN > OUT")
    if b"\x00" in first_bytes:
        raise CorpusError(uri, "the file holds NUL bytes: it is not UTF-8 text (binary, compressed under a plain "
                               "name, or UTF-16/32 without a byte-order mark)",
                          "convert it to UTF-8 (iconv), or name it with its real suffix or --format")


def iter_lines(read: Read) -> Iterator[bytes]:
    """The lines of a byte stream, each with its b"\\n" (the last one without, when the stream does not end in
    one), read in large blocks. A line longer than a block is joined from pieces, not re-copied per block."""
    pending: list[bytes] = []
    while block := read(BLOCK_BYTES):
        parts = block.split(b"\n")
        last = parts.pop()
        if parts:
            first = parts[0] + b"\n"
            yield b"".join(pending) + first if pending else first
            pending = []
            for part in parts[1:]:
                yield part + b"\n"
        if last:
            pending.append(last)
    if pending:
        yield b"".join(pending)


def count_lines(read: Read, every: int) -> tuple[int, list[int]]:
    """(number of lines, byte offsets where lines 0, every, 2*every, ... start). Newlines are counted per block
    in C; only a block where a boundary falls is scanned for the exact position."""
    lines, position, offsets, last_byte = 0, 0, [0], b"\n"
    next_boundary = every
    while block := read(BLOCK_BYTES):
        newlines = block.count(b"\n")
        if lines + newlines >= next_boundary:
            ends = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
            while lines + newlines >= next_boundary:
                # line `next_boundary` starts right after the newline that ends line next_boundary - 1
                offsets.append(position + int(ends[next_boundary - lines - 1]) + 1)
                next_boundary += every
        lines += newlines
        position += len(block)
        last_byte = block[-1:]
    if last_byte != b"\n":
        lines += 1  # a last line without its newline
    return lines, [offset for index, offset in enumerate(offsets) if index * every < lines]


class CsvRecords:
    """The records of a CSV stream from a record's first byte on, with where each starts: (line index, byte
    offset, fields or the csv.Error). Blank lines are no records. Undecodable bytes pass through as surrogates
    (the reader rejects that record), so that plan and reader cut the stream at the same places."""

    def __init__(self, read: Read, first_line: int = 0, first_offset: int = 0):
        self.line, self.offset = first_line, first_offset
        self._reader = csv.reader(self._lines(read), strict=True)

    def _lines(self, read: Read) -> Iterator[str]:
        for raw in iter_lines(read):
            self.line += 1
            self.offset += len(raw)
            yield raw.decode("utf-8", "surrogateescape")

    def until(self, stop_line: int) -> Iterator[tuple[int, int, list[str] | csv.Error]]:
        """The records that start before line `stop_line`, reading no further than needed to know it."""
        for record in self:
            if record[0] >= stop_line:
                return
            yield record
            if self.line >= stop_line:
                return

    def __iter__(self) -> Iterator[tuple[int, int, list[str] | csv.Error]]:
        while True:
            line, offset = self.line, self.offset
            try:
                fields = next(self._reader)
            except StopIteration:
                return
            except csv.Error as error:
                yield line, offset, error
                continue
            if fields:
                yield line, offset, fields
