"""int8 inference for the encoder's Linear layers on CPU, in the variants measured in BENCHMARKS.md.

A BERT Linear layer's input is the output of a LayerNorm, of attention, or of GELU, and LayerNorm
outputs carry a few channels far larger than the rest. One int8 scale for a whole input tensor spends
its 255 steps on those channels and rounds every other channel to a handful of values; that, more
than weight rounding, is what moves int8 embeddings away from float32. Two remedies, combinable:

- per-token activation scales (`Int8Linear`): each row of the input gets its own scale (and the
  weights one per output channel), computed on the fly. A row's quantization then does not depend on
  what else is in the batch, so batched results equal single ones, as in float.
- SmoothQuant (Xiao et al. 2022, arXiv 2211.10438): divide each input channel by
  s_j = max|X_j|^a / max|W_j|^(1-a) and multiply the weight's column j by s_j. The product is
  unchanged, the activation's outlier channels shrink, and the weights absorb them (weights are
  quantized per output channel, so this costs them little). In LLMs the division folds into the
  preceding LayerNorm; in post-LayerNorm BERT that LayerNorm's output is also the residual stream, so
  the division happens in the Linear's input instead (one multiply, fused with quantizing it).
The max|X_j| statistics come from `calibrate` on a little real text.

`quantize(model, scheme, stats)` rewrites the model's encoder in place. The `torch-dynamic` schemes are
torch's own dynamic quantization (one activation scale per tensor per call, fbgemm kernels), kept as
the baselines they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from kernels import int8_layer
from kernels.int8_modules import Int8Linear, fuse_int8_steps
from model.bert import BertForPreTraining, BertSelfAttention

SCHEMES = ("torch-dynamic", "torch-dynamic-per-channel", "torch-dynamic-smooth", "per-token", "per-token-smooth")


class InputScale(nn.Module):
    """Multiplies its input by a fixed per-channel vector: SmoothQuant's division where no layer can absorb it."""

    def __init__(self, inverse_scale: torch.Tensor):
        super().__init__()
        self.register_buffer("inverse_scale", inverse_scale.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.inverse_scale


@torch.inference_mode()
def calibrate(model: BertForPreTraining, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """max |x_j| per input channel of every encoder Linear, over `batches` of (input_ids, token_type_ids),
    each (1, T) or padded-free (B, T). Keys are the Linear modules' names."""
    stats: dict[str, torch.Tensor] = {}
    hooks = []

    def record(name: str) -> Callable:
        def hook(_module, inputs, _output):
            x = inputs[0].detach().reshape(-1, inputs[0].shape[-1]).abs().amax(dim=0).float()
            stats[name] = torch.maximum(stats[name], x) if name in stats else x
        return hook

    for name, module in model.bert.encoder.named_modules():
        if isinstance(module, nn.Linear):
            hooks.append(module.register_forward_hook(record(name)))
    try:
        for input_ids, token_type_ids in batches:
            model.bert(input_ids, token_type_ids)
    finally:
        for hook in hooks:
            hook.remove()
    return stats


def smoothing(activation_max: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """SmoothQuant's per-input-channel s = max|X_j|^alpha / max|W_j|^(1 - alpha)."""
    weight_max = weight.detach().abs().amax(dim=0).float()
    return (activation_max.clamp(min=1e-5).pow(alpha) / weight_max.clamp(min=1e-5).pow(1 - alpha)).clamp(min=1e-5)


def is_feed_forward_output(name: str) -> bool:
    """Whether the encoder Linear called `name` is a feed-forward output layer (`layer.N.output.dense`, whose input
    is GELU's output, the intermediate size wide), not the attention's output layer."""
    return name.endswith("output.dense") and not name.endswith("attention.output.dense")


@torch.inference_mode()
def quantize(model: BertForPreTraining, scheme: str, stats: dict[str, torch.Tensor] | None = None,
             alpha: float = 0.5, keep: tuple[str, ...] = (), feed_forward_output_bits: int = 8,
             feed_forward_output_alpha: float | None = None) -> BertForPreTraining:
    """Replace the encoder's Linear layers by int8 ones, in place (the heads stay float). `keep`: name
    suffixes of Linears left in float (e.g. "output.dense"). Smoothing schemes need `stats`. The
    per-token schemes fuse each layer's query, key and value into one int8 product (one quantization of
    their shared input, one smoothing vector for the three weights), and, in an exact-GELU model, each
    feed-forward's GELU into its layers' quantization (`Int8GeluIntermediate`) and each
    sublayer's residual add and LayerNorm into its output's dequantization (`Int8ResidualNorm`); where
    kernels.int8_layer's C layer runs, each layer so made runs as one call (`Int8FusedLayer`).
    `feed_forward_output_bits` 12 (per-token schemes) quantizes each feed-forward output layer's input to 12 bits
    instead of 8: the largest part of int8's error in per-token vectors, at twice that layer's product cost; with
    inputs that fine, less smoothing (`feed_forward_output_alpha`, else `alpha`) leaves its weights easier to round."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown int8 scheme {scheme!r}; choose one of {SCHEMES}")
    smooth = scheme.endswith("smooth")
    if smooth and stats is None:
        raise ValueError(f"scheme {scheme} needs calibration statistics")
    if feed_forward_output_bits != 8 and not scheme.startswith("per-token"):
        raise ValueError(f"scheme {scheme} quantizes every input to int8; 12-bit inputs are the per-token schemes'")
    model = model.float().eval()

    def kept(name: str) -> bool:
        return any(name.endswith(k) for k in keep)

    if scheme.startswith("per-token"):
        for name, attention in model.bert.encoder.named_modules():
            if not isinstance(attention, BertSelfAttention) or attention.fused_qkv is not None:
                continue
            if any(kept(f"{name}.{part}") for part in ("query", "key", "value")):
                continue
            linears = [attention.query, attention.key, attention.value]
            s = smoothing(stats[f"{name}.query"], torch.cat([lin.weight for lin in linears]), alpha) if smooth else None
            attention.fused_qkv = Int8Linear.fused(linears, s)
            attention.query = attention.key = attention.value = None  # their float weights are not needed
    targets = [(name, module) for name, module in model.bert.encoder.named_modules()
               if isinstance(module, nn.Linear) and not kept(name)]
    for name, linear in targets:
        feed_forward_output = is_feed_forward_output(name)
        own_alpha = feed_forward_output_alpha if feed_forward_output and feed_forward_output_alpha is not None \
            else alpha
        s = smoothing(stats[name], linear.weight, own_alpha) if smooth else None
        if scheme.startswith("per-token"):
            bits = feed_forward_output_bits if feed_forward_output else 8
            replacement: nn.Module = Int8Linear.from_linear(linear, s, bits)
        else:
            replacement = _torch_dynamic(linear, per_channel=scheme != "torch-dynamic", smoothing=s)
        parent_name, _, attribute = name.rpartition(".")
        setattr(model.bert.encoder.get_submodule(parent_name), attribute, replacement)
    if scheme.startswith("per-token"):
        kernel = int8_layer.kernel()
        layers = model.bert.encoder.layer
        for index, layer in enumerate(layers):
            fuse_int8_steps(layer, exact_gelu=model.config.hidden_act == "gelu")
            if kernel is not None and int8_layer.fusable(layer):
                layers[index] = int8_layer.Int8FusedLayer(layer, kernel)
    return model


def _torch_dynamic(linear: nn.Linear, per_channel: bool, smoothing: torch.Tensor | None) -> nn.Module:
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
    from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig

    float_linear = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
    float_linear.weight.copy_(linear.weight * (1 if smoothing is None else smoothing[None, :]))
    if linear.bias is not None:
        float_linear.bias.copy_(linear.bias)
    float_linear.qconfig = per_channel_dynamic_qconfig if per_channel else default_dynamic_qconfig
    quantized = DynamicLinear.from_float(float_linear)
    return quantized if smoothing is None else nn.Sequential(InputScale(1.0 / smoothing), quantized)
