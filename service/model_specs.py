"""Which models a server serves, and the settings each of them has of its own.

`--checkpoint` may be given more than once, each time `[NAME=]SOURCE` (a directory or a Hub id `org/name[@rev]`);
the first is the default model, which the routes without a `/models/{name}` prefix serve. Without a NAME, the name
is the Hub id's last part or the directory's name. `--model-setting NAME:KEY=VALUE` sets one of PER_MODEL for one
model; the others keep the server-wide setting of the same name. Both also come from the environment, as a list
separated by commas or a JSON list (`BERT_CHECKPOINT="embed=sentence-transformers/all-MiniLM-L6-v2,rerank=/models/r"`).
Pure: no torch, no I/O.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
DTYPES = ("auto", "float32", "float16", "bfloat16", "int8")
ROOT_TASKS = ("auto", "feature-extraction", "fill-mask", "sentence-similarity", "text-classification",
              "token-classification", "question-answering")
CLASSIFIER_PAIRS = ("auto", "yes", "no")
# What may differ between the models of one server, and how each value is read.
PER_MODEL = {"dtype": DTYPES, "root_task": ROOT_TASKS, "classifier_pairs": CLASSIFIER_PAIRS, "weight": float,
             "max_queue_items": int}


class ModelSpecError(ValueError):
    """A --checkpoint or --model-setting that cannot work; the message names it."""


@dataclass(frozen=True)
class ModelSpec:
    """One served model: its name, where it comes from, and its own settings (the server's where not set)."""

    name: str
    checkpoint: str
    dtype: str = "auto"
    root_task: str = "auto"
    classifier_pairs: str = "auto"
    weight: float = 1.0  # its share of the device against the other models', in tokens
    max_queue_items: int = 4096
    named: bool = False  # the name was given (NAME=SOURCE), not made from the source


def as_list(value) -> list[str]:
    """A list setting from a flag (a list already), or the environment: a JSON list, or items separated by commas."""
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    text = str(value).strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except ValueError as exc:
            raise ModelSpecError(f"not a JSON list: {exc}") from None
        if not isinstance(items, list):
            raise ModelSpecError("expected a JSON list")
        return [str(v) for v in items]
    return [part.strip() for part in text.split(",") if part.strip()]


def split_named(entry: str) -> tuple[str | None, str]:
    """`NAME=SOURCE` -> (NAME, SOURCE); a SOURCE alone -> (None, SOURCE). A Hub id has no '='; a path might, so
    only a valid model name before the first '=' counts as one."""
    head, sep, tail = entry.partition("=")
    if sep and NAME.fullmatch(head) and tail:
        return head, tail
    return None, entry


def default_name(source: str) -> str:
    """The name a model gets without one: a Hub id's last part (without @revision), else the directory's name."""
    base = source.rstrip("/").split("@", 1)[0].rstrip("/")
    name = base.rsplit("/", 1)[-1] or "model"
    return name if NAME.fullmatch(name) else re.sub(r"[^A-Za-z0-9._-]", "-", name).strip("-.")[:64] or "model"


def model_specs(checkpoints: list[str], model_settings: list[str], defaults: dict) -> list[ModelSpec]:
    """Every served model, the default first. `defaults`: the server-wide values of PER_MODEL's keys."""
    if not checkpoints:
        raise ModelSpecError("--checkpoint: give at least one model")
    specs: dict[str, dict] = {}
    for entry in checkpoints:
        name, source = split_named(entry)
        if name is None and "=" in entry.partition("/")[0] and not entry.startswith(("/", ".")):
            head = entry.partition("=")[0]
            raise ModelSpecError(f"--checkpoint {entry!r}: {head!r} is no model name (letters, digits, '.', '_' "
                                 "and '-', starting with a letter or digit)")
        named = name is not None
        name = name or default_name(source)
        if name in specs:
            raise ModelSpecError(f"--checkpoint: two models are named {name!r} ({specs[name]['checkpoint']} and "
                                 f"{source}); name them: --checkpoint NAME=SOURCE")
        specs[name] = {"name": name, "checkpoint": source, "named": named, **{k: defaults[k] for k in PER_MODEL}}
    for entry in model_settings:
        name, key, value = _model_setting(entry)
        if name not in specs:
            raise ModelSpecError(f"--model-setting {entry!r}: no model is named {name!r} (served: "
                                 f"{', '.join(specs)})")
        specs[name][key] = value
    return [ModelSpec(**values) for values in specs.values()]


def _model_setting(entry: str) -> tuple[str, str, object]:
    name, colon, rest = entry.partition(":")
    key, equals, text = rest.partition("=")
    key = key.strip().replace("-", "_")
    if not colon or not equals or not name:
        raise ModelSpecError(f"--model-setting {entry!r}: write NAME:KEY=VALUE, e.g. rerank:dtype=int8")
    if key not in PER_MODEL:
        raise ModelSpecError(f"--model-setting {entry!r}: {key!r} cannot differ between models (it can: "
                             f"{', '.join(PER_MODEL)})")
    kind = PER_MODEL[key]
    if isinstance(kind, tuple):
        if text not in kind:
            raise ModelSpecError(f"--model-setting {entry!r}: {key} must be one of {', '.join(kind)}")
        return name, key, text
    try:
        value = kind(text)
    except ValueError:
        raise ModelSpecError(f"--model-setting {entry!r}: {key} must be a number") from None
    if value <= 0:
        raise ModelSpecError(f"--model-setting {entry!r}: {key} must be above 0")
    return name, key, value
