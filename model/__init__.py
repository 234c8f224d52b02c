"""The BERT network, its WordPiece tokenizer and the checkpoint directory format.

Names are imported on first use: `import model.config` or `model.tokenizer` must not pay for torch
(the trainer's --help and its corpus-preparation workers import them).
"""

from __future__ import annotations

import importlib

_HOMES = {
    "BertForPreTraining": "model.bert", "BertModel": "model.bert", "PreTrainingOutput": "model.bert",
    "model_flops_per_token": "model.flops", "attention_pads": "model.attention",
    "Checkpoint": "model.checkpoint_files", "CheckpointError": "model.checkpoint_files", "load_checkpoint": "model.checkpoint",
    "save_checkpoint": "model.checkpoint",
    "PRESETS": "model.config", "BertConfig": "model.config", "ConfigError": "model.config",
    "SPECIAL_TOKENS": "model.tokenizer", "TokenizerError": "model.tokenizer", "WordPieceTokenizer": "model.tokenizer",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'model' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value
