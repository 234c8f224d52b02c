"""The BERT network, its WordPiece tokenizer and the checkpoint directory format."""

from model.bert import BertForPreTraining, BertModel, PreTrainingOutput, model_flops_per_token
from model.checkpoint import Checkpoint, CheckpointError, load_checkpoint, save_checkpoint
from model.config import PRESETS, BertConfig, ConfigError
from model.tokenizer import SPECIAL_TOKENS, TokenizerError, WordPieceTokenizer

__all__ = [
    "PRESETS",
    "SPECIAL_TOKENS",
    "BertConfig",
    "BertForPreTraining",
    "BertModel",
    "Checkpoint",
    "CheckpointError",
    "ConfigError",
    "PreTrainingOutput",
    "TokenizerError",
    "WordPieceTokenizer",
    "load_checkpoint",
    "model_flops_per_token",
    "save_checkpoint",
]
