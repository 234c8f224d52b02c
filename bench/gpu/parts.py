"""A directory carried back from a GPU machine in parts: packed into one tar, cut into parts of at most 16 MiB
(what such a machine hands back: a few files of bounded size), with a manifest of every part's and the whole's
sha256; joined here, checked against the manifest, and unpacked. A part missing, cut short or changed fails the
join, naming it.

    python -m bench.gpu.parts pack DIR OUT          # on the GPU machine (bench.gpu.train_bundled does it)
    python -m bench.gpu.parts join OUT TARGET       # here: verify the hashes, unpack DIR's files into TARGET
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import sys
import tarfile
from pathlib import Path

PART_BYTES = 16 * 2**20
MANIFEST = "manifest.json"
PREFIX = "model.tar.part-"


class PartsError(Exception):
    pass


def pack(source: Path, out: Path, files: list[str] | None = None, part_bytes: int = PART_BYTES) -> dict:
    """`source`'s files (those named in `files`, else every plain file at its top) as a tar cut into parts in `out`,
    the manifest written last (a pack cut short has none)."""
    names = sorted(files if files is not None else [p.name for p in source.iterdir() if p.is_file()])
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in names:
            tar.add(source / name, arcname=name)
    data = buffer.getvalue()
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    for index, start in enumerate(range(0, len(data), part_bytes)):
        chunk = data[start:start + part_bytes]
        name = f"{PREFIX}{index:03d}"
        (out / name).write_bytes(chunk)
        parts.append({"name": name, "bytes": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    manifest = {"files": names, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "parts": parts}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def join(parts_dir: Path, target: Path) -> dict:
    """Check every part and the whole against the manifest, then unpack into `target` (replaced whole)."""
    try:
        manifest = json.loads((parts_dir / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PartsError(f"{parts_dir / MANIFEST}: missing or unreadable ({exc}); the pack did not finish") from None
    whole = hashlib.sha256()
    chunks = []
    for part in manifest["parts"]:
        path = parts_dir / part["name"]
        if not path.is_file():
            raise PartsError(f"part {part['name']} is missing")
        chunk = path.read_bytes()
        if len(chunk) != part["bytes"] or hashlib.sha256(chunk).hexdigest() != part["sha256"]:
            raise PartsError(f"part {part['name']}: {len(chunk)} bytes whose sha256 is not the manifest's")
        whole.update(chunk)
        chunks.append(chunk)
    if whole.hexdigest() != manifest["sha256"]:
        raise PartsError("the joined parts' sha256 is not the manifest's")
    tmp = target.with_name(f".{target.name}.joining")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r") as tar:
        members = tar.getmembers()
        if sorted(m.name for m in members) != sorted(manifest["files"]) or \
                not all(m.isfile() and "/" not in m.name for m in members):
            raise PartsError("the tar holds other files than the manifest names")
        tar.extractall(tmp, filter="data")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.parts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="verb", required=True)
    packing = sub.add_parser("pack")
    packing.add_argument("source", type=Path)
    packing.add_argument("out", type=Path)
    joining = sub.add_parser("join")
    joining.add_argument("parts", type=Path)
    joining.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    try:
        manifest = pack(args.source, args.out) if args.verb == "pack" else join(args.parts, args.target)
    except PartsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.verb}: {len(manifest['parts'])} parts, {manifest['bytes']:,} bytes, sha256 {manifest['sha256']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
