"""A checkpoint's sentence-embedding recipe, from its sentence-transformers files when it has them.

sentence-transformers saves `modules.json` (the pipeline: Transformer, Pooling, Normalize, ...) and
`<n>_Pooling/config.json` (`pooling_mode_cls_token`, `pooling_mode_mean_tokens`, ...). A model trained
that way is meant to be pooled that way: a checkpoint fine-tuned with CLS pooling gives poor vectors
when mean-pooled. Without those files, mean pooling is the default (what most BERT embedders use).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from model.files import read_json_object

SUPPORTED_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean"}


class PoolingConfigError(ValueError):
    """The sentence-transformers files are unreadable or ask for pooling this server does not do."""


@dataclass(frozen=True)
class PoolingRecipe:
    mode: str  # "mean" or "cls"
    normalize: bool  # the pipeline ends in a Normalize module
    source: str  # where the recipe came from, for /info
    # sentence-transformers prompts (config_sentence_transformers.json): name -> text put before each input
    prompts: tuple[tuple[str, str], ...] = ()
    default_prompt_name: str | None = None
    # the input length sentence-transformers embeds (sentence_bert_config.json), where the checkpoint says: what the
    # model was meant to read at once (long inputs are read in windows of it)
    max_seq_length: int | None = None


PROMPTS_FILE = "config_sentence_transformers.json"
SEQUENCE_FILE = "sentence_bert_config.json"


def read_prompts(directory: Path) -> tuple[tuple[tuple[str, str], ...], str | None]:
    """(prompts, default prompt name) from sentence-transformers' config; none when it has none."""
    config = read_json_object(directory / PROMPTS_FILE, PoolingConfigError)
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise PoolingConfigError(f"{directory / PROMPTS_FILE}: prompts must map names to texts")
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise PoolingConfigError(f"{directory / PROMPTS_FILE}: default_prompt_name {default!r} is not a prompt")
    return tuple(sorted(prompts.items())), default


def read_max_seq_length(directory: Path) -> int | None:
    length = read_json_object(directory / SEQUENCE_FILE, PoolingConfigError).get("max_seq_length")
    if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length < 4):
        raise PoolingConfigError(f"{directory / SEQUENCE_FILE}: max_seq_length must be a number of tokens (4 or more)")
    return length


def read_pooling(directory: Path) -> PoolingRecipe:
    prompts, default_prompt = read_prompts(directory)
    return replace(_read_pooling_modules(directory), prompts=prompts, default_prompt_name=default_prompt,
                   max_seq_length=read_max_seq_length(directory))


def _read_pooling_modules(directory: Path) -> PoolingRecipe:
    modules_file = directory / "modules.json"
    if not modules_file.is_file():
        return PoolingRecipe("mean", False, "default (no sentence-transformers modules.json)")
    try:
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise PoolingConfigError(f"{modules_file}: not valid JSON ({exc})") from None
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise PoolingConfigError(f"{modules_file}: expected a list of modules")
    kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules}
    normalize = "Normalize" in kinds
    if "Pooling" not in kinds:
        return PoolingRecipe("mean", normalize, f"default ({modules_file.name} has no Pooling module)")
    config_file = directory / str(kinds["Pooling"].get("path", "1_Pooling")) / "config.json"
    config = read_json_object(config_file, PoolingConfigError, missing_ok=False)
    chosen = [mode for key, mode in SUPPORTED_MODES.items() if config.get(key)]
    others = sorted(k for k, v in config.items() if k.startswith("pooling_mode_") and v and k not in SUPPORTED_MODES)
    if others or len(chosen) != 1:
        raise PoolingConfigError(f"{config_file}: pooling {others or chosen or 'none'} is not supported; "
                                 "this server pools by mean or [CLS] (one of them)")
    return PoolingRecipe(chosen[0], normalize, f"sentence-transformers ({config_file.parent.name}/config.json)")
