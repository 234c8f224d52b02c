"""The sentence-transformers peer of the corpus benchmark: a text file (one document a line) to Parquet with
`SentenceTransformer.encode`, as a user who writes the loop themselves would. It runs in the peers' virtual
environment (sentence-transformers, optimum and ONNX Runtime pin versions the service cannot share), so it
imports nothing from this repository but its sibling peer_parquet.py; bench.corpus starts it as a child and reads the
one JSON line it prints.

Backends: `torch` (the default float32 one) and `onnx-int8` (ONNX Runtime on a dynamic int8 export made with
sentence-transformers' own `export_dynamic_quantized_onnx_model`, its fastest CPU backend). The clock runs from
reading the text file to the last Parquet file closed; loading the model and exporting ONNX are outside it.

    .venv-peers/bin/python bench/corpus/st_peer.py --model DIR --texts corpus.txt --output DIR --backend torch
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from peer_parquet import embed_file  # a sibling: run as a script, this file's folder is first on sys.path


def load_model(model_dir: Path, backend: str, work: Path):
    from sentence_transformers import SentenceTransformer

    if backend == "torch":
        return SentenceTransformer(str(model_dir), device="cpu")
    if backend != "onnx-int8":
        raise SystemExit(f"unknown backend {backend!r} (torch or onnx-int8)")
    from sentence_transformers import export_dynamic_quantized_onnx_model

    # A copy of the model directory to hold the exports (the model's own directory may be read-only).
    copy = work / "onnx-model"
    if not copy.is_dir():
        shutil.copytree(model_dir, copy)
    config = quantization_config()
    quantized = f"onnx/model_qint8_{config}.onnx"
    if not (copy / quantized).is_file():
        exported = SentenceTransformer(str(copy), device="cpu", backend="onnx")  # exports onnx/model.onnx
        exported.save(str(copy))
        export_dynamic_quantized_onnx_model(exported, config, str(copy))
    return SentenceTransformer(str(copy), device="cpu", backend="onnx", model_kwargs={"file_name": quantized})


def quantization_config() -> str:
    """sentence-transformers' quantization presets are named by instruction set: the best this CPU has."""
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    if "avx512_vnni" in flags:
        return "avx512_vnni"
    if "avx512f" in flags:
        return "avx512"
    return "avx2" if "avx2" in flags else "arm64"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a sentence-transformers model directory")
    parser.add_argument("--texts", type=Path, required=True, help="one document a line")
    parser.add_argument("--output", type=Path, required=True, help="a directory for the Parquet files")
    parser.add_argument("--backend", default="torch", choices=["torch", "onnx-int8"])
    parser.add_argument("--work", type=Path, default=None, help="where the ONNX exports go (default: --output/..)")
    parser.add_argument("--rows-per-file", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=32, help="encode's batch size (32 is its default)")
    args = parser.parse_args(argv)

    import torch

    work = args.work or args.output.parent
    started = time.perf_counter()
    model = load_model(args.model, args.backend, work)
    model.encode(["warm up"] * 4)

    def encode(texts: list[str]):
        return model.encode(texts, batch_size=args.batch_size, normalize_embeddings=True, convert_to_numpy=True)

    loaded = time.perf_counter()
    rows = embed_file(encode, args.texts, args.output, args.rows_per_file)
    seconds = time.perf_counter() - loaded
    print(json.dumps({"backend": args.backend, "rows": rows, "seconds": seconds, "load_seconds": loaded - started,
                      "torch_threads": torch.get_num_threads()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
