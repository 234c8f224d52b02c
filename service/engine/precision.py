"""What number format the served model computes in, decided once at start-up from `--dtype` and the device.

- auto: bfloat16 on GPUs that have it, else float16; on a CPU, bfloat16 where the CPU computes it natively and the
  model's answers stay at float32's on the calibration sentences, else float32 (`service.engine.precision_probe`).
- bfloat16 / float16 / float32: weights and activations in that type.
- int8 (CPU only): the encoder's Linear layers in int8, per-token activation scales and SmoothQuant
  (`kernels.quantize`, scheme and alpha chosen by the fidelity and speed measurements in BENCHMARKS.md),
  calibrated at start-up on a few sentences shipped with the package; everything else (attention,
  LayerNorm, GELU, embeddings, heads) in float32. bfloat16 around the int8 products was tried and
  shipped once; measured again after the int8 layers' own elementwise work was trimmed, the two are
  level in speed within run-to-run noise, and float32 around them keeps fill-mask answers closer to
  float32 (top-1 agreement 98.7% vs 97.0%) with no conversions in and out of each int8 layer
  (BENCHMARKS.md). On CPUs with AVX512-VNNI and a C compiler each encoder layer runs as one C call
  (`kernels.int8_layer`); elsewhere as modules, their steps in numba's kernels or torch, their products in the
  VNNI kernel or torch._int_mm: the same bits in every case but attention's (`kernels.int8_path`). /info says
  which runs. In a late-interaction (ColBERT) model the feed-forward output layers' inputs are quantized to 12 bits
  instead of 8 (`for_model`): its answers are one vector per token, where int8's rounding does not average out over
  a sentence as in a pooled embedding, and that input (GELU's output, the intermediate size wide) carries the largest
  part of the error. With inputs that fine those layers take less smoothing (alpha 0.4), which leaves their weights
  easier to round (BENCHMARKS.md, "Reranking": mean cosine to float32's 0.9964 with 8 bits there, 0.9992 with 12).

On a CPU, at every precision, attention for short sequences runs in `kernels.attention`'s C kernel where the CPU
has AVX-512 (a bfloat16 model's in bfloat16 where it has AVX512-BF16, on AMX's tiles where it has AMX):
`prepare_model` installs it into the model. A bfloat16 model's encoder Linear layers run on AMX's tiles where the CPU
has them (`kernels.bf16_linear`, `on_tiles`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

import kernels
from model.bert import BertForPreTraining
from model.device import cpu_has_native_bf16
from model.fuse import fuse_attention_projections
from model.tokenizer import WordPieceTokenizer

log = logging.getLogger("service")
INT8_SCHEME = "per-token-smooth"
INT8_ALPHA = 0.65
LATE_INTERACTION_FEED_FORWARD_OUTPUT_BITS = 12
LATE_INTERACTION_FEED_FORWARD_OUTPUT_ALPHA = 0.4  # the middle of 0.3-0.5, where the vectors' cosine is level
CALIBRATION_TEXT = Path(__file__).with_name("data") / "calibration.txt"


class PrecisionError(ValueError):
    """The asked precision cannot run on this device; the message says what to ask for instead."""


@dataclass(frozen=True)
class Precision:
    name: str  # what /info shows
    dtype: torch.dtype  # of weights and activations outside int8 layers
    reason: str = ""  # how --dtype auto came to it (/info's dtype_reason); empty for an explicit --dtype
    feed_forward_output_bits: int = 8  # int8: what the feed-forward output layers' inputs are quantized to

    @property
    def is_int8(self) -> bool:
        return self.name.startswith("int8")


def choose(choice: str, device: torch.device) -> Precision:
    if choice == "int8":
        if device.type != "cpu":
            raise PrecisionError("--dtype int8 runs on CPU only (its int8 kernels are CPU ones); on a GPU use "
                                 "--dtype auto (bfloat16) or float16")
        from kernels import int8_layer, int8_path  # here, not at the top: only int8 pays for building its kernels

        if int8_layer.kernel() is None:
            log.warning("--dtype int8: %s (slower than one C call a layer)", int8_path.describe())
        return _int8(feed_forward_output_bits=8)
    if choice == "auto":
        if device.type != "cuda":  # the start-up decides on a CPU, with the model (precision_probe)
            return Precision("float32", torch.float32)
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        name = str(dtype).removeprefix("torch.")
        return Precision(name, dtype, f"auto: {name} (the fastest type this GPU computes natively)")
    if choice == "bfloat16" and device.type == "cpu" and not cpu_has_native_bf16():
        log.warning("--dtype bfloat16: this CPU has no native bfloat16 (AVX512-BF16 or AMX); it will be emulated "
                    "and slower than float32")
    return Precision(choice, getattr(torch, choice))


def _int8(feed_forward_output_bits: int) -> Precision:
    from kernels import int8_path

    inputs = "" if feed_forward_output_bits == 8 else \
        f", the feed-forward output layers' inputs {feed_forward_output_bits}-bit (alpha " \
        f"{LATE_INTERACTION_FEED_FORWARD_OUTPUT_ALPHA})"
    return Precision(f"int8 ({INT8_SCHEME}, alpha {INT8_ALPHA}; encoder Linear layers{inputs}; float32 elsewhere; "
                     f"{int8_path.describe()})", torch.float32, feed_forward_output_bits=feed_forward_output_bits)


def for_model(precision: Precision, late_interaction: bool) -> Precision:
    """The precision as it applies to a model: int8 on a late-interaction model quantizes the feed-forward output
    layers' inputs to 12 bits (see the module's text); everything else as chosen."""
    if not precision.is_int8 or not late_interaction:
        return precision
    return _int8(LATE_INTERACTION_FEED_FORWARD_OUTPUT_BITS)


def prepare_model(model: BertForPreTraining, precision: Precision, tokenizer: WordPieceTokenizer,
                  device: torch.device) -> BertForPreTraining:
    """The model as it will be served on `device`: with the CPU attention kernel installed, and quantized for int8
    (after calibration), else with each attention layer's query, key and value computed by one matrix product, and,
    in bfloat16 on a CPU, the encoder's Linear layers on AMX's tiles where it has them (`on_tiles`)."""
    kernels.install()
    if not precision.is_int8:
        model = fuse_attention_projections(model)
        return on_tiles(model) if precision.dtype == torch.bfloat16 and device.type == "cpu" else model
    from kernels.quantize import calibrate, quantize

    sentences = [line for line in CALIBRATION_TEXT.read_text(encoding="utf-8").splitlines() if line.strip()]
    batches = [(torch.tensor([e.ids]), torch.tensor([e.type_ids])) for e in tokenizer.encode_batch(sentences, truncate=True)]
    model = model.float().eval()
    stats = calibrate(model, batches)
    twelve_bits = precision.feed_forward_output_bits == LATE_INTERACTION_FEED_FORWARD_OUTPUT_BITS
    return quantize(model, INT8_SCHEME, stats, alpha=INT8_ALPHA,
                    feed_forward_output_bits=precision.feed_forward_output_bits,
                    feed_forward_output_alpha=LATE_INTERACTION_FEED_FORWARD_OUTPUT_ALPHA if twelve_bits else None)


def on_tiles(model: BertForPreTraining) -> BertForPreTraining:
    """A bfloat16 CPU model's encoder on AMX's tiles, where the CPU has AMX-BF16 and the kernels build: each Linear
    (kernels.bf16_linear: torch's bfloat16 Linear lays its weights out again at every call, 3-4x the time at a
    query's rows), and each layer in one C call up to a bulk batch's rows (kernels.bf16_layer: the Python between
    the products then cost more than they did); unchanged elsewhere."""
    from kernels import bf16_layer, bf16_linear  # here, not at the top: only a bfloat16 model on a CPU builds them

    if bf16_linear.install_into(model) == 0:
        if bf16_linear.why_not():
            log.info("bfloat16 Linear layers: torch's (%s)", bf16_linear.why_not())
    elif bf16_layer.install_into(model) == 0:
        if bf16_layer.why_not():
            log.info("bfloat16 layers: one module call per part (%s)", bf16_layer.why_not())
    else:
        log.info("bfloat16 layers: one C call each on AMX's tiles, up to %d rows a batch (torch's products above)",
                 bf16_linear.MOST_ROWS)
    return model


def rows_on_tiles(model: BertForPreTraining) -> int | None:
    """The most rows a batch of `model` may have to run each encoder layer as one C call on AMX's tiles
    (kernels.bf16_layer; `on_tiles` put them there), None where its layers do not run so."""
    from kernels import bf16_layer, bf16_linear

    if any(isinstance(layer, bf16_layer.BFloat16FusedLayer) for layer in model.bert.encoder.layer):
        return bf16_linear.MOST_ROWS
    return None
