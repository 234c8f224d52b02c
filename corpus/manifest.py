"""The job's manifest: its identity (every option that changes a vector, the plan's shard size), the model, the
inputs with their fingerprints and the plan, written by the job's first run and checked by every later one; once
the job is done, the rows, rejects and tokens of every shard, the totals and `"complete": true`."""

from __future__ import annotations

import json

from corpus.errors import CorpusError

VERSION = 1
_OTHER = "use another --output, or the same options as the run that made it"


def manifest_text(manifest: dict) -> str:
    return json.dumps(manifest, indent=2, ensure_ascii=False) + "\n"


def parse_manifest(text: str, where: str) -> dict:
    """The manifest in `text` (read from `where`), or a CorpusError saying that this output holds no job of ours."""
    try:
        manifest = json.loads(text)
    except ValueError as exc:
        raise CorpusError(where, f"unreadable manifest: {exc}",
                          "this output holds no job this command made; choose an empty --output") from None
    if not isinstance(manifest, dict) or "identity" not in manifest:
        raise CorpusError(where, "not a manifest of python -m corpus", "choose an empty --output")
    return manifest


def check_manifest(where: str, manifest: dict, identity: dict, model_identity: dict, inputs: list[dict]) -> None:
    """Refuse to resume into an output another job made: the first differing option, the model, or an input added,
    removed or changed since, each named."""
    for name in sorted(set(identity) | set(manifest["identity"])):
        was, now = manifest["identity"].get(name), identity.get(name)
        if was != now:
            flag = "--" + name.replace("_", "-")
            raise CorpusError(where, f"this output was made with {flag} {_shown(was)}, this run asks for "
                                     f"{_shown(now)}", _OTHER)
    if manifest.get("model") != model_identity:
        raise CorpusError(where, f"this output was made with another model ({_model_name(manifest.get('model'))}; "
                                 f"this run loads {_model_name(model_identity)})",
                          "use another --output, or the same --checkpoint as the run that made it")
    before = {entry["uri"]: entry for entry in manifest.get("inputs", [])}
    now_by_uri = {entry["uri"]: entry for entry in inputs}
    for uri in sorted(set(before) | set(now_by_uri)):
        if uri not in now_by_uri:
            raise CorpusError(uri, "this input was part of the job and is gone",
                              "restore it, or start the job again in an empty --output")
        if uri not in before:
            raise CorpusError(uri, "this input is new since the job started",
                              "embed it into another --output, or start the job again in an empty one")
        if before[uri]["fingerprint"] != now_by_uri[uri]["fingerprint"]:
            raise CorpusError(uri, "this input changed since the job started (size or modification time)",
                              "restore it, or start the job again in an empty --output")


def _shown(value) -> str:
    return "(not set)" if value is None else json.dumps(value) if not isinstance(value, str) else value


def _model_name(identity: dict | None) -> str:
    if not identity:
        return "unknown"
    if identity.get("hub_id"):
        return f"{identity['hub_id']}@{identity.get('commit') or identity.get('revision')}"
    return f"{identity.get('checkpoint')}, weights sha256 {str(identity.get('weights_sha256'))[:12]}"


def completed(manifest: dict, shards: list[dict]) -> dict:
    """The manifest of a finished job: `shards` ({"name", "rows", "rejects", "tokens"} each, as the output holds
    them), their totals, `complete: true`."""
    totals = {key: sum(shard[key] for shard in shards) for key in ("rows", "rejects", "tokens")}
    return {**manifest, "shards": shards, "totals": totals, "complete": True}
