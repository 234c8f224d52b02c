"""The fastembed peer of the corpus benchmark: a text file (one document a line) to Parquet with fastembed's
`TextEmbedding.embed`, ONNX Runtime underneath, as many pick it to embed on a CPU. It runs in the peers' virtual
environment (requirements/peers.txt) and imports nothing from this repository but its sibling peer_parquet.py;
bench.corpus starts it as a child and reads the one JSON line it prints.

Nothing is downloaded: the model is exported here to ONNX (float32, `transformers`' BertModel, its last hidden
state; fastembed's own all-MiniLM-L6-v2 is such a float32 export) into a folder beside the tokenizer's files, and
registered with `TextEmbedding.add_custom_model` (mean pooling, normalized), loaded with `specific_model_path`.
Defaults otherwise (batch 256, one ONNX Runtime session on every core). The clock runs from reading the text file to
the last Parquet file closed; the export and the session's start-up are outside it.

    .venv-peers/bin/python bench/corpus/fastembed_peer.py --model DIR --texts corpus.txt --output DIR --work DIR
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from peer_parquet import embed_file  # a sibling: run as a script, this file's folder is first on sys.path

# The model's name in fastembed's registry: its own for all-MiniLM-L6-v2 is taken, and would be downloaded.
REGISTERED_NAME = "bench-corpus/local-export"
TOKENIZER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def export(model_dir: Path, work: Path) -> Path:
    """`work/fastembed-model/`: model.onnx (input_ids, attention_mask, token_type_ids -> last_hidden_state, dynamic
    batch and length) and the tokenizer's files; reused when whole."""
    import torch
    import transformers

    target = work / "fastembed-model"
    if (target / "model.onnx").is_file():
        return target
    partial = work / "fastembed-model.partial"  # renamed into place when whole
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, partial / name)
    bert = transformers.BertModel.from_pretrained(str(model_dir), add_pooling_layer=False).float().eval()

    class LastHiddenState(torch.nn.Module):  # keywords: BertModel's positional order changes between versions
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    example = (torch.tensor([[101, 2023, 102]]), torch.ones(1, 3, dtype=torch.long),
               torch.zeros(1, 3, dtype=torch.long))
    axes = {0: "batch", 1: "sequence"}
    torch.onnx.export(LastHiddenState(), example, str(partial / "model.onnx"),
                      input_names=["input_ids", "attention_mask", "token_type_ids"],
                      output_names=["last_hidden_state"], dynamo=False, opset_version=17,
                      dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes,
                                    "last_hidden_state": axes})
    partial.rename(target)
    return target


def load_model(exported: Path, dimension: int, work: Path):
    from fastembed import TextEmbedding
    from fastembed.common.model_description import ModelSource, PoolingType

    TextEmbedding.add_custom_model(model=REGISTERED_NAME, pooling=PoolingType.MEAN, normalization=True,
                                   sources=ModelSource(hf=REGISTERED_NAME), dim=dimension, model_file="model.onnx")
    return TextEmbedding(REGISTERED_NAME, cache_dir=str(work / "fastembed-cache"), specific_model_path=str(exported),
                         local_files_only=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a Hugging Face BERT directory (all-MiniLM-L6-v2)")
    parser.add_argument("--texts", type=Path, required=True, help="one document a line")
    parser.add_argument("--output", type=Path, required=True, help="a directory for the Parquet files")
    parser.add_argument("--work", type=Path, required=True, help="where the ONNX export and fastembed's cache go")
    parser.add_argument("--rows-per-file", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=256, help="embed's batch size (256 is its default)")
    args = parser.parse_args(argv)

    import fastembed
    import numpy as np

    started = time.perf_counter()
    exported = export(args.model, args.work)
    dimension = json.loads((args.model / "config.json").read_text())["hidden_size"]
    model = load_model(exported, dimension, args.work)
    list(model.embed(["warm up"] * 4))

    def embed(texts: list[str]):  # embed yields one vector a text
        return np.stack(list(model.embed(texts, batch_size=args.batch_size)))

    loaded = time.perf_counter()
    rows = embed_file(embed, args.texts, args.output, args.rows_per_file)
    seconds = time.perf_counter() - loaded
    print(json.dumps({"system": "fastembed", "version": fastembed.__version__, "rows": rows, "seconds": seconds,
                      "load_seconds": loaded - started}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
