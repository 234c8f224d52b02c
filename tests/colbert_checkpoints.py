"""ColBERT checkpoints for the tests, written in PyLate's and colbert-ai's layouts without those libraries (their own
builds are compared in tests/test_colbert_reference.py): a small random BERT, its tokenizer with the markers added as
tokens (as PyLate adds `[Q] ` and `[D] `), a random projection, and each format's settings file."""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch
from safetensors.torch import save_file

from model import BertForPreTraining, WordPieceTokenizer
from model.checkpoint import WEIGHTS_FILE
from tests.conftest import tiny_config

PYLATE_MARKERS = ("[Q] ", "[D] ")
COLBERT_AI_MARKERS = ("[unused0]", "[unused1]")


def pylate_checkpoint(directory: Path, tokenizer: WordPieceTokenizer, dims: tuple[int, ...] = (24,), bias: bool = False,
                      seed: int = 3, pickled_dense: bool = False, **settings) -> Path:
    """PyLate's layout: the encoder at the top (a transformers BertModel directory), one Dense module per width in
    `dims` (`1_Dense`, `2_Dense`, ...), and `settings` (query_length, document_length, do_query_expansion,
    attend_to_expansion_tokens, skiplist_words, ...) in config_sentence_transformers.json."""
    model = _encoder(directory, tokenizer, PYLATE_MARKERS, seed)
    widths = (model.config.hidden_size, *dims)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}]
    generator = torch.Generator().manual_seed(seed + 1)
    for index, (width_in, width_out) in enumerate(zip(widths, widths[1:]), start=1):
        path = directory / f"{index}_Dense"
        path.mkdir()
        tensors = {"linear.weight": torch.randn(width_out, width_in, generator=generator) / width_in ** 0.5}
        if bias:
            tensors["linear.bias"] = torch.randn(width_out, generator=generator) * 0.1
        if pickled_dense:  # as older PyLate and sentence-transformers versions wrote it
            torch.save(tensors, path / "pytorch_model.bin")
        else:
            save_file(tensors, str(path / "model.safetensors"))
        (path / "config.json").write_text(json.dumps({
            "in_features": width_in, "out_features": width_out, "bias": bias,
            "activation_function": "torch.nn.modules.linear.Identity", "use_residual": False}))
        modules.append({"idx": index, "name": str(index), "path": path.name, "type": "pylate.models.Dense.Dense"})
    (directory / "modules.json").write_text(json.dumps(modules))
    config = {"model_type": "ColBERT", "similarity_fn_name": "MaxSim", "query_prefix": PYLATE_MARKERS[0],
              "document_prefix": PYLATE_MARKERS[1], "skiplist_words": list(string.punctuation), **settings}
    (directory / "config_sentence_transformers.json").write_text(json.dumps(config))
    return directory


def colbert_ai_checkpoint(directory: Path, tokenizer: WordPieceTokenizer, dim: int = 20, seed: int = 5,
                          **metadata) -> Path:
    """colbert-ai's layout: an HF_ColBERT (the encoder's tensors under `bert.` and `linear.weight` beside them in one
    file) and `metadata` (query_maxlen, doc_maxlen, dim, mask_punctuation, ...) in artifact.metadata."""
    model = _encoder(directory, tokenizer, COLBERT_AI_MARKERS, seed)
    tensors = {name: tensor for name, tensor in model.state_dict().items()}
    tensors["linear.weight"] = torch.randn(dim, model.config.hidden_size, generator=torch.Generator().manual_seed(seed))
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(directory / WEIGHTS_FILE))
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "architectures": ["HF_ColBERT"]}))
    (directory / "artifact.metadata").write_text(json.dumps({"dim": dim, **metadata}))
    return directory


def _encoder(directory: Path, tokenizer: WordPieceTokenizer, markers: tuple[str, str], seed: int) -> BertForPreTraining:
    """A random BertModel (no heads) saved as transformers writes one, with `markers` added to its tokenizer."""
    directory.mkdir(parents=True)
    tokenizer.save(directory)
    definition = json.loads((directory / "tokenizer.json").read_text())
    for offset, marker in enumerate(markers):
        definition["added_tokens"].append({"id": tokenizer.vocab_size + offset, "content": marker, "single_word": False,
                                           "lstrip": False, "rstrip": False, "normalized": True, "special": False})
    (directory / "tokenizer.json").write_text(json.dumps(definition))
    (directory / "vocab.txt").unlink()  # the added tokens live in tokenizer.json only
    torch.manual_seed(seed)
    config = tiny_config(tokenizer.vocab_size + len(markers))
    model = BertForPreTraining(config, with_pooler=False, with_mlm=False, with_nsp=False).eval()
    with torch.no_grad():  # biases and norms away from their initial values, so that a wrong wiring shows
        for name, param in model.named_parameters():
            if "bias" in name or "LayerNorm" in name:
                param.add_(torch.randn_like(param) * 0.1)
    save_file({name: t.contiguous() for name, t in model.state_dict().items()}, str(directory / WEIGHTS_FILE))
    values = config.to_dict()
    values["architectures"] = ["BertModel"]
    (directory / "config.json").write_text(json.dumps(values))
    return model
