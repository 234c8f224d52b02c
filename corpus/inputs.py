"""What INPUT names: a file, a directory (read recursively) or a glob, on the local disk or in an object store
(`s3://bucket/prefix/...` and whatever else fsspec has a file system for), resolved once into a sorted list of
`InputFile`s. Everything later (the plan, the readers, a resumed run) works from that list.

Object stores take the usual credentials: for S3 the AWS_* environment variables, ~/.aws or an instance role,
and AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3) for an S3-compatible store; `storage_options` are passed to the
fsspec file system as they are (e.g. {"endpoint_url": ..., "anon": True})."""

from __future__ import annotations

import os
import posixpath
from dataclasses import asdict, dataclass

import fsspec

from corpus.errors import CorpusError

FORMATS = ("jsonl", "parquet", "csv", "text")
SUFFIX_FORMATS = {
    ".jsonl": "jsonl", ".ndjson": "jsonl",
    ".parquet": "parquet", ".pq": "parquet",
    ".csv": "csv",
    ".txt": "text", ".text": "text",
}
# Whole-file compression of the line formats, by suffix. Parquet compresses inside the file instead.
SUFFIX_COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd", ".zstd": "zstd"}
_GLOB_CHARACTERS = "*?["


@dataclass(frozen=True)
class InputFile:
    uri: str  # local absolute path or "s3://bucket/key"
    format: str  # "jsonl" | "parquet" | "csv" | "text"
    size: int  # bytes as stored (compressed, for a compressed file)
    fingerprint: str  # size + mtime (local) or ETag (object store): a changed input is refused on resume
    name: str = ""  # the path below what INPUT named (the file's name for a single file): generated ids use it
    compression: str | None = None  # "gzip" | "bz2" | "xz" | "zstd" for a whole-file-compressed line format

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "InputFile":
        return cls(**data)


def open_filesystem(uri: str, storage_options: dict | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """The file system that holds `uri` and the path in it. S3 picks up AWS_ENDPOINT_URL itself in recent
    botocore; it is passed explicitly too, so that an S3-compatible store works whatever the version."""
    options = dict(storage_options or {})
    if uri.startswith(("s3://", "s3a://")):
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint and "endpoint_url" not in options and "endpoint_url" not in options.get("client_kwargs", {}):
            options["endpoint_url"] = endpoint
    try:
        return fsspec.core.url_to_fs(uri, **options)
    except (ImportError, ValueError) as error:
        raise CorpusError(uri, f"no file system for this address: {error}",
                          "local paths and s3:// are supported; other schemes need their fsspec package") from None


def detect_format(path: str) -> tuple[str | None, str | None]:
    """(format, compression) from a file's name, e.g. "a/b.jsonl.gz" -> ("jsonl", "gzip"); None where unknown."""
    stem, suffix = posixpath.splitext(path.lower())
    compression = SUFFIX_COMPRESSIONS.get(suffix)
    if compression:
        stem, suffix = posixpath.splitext(stem)
    return SUFFIX_FORMATS.get(suffix), compression


def _hidden(relative: str) -> bool:
    # Spark's _SUCCESS and _committed_*, .crc and .DS_Store files sit beside the data: never documents.
    return any(part.startswith((".", "_")) for part in relative.split("/"))


def fingerprint(info: dict) -> str:
    """What tells a changed file from the one the job was planned on: the ETag where the store has one, else
    the modification time; the size always."""
    for key in ("ETag", "etag", "md5", "crc32c", "mtime", "LastModified", "last_modified"):
        if info.get(key) is not None:
            return f"size={info.get('size')};{key.lower()}={str(info[key]).strip(chr(34))}"
    return f"size={info.get('size')}"


def _glob_root(path: str) -> str:
    """The directory part of a glob before its first wildcard: names below it make the generated ids."""
    parts = path.split("/")
    for index, part in enumerate(parts):
        if any(c in part for c in _GLOB_CHARACTERS):
            return "/".join(parts[:index])
    return posixpath.dirname(path)


def _list(fs: fsspec.AbstractFileSystem, path: str, spec: str) -> tuple[dict[str, dict], str, bool]:
    """{path: info} of the files `spec` names, the root their names are relative to, and whether it was one
    file named outright."""
    if any(c in path for c in _GLOB_CHARACTERS):
        found = fs.glob(path, detail=True)
        return {p: i for p, i in found.items() if i.get("type") != "directory"}, _glob_root(path), False
    if fs.isdir(path):
        return fs.find(path, detail=True), path.rstrip("/"), False
    if fs.isfile(path):
        return {path: fs.info(path)}, posixpath.dirname(path), True
    raise CorpusError(spec, "no such file or directory",
                      "check the path; for s3:// check the bucket, the credentials and AWS_ENDPOINT_URL")


def resolve_inputs(spec: str, format: str | None = None, storage_options: dict | None = None) -> list[InputFile]:
    """The files INPUT names, sorted by URI. A directory is read recursively, skipping hidden names (".x", "_x");
    without `format`, files whose suffix names no known format are skipped (and none found is an error that
    lists what was there); a file named outright must have a known suffix or come with `format`."""
    if format is not None and format not in FORMATS:
        raise CorpusError(spec, f"unknown format {format!r}", f"use one of {', '.join(FORMATS)}")
    fs, path = open_filesystem(spec, storage_options)
    if not any(c in spec for c in _GLOB_CHARACTERS):
        path = path.rstrip("/") or path
    try:
        listed, root, named_outright = _list(fs, path, spec)
    except PermissionError as error:
        raise CorpusError(spec, f"not allowed to list it: {error}",
                          "check the permissions or the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE, ...)") from None
    except (OSError, ValueError) as error:
        raise CorpusError(spec, f"cannot list it: {type(error).__name__}: {error}",
                          "check the path, the network and the credentials") from None

    files, skipped = [], []
    for file_path, info in listed.items():
        relative = posixpath.relpath(file_path, root) if root else file_path
        if not named_outright and _hidden(relative):
            continue
        detected, compression = detect_format(file_path)
        chosen = format or detected
        if chosen is None:
            if named_outright:
                raise CorpusError(spec, "cannot tell the format from the file's name",
                                  f"pass --format ({'|'.join(FORMATS)}) or use a known suffix: "
                                  f"{', '.join(sorted(SUFFIX_FORMATS))}")
            skipped.append(relative)
            continue
        if chosen == "parquet" and compression is not None:
            raise CorpusError(fs.unstrip_protocol(file_path) if "://" in spec else file_path,
                              "a Parquet file cannot be compressed as a whole",
                              "decompress it; Parquet compresses inside")
        uri = fs.unstrip_protocol(file_path) if "://" in spec else os.path.abspath(file_path)
        files.append(InputFile(uri=uri, format=chosen, size=int(info.get("size") or 0),
                               fingerprint=fingerprint(info), name=relative, compression=compression))
    if not files:
        seen = f"files found: {', '.join(sorted(skipped)[:5])}{' ...' if len(skipped) > 5 else ''}" if skipped \
            else "it holds no files"
        raise CorpusError(spec, f"no input files ({seen})",
                          f"inputs are {', '.join(sorted(SUFFIX_FORMATS))} (optionally .gz/.bz2/.xz/.zst); "
                          "pass --format to read other names")
    return sorted(files, key=lambda f: f.uri)
