"""Where a checkpoint comes from: a local directory, or a Hugging Face Hub id resolved into the standard cache.

`resolve_checkpoint("org/name@revision")` downloads, through `huggingface_hub`, only the files our loader
reads (never pickle weights) into the cache every Hugging Face tool shares (HF_HOME / HF_HUB_CACHE), and
returns the snapshot directory. What the library already does well is left to it: atomic writes (a
transfer lands in `blobs/<etag>.<random>.incomplete` and is renamed only when complete, so a cut download
never looks finished; a connection cut mid-file is resumed with a Range request within the same start, and
a file that still fails is deleted and fetched anew by the next start), file locks between processes sharing
one cache, HF_TOKEN, HF_ENDPOINT, and HF_HUB_OFFLINE=1 (answer from the cache alone). Every failure becomes one
CheckpointSourceError line naming the id and what to do.

This module imports neither torch nor the checkpoint code: `python -m service` resolves before it binds its
port and before it pays for torch.
"""

from __future__ import annotations

import errno
import fnmatch
import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from model.hub_progress import DownloadProgress, ProgressBars

log = logging.getLogger("model.hub")

# What model/checkpoint.py, model/tokenizer.py, model/pooling.py and model/late_interaction.py read (and the model
# card, for the trainer's provenance): nothing else is fetched. Patterns are fnmatch's, where "*" also crosses "/".
WANTED_FILES = (
    "config.json", "model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors",
    "vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "modules.json", "*Pooling/config.json", "sentence_bert_config.json", "config_sentence_transformers.json",
    "training_metadata.json", "README.md",
    # a ColBERT's projection: PyLate's Dense modules (older ones as pytorch_model.bin, read with weights_only),
    # colbert-ai's settings
    "*Dense/config.json", "*Dense/model.safetensors", "*Dense/pytorch_model.bin", "artifact.metadata",
)
SAFETENSORS_WEIGHTS = ("model.safetensors", "model.safetensors.index.json")
PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")
# org/name with the Hub's own characters, then an optional @revision (a branch, tag, commit or refs/pr/N).
HUB_ID = re.compile(r"^(?P<id>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w./-]+))?$")
GUIDE = "docs/hub-models.md"


class CheckpointSourceError(ValueError):
    """The checkpoint named cannot be found or fetched; the one-line message names it and says what to do."""


@dataclass(frozen=True)
class ResolvedCheckpoint:
    path: Path  # a directory load_checkpoint opens
    hub_id: str | None = None  # org/name when it came from the Hub
    revision: str | None = None  # as asked (None = the default branch)
    commit: str | None = None  # the commit hash it resolved to


def hub_cache() -> Path:
    """The Hub cache, read from the environment at call time (the library reads it once, at import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants
    return Path(constants.HF_HUB_CACHE)


def offline() -> bool:
    from huggingface_hub import constants
    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def resolve_checkpoint(spec: str | os.PathLike, *, progress: Callable[[DownloadProgress], None] | None = None
                       ) -> ResolvedCheckpoint:
    """A local directory as it is (it wins when one exists under that name), else `org/name[@revision]` from the
    Hub cache, downloaded first if needed. `progress` is called with each step of a download."""
    text = os.fspath(spec)
    local = Path(text).expanduser()
    if local.is_dir():
        return ResolvedCheckpoint(local)
    match = HUB_ID.fullmatch(text)
    if match is None:
        raise CheckpointSourceError(f"checkpoint {text}: not a directory, and not a Hugging Face Hub id "
                                    "(org/name or org/name@revision)")
    return _from_hub(match["id"], match["revision"], progress)


def _from_hub(hub_id: str, revision: str | None, progress) -> ResolvedCheckpoint:
    import httpx2
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    name = hub_id + (f"@{revision}" if revision else "")
    cache = hub_cache()
    endpoint = os.environ.get("HF_ENDPOINT") or None
    unreachable: str | None = "HF_HUB_OFFLINE is set" if offline() else None
    listing: dict[str, int | None] | None = None
    commit: str | None = None
    try:
        if unreachable is None:
            info = HfApi(endpoint=endpoint).model_info(hub_id, revision=revision, files_metadata=True)
            listing = {sibling.rfilename: sibling.size for sibling in info.siblings or ()}
            commit = info.sha
    except GatedRepoError:
        raise CheckpointSourceError(_gated(name, hub_id)) from None
    except RevisionNotFoundError:
        raise CheckpointSourceError(f"{name}: the model has no revision {revision!r} (a branch, tag or commit "
                                    "hash): check what follows the @") from None
    except RepositoryNotFoundError:
        raise CheckpointSourceError(f"{name}: no such directory here, and no such model on the Hugging Face Hub (or "
                                    "it is private: set HF_TOKEN to a token that can read it)") from None
    except (httpx2.TransportError, OfflineModeIsEnabled, HfHubHTTPError) as exc:
        # The Hub cannot answer: a complete copy in the cache still serves, as the library itself does.
        unreachable = _reason(exc)
        log.warning("%s: cannot reach the Hub (%s); looking in the cache %s", name, unreachable, cache)

    missing = 0
    if listing is not None:
        files = _choose_files(name, listing)
        missing = _missing_bytes(cache, hub_id, commit, listing, files)
        _check_free_space(name, cache, missing)
        log.info("%s: %d files, %.1f MB to fetch into %s", name, len(files), missing / 1e6, cache)
    bars = ProgressBars(name, progress, missing)
    snapshot = _snapshot_download(name, hub_id, revision, cache, endpoint, offline=listing is None,
                                  unreachable=unreachable, bars=bars)
    bars.finish()
    if not any((snapshot / weights).is_file() for weights in SAFETENSORS_WEIGHTS):
        raise CheckpointSourceError(f"{name}: the cached copy in {snapshot} has no model.safetensors; run once with "
                                    "network access to fetch it")
    return ResolvedCheckpoint(snapshot, hub_id, revision, snapshot.name)


def _choose_files(name: str, listing: dict[str, int | None]) -> list[str]:
    files = [path for path in listing if any(fnmatch.fnmatch(path, pattern) for pattern in WANTED_FILES)]
    if any(path in listing for path in SAFETENSORS_WEIGHTS):
        return files
    pickled = [path for path in listing if path in PICKLE_WEIGHTS]
    if pickled:
        raise CheckpointSourceError(
            f"{name}: the model has only pickle weights ({', '.join(pickled)}), which this server never loads (pickle "
            "can run code): pick a revision with model.safetensors (often a refs/pr/N safetensors conversion: "
            "org/name@refs/pr/N), or convert it with transformers' save_pretrained(safe_serialization=True) and serve "
            "that directory")
    raise CheckpointSourceError(f"{name}: the model has no model.safetensors (its files: "
                                f"{', '.join(sorted(listing)[:12])}): it is not a checkpoint this server can load")


def _missing_bytes(cache: Path, hub_id: str, commit: str | None, listing: dict[str, int | None],
                   files: list[str]) -> int:
    """What the cache lacks of `files`, by the sizes the Hub listed."""
    snapshot = cache / ("models--" + hub_id.replace("/", "--")) / "snapshots" / str(commit)
    return sum(listing[path] or 0 for path in files if not (snapshot / path).is_file())


def _check_free_space(name: str, cache: Path, needed: int) -> None:
    """Refuse before downloading when the cache's disk cannot take what it lacks; the library itself only warns,
    and a full disk would then fail halfway through."""
    probe = cache
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed > free:
        raise CheckpointSourceError(_no_space(name, cache, f"needs {needed / 1e6:.0f} MB but {free / 1e6:.0f} MB "
                                                           "are free there"))


def _snapshot_download(name, hub_id, revision, cache: Path, endpoint, *, offline: bool, unreachable, bars) -> Path:
    import httpx2
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(hub_id, revision=revision, cache_dir=cache, endpoint=endpoint,
                                      allow_patterns=list(WANTED_FILES), local_files_only=offline,
                                      tqdm_class=bars.tqdm_class()))
    except LocalEntryNotFoundError:  # IncompleteSnapshotError is one too
        why = unreachable or "the Hub could not be reached"
        raise CheckpointSourceError(
            f"{name}: {why}, and the cache {cache} holds no complete copy of it: connect once (or unset "
            f"HF_HUB_OFFLINE), or pre-fill the cache as {GUIDE} shows") from None
    except GatedRepoError:
        raise CheckpointSourceError(_gated(name, hub_id)) from None
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise CheckpointSourceError(_no_space(name, cache, "the disk filled up during the download")) from None
        if exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
            raise CheckpointSourceError(f"{name}: cannot write to the cache {cache} ({exc.strerror}): set HF_HOME "
                                        "to a writable directory") from None
        raise CheckpointSourceError(_cut(name, cache, exc)) from None
    except (httpx2.TransportError, HfHubHTTPError) as exc:
        raise CheckpointSourceError(_cut(name, cache, exc)) from None


def _gated(name: str, hub_id: str) -> str:
    from huggingface_hub import get_token

    if get_token():  # HF_TOKEN, or the file at HF_TOKEN_PATH (a mounted secret), or `hf auth login`'s
        return (f"{name}: the model is gated and HF_TOKEN has no access to it: accept its terms on its Hub page "
                f"(huggingface.co/{hub_id}) with the token's account")
    return (f"{name}: the model is gated or private: accept its terms on its Hub page (huggingface.co/{hub_id}) and "
            "set HF_TOKEN to a token of that account")


def _no_space(name: str, cache: Path, why: str) -> str:
    return f"{name}: not enough disk space in the cache {cache}: {why}; free some, or point HF_HOME at a larger volume"


def _cut(name: str, cache: Path, exc: Exception) -> str:
    return (f"{name}: the download was cut ({_reason(exc)}) and nothing of the unfinished file was kept in {cache}; "
            "start again to fetch it (the library resumes a cut transfer itself only within one start)")


def _reason(exc: Exception) -> str:
    """The first line of an exception's message, for a one-line error."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    """`python -m model.hub ID[@REVISION]...`: fill the Hub cache (HF_HOME) for a later offline start (an init
    container, an air-gapped host) with exactly the files the server reads; prints each snapshot directory."""
    import sys

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    specs = sys.argv[1:] if argv is None else argv
    if not specs or any(spec.startswith("-") for spec in specs):
        print("usage: python -m model.hub org/name[@revision] ...  (fills the Hub cache at HF_HOME)", file=sys.stderr)
        return 2
    for spec in specs:
        try:
            print(resolve_checkpoint(spec).path)
        except CheckpointSourceError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
