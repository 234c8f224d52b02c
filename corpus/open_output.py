"""Which `Output` an `--output` names: an object store's URI (`s3://...`, or another fsspec scheme) or a local
directory. Apart from corpus.output, whose two implementations import it."""

from __future__ import annotations

from corpus.local_output import LocalOutput
from corpus.output import Output
from corpus.store_output import StoreOutput


def is_object_store(uri: str) -> bool:
    return "://" in uri and not uri.startswith("file://")


def open_output(uri: str) -> Output:
    """The output `--output` names: `s3://...` (or another fsspec scheme) is an object store, anything else a local
    directory."""
    if is_object_store(uri):
        return StoreOutput(uri)
    return LocalOutput(uri.removeprefix("file://"))
