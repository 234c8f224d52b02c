"""Provenance that any reader can follow: the paths in a recorded command or fact, rewritten so that they name no
machine.

Generated files that travel with the repository or a checkpoint (training metadata, model cards, BENCHMARKS.md's
report, the GPU run summaries) record how they were made. The command is worth keeping; the absolute paths in it
(where the repository was checked out, a home folder, an interpreter's prefix) are not: a reader can neither follow
nor reproduce them. So every path is written relative to the repository (`checkpoints/x`, `../shared/data/...`),
a package's files by their place in site-packages, a home folder as `~`, and anything else by its last name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
# An absolute path inside a command or a message: a slash not preceded by a name, a dot or a URL's "//".
_ABSOLUTE = re.compile(r"(?<![\w.~/:-])/(?:[\w.+@-]+/?)+")
_SITE_PACKAGES = re.compile(r".*/(?:site|dist)-packages/")


def portable_path(path: str, root: Path = REPO_ROOT, home: Path | None = None) -> str:
    """`path` (absolute) as a reader elsewhere can take it: relative to `root` (the repository) or its parent,
    `<site-packages>/...`, `~/...`, or else its last name. A path whose first folder this machine lacks (a URL's
    route such as /v1/embeddings) is no machine's path and stays as it is."""
    home = Path.home() if home is None else home
    trailing = "/" if path.endswith("/") and len(path) > 1 else ""
    absolute = Path(path)
    if _SITE_PACKAGES.match(path):
        return _SITE_PACKAGES.sub("<site-packages>/", path)
    for base, prefix in ((root, ""), (root.parent, "../")):
        if absolute == base:
            return "." if not prefix else ".."
        if absolute.is_relative_to(base) and base != Path("/"):
            return prefix + str(absolute.relative_to(base)) + trailing
    if home != Path("/") and absolute.is_relative_to(home):
        return "~/" + str(absolute.relative_to(home)) + trailing
    if len(absolute.parts) < 2 or not (Path("/") / absolute.parts[1]).exists():
        return path
    return absolute.name


def portable_text(text: str, root: Path = REPO_ROOT, home: Path | None = None) -> str:
    """`text` with every absolute path in it rewritten by portable_path."""
    return _ABSOLUTE.sub(lambda match: portable_path(match.group(0), root, home), text)


def portable(value: Any, root: Path = REPO_ROOT, home: Path | None = None) -> Any:
    """A JSON-like value (dicts, lists, strings, numbers) with every string rewritten by portable_text."""
    if isinstance(value, str):
        return portable_text(value, root, home)
    if isinstance(value, dict):
        return {key: portable(item, root, home) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(item, root, home) for item in value]
    return value
