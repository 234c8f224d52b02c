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

from model import attention_kernel, int8_kernels, int8_layer, int8_vnni
from model.bert import BertForPreTraining, BertIntermediate, BertLayer, BertOutput, BertSelfAttention, \
    BertSelfOutput
from model.int8_kernels import QuantizedRows

SCHEMES = ("torch-dynamic", "torch-dynamic-per-channel", "torch-dynamic-smooth", "per-token", "per-token-smooth")


class Int8Linear(nn.Module):
    """y = x W^T + b with W int8 (one scale per output channel) and x quantized per row to int8 on the fly;
    the product runs in integers (`torch._int_mm`, int32 accumulation). With `smoothing` s, computes
    (x / s)(W s)^T: the same function, easier to quantize. x may be float32 or bfloat16; y has x's type,
    quantization and dequantization run in float32 (mixed-type elementwise ops take slow paths on CPU).

    The float constants (scales, bias) are plain attributes, not buffers, so that casting the model to
    bfloat16 for the layers around this one leaves them exact; int8 runs on CPU only, so no device move
    needs to reach them.

    With numba (`model.int8_kernels.AVAILABLE`) quantization and dequantization each run as one fused
    pass; x may then also arrive already quantized (`QuantizedRows`, from `Int8GeluIntermediate`). On CPUs with
    AVX512-VNNI the products run in `model.int8_vnni`'s kernel, whose products equal `_int_mm`'s."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, smoothing: torch.Tensor | None = None):
        super().__init__()
        weight = weight.detach().float()
        if smoothing is not None:
            weight = weight * smoothing[None, :]
        scale = weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0  # (out,)
        self.register_buffer("weight_t", torch.round(weight / scale[:, None]).to(torch.int8).t().contiguous())
        self.weight_scale = scale
        self.out_features, self.in_features = weight.shape
        # Neutral vectors where there is no bias or smoothing: the kernels take vectors, and a layer of
        # BERT's always has a bias (multiplying by ones costs what the float copy it replaces did).
        self.bias = torch.zeros(self.out_features) if bias is None else bias.detach().float().clone()
        self.input_scale = torch.ones(self.in_features) if smoothing is None else 1.0 / smoothing.float()
        self.smoothed = smoothing is not None
        # numpy views of the constants, for the fused kernels (one conversion fewer per call; same memory)
        self.weight_scale_array, self.bias_array = self.weight_scale.numpy(), self.bias.numpy()
        self.input_scale_array = self.input_scale.numpy()
        vnni = int8_vnni.kernel() if int8_kernels.AVAILABLE else None  # products() serves the fused path only
        self.vnni = vnni if vnni is not None and vnni.fits(self.in_features) else None
        self.packed = self.vnni.pack(self.weight_t) if self.vnni is not None else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, smoothing: torch.Tensor | None = None) -> Int8Linear:
        return cls(linear.weight, linear.bias, smoothing)

    @classmethod
    def fused(cls, linears: list[nn.Linear], smoothing: torch.Tensor | None = None) -> Int8Linear:
        """One layer computing the concatenation of `linears`' outputs (which share their input), so that
        input is quantized once."""
        biases = [lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.out_features) for lin in linears]
        return cls(torch.cat([lin.weight for lin in linears]), torch.cat(biases), smoothing)

    def forward(self, x: torch.Tensor | QuantizedRows) -> torch.Tensor:
        if isinstance(x, QuantizedRows):
            return self.from_quantized(x)
        if int8_kernels.AVAILABLE:
            return self.from_quantized(self.quantize_input(x))
        return self._forward_eager(x)

    def quantize_input(self, x: torch.Tensor) -> QuantizedRows:
        """x (..., in) -> its rows smoothed and quantized, as this layer's product wants them (fused kernel)."""
        return int8_kernels.quantize_rows(x, self.input_scale_array)

    def products(self, x: QuantizedRows) -> torch.Tensor:
        """The int32 products of quantized rows and the int8 weights: (rows, out) from the VNNI kernel where it
        runs, else `_int_mm`'s, whose rows are padded as it wants."""
        if self.vnni is not None:
            return self.vnni.matmul(x.values[:x.rows], self.packed)
        return torch._int_mm(x.values, self.weight_t)

    def from_quantized(self, x: QuantizedRows) -> torch.Tensor:
        """The layer's output for an already quantized input (fused kernels)."""
        out = int8_kernels.dequantize(self.products(x), x, self.weight_scale_array, self.bias_array)
        return out.to(x.dtype).reshape(*x.shape, self.out_features)

    def _forward_eager(self, x: torch.Tensor) -> torch.Tensor:
        """The same computation in PyTorch operators, where numba is not installed."""
        shape, dtype = x.shape, x.dtype
        x = x.reshape(-1, shape[-1])
        # A float32 copy of x (smoothed), quantized in place from here on.
        x = x * self.input_scale if dtype == torch.float32 else x.float().mul_(self.input_scale)
        # Each row's largest |x| from its max and min: two reading passes, where abs() would write a
        # whole copy first (0.09 vs 0.13 ms for 600 x 1536 on one core). A multiply by 127 / max is
        # cheaper than a divide by max / 127 (0.04 vs 0.10 ms).
        row_max = torch.maximum(x.amax(dim=1, keepdim=True), x.amin(dim=1, keepdim=True).neg_()).clamp_(min=1e-8)
        x_int8 = x.mul_(127.0 / row_max).round_().to(torch.int8)
        rows = x_int8.shape[0]
        if rows < int8_kernels.MIN_ROWS:  # zero rows cost nothing to drop
            x_int8 = torch.cat([x_int8, x_int8.new_zeros(int8_kernels.MIN_ROWS - rows, x_int8.shape[1])])
        # Dequantize in place: (rows, out) int32 -> float32, times both scales, plus the bias.
        out = torch._int_mm(x_int8, self.weight_t)[:rows].float().mul_(row_max / 127.0).mul_(self.weight_scale)
        return out.add_(self.bias).to(dtype).reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        smooth = ", smoothed" if self.smoothed else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per token x per channel{smooth}"


class Int8GeluIntermediate(nn.Module):
    """BertIntermediate (dense + exact GELU) of an int8 feed-forward whose output layer is int8 too: the
    dense layer's dequantization, GELU and the quantization of the result for the output layer run as one
    fused pass (`model.int8_kernels`), and what goes on is `QuantizedRows`, never the float (tokens x
    intermediate) activation. Only the output layer reads it (BertOutput), which accepts it as it is."""

    def __init__(self, dense: Int8Linear, reader: Int8Linear):
        super().__init__()
        self.dense = dense
        self.reader_input_scale = reader.input_scale  # a plain attribute: stays float32 (see Int8Linear)
        self.reader_input_scale_array = reader.input_scale_array

    def forward(self, x: torch.Tensor) -> QuantizedRows:
        dense = self.dense
        rows = dense.quantize_input(x)
        return int8_kernels.dequantize_gelu_quantize(dense.products(rows), rows, dense.weight_scale_array,
                                                     dense.bias_array, self.reader_input_scale_array)


class Int8ResidualNorm(nn.Module):
    """BertSelfOutput or BertOutput (dense, dropout, residual add, LayerNorm) over an int8 dense layer, at inference:
    the product's dequantization, the residual add and the LayerNorm run as one fused pass
    (`model.int8_kernels.dequantize_residual_norm`). Keeps the replaced module's `dense` and `LayerNorm`, so its
    parameters keep their names; dropout is left out (int8 layers are inference-only)."""

    def __init__(self, dense: Int8Linear, norm: nn.LayerNorm):
        super().__init__()
        self.dense = dense
        self.LayerNorm = norm
        # The LayerNorm's float32 weights as numpy, taken once (float32 already: views of the parameters, no copies).
        self.norm_arrays = (norm.weight.detach().float().numpy(), norm.bias.detach().float().numpy(), norm.eps)

    def forward(self, x: torch.Tensor | QuantizedRows, residual: torch.Tensor) -> torch.Tensor:
        dense = self.dense
        rows = x if isinstance(x, QuantizedRows) else dense.quantize_input(x)
        return int8_kernels.dequantize_residual_norm(dense.products(rows), rows, dense.weight_scale_array,
                                                     dense.bias_array, residual, *self.norm_arrays)


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


@torch.inference_mode()
def quantize(model: BertForPreTraining, scheme: str, stats: dict[str, torch.Tensor] | None = None,
             alpha: float = 0.5, keep: tuple[str, ...] = ()) -> BertForPreTraining:
    """Replace the encoder's Linear layers by int8 ones, in place (the heads stay float). `keep`: name
    suffixes of Linears left in float (e.g. "output.dense"). Smoothing schemes need `stats`. The
    per-token schemes fuse each layer's query, key and value into one int8 product (one quantization of
    their shared input, one smoothing vector for the three weights), and, with the fused kernels and an
    exact-GELU model, each feed-forward's GELU into its layers' quantization (`Int8GeluIntermediate`) and each
    sublayer's residual add and LayerNorm into its output's dequantization (`Int8ResidualNorm`); where
    `model.int8_layer`'s C layer runs, each layer so made runs as one call (`Int8FusedLayer`)."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown int8 scheme {scheme!r}; choose one of {SCHEMES}")
    smooth = scheme.endswith("smooth")
    if smooth and stats is None:
        raise ValueError(f"scheme {scheme} needs calibration statistics")
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
        s = smoothing(stats[name], linear.weight, alpha) if smooth else None
        if scheme.startswith("per-token"):
            replacement: nn.Module = Int8Linear.from_linear(linear, s)
        else:
            replacement = _torch_dynamic(linear, per_channel=scheme != "torch-dynamic", smoothing=s)
        parent_name, _, attribute = name.rpartition(".")
        setattr(model.bert.encoder.get_submodule(parent_name), attribute, replacement)
    if int8_kernels.AVAILABLE and model.config.hidden_act == "gelu":
        for layer in model.bert.encoder.layer:
            dense, reader = layer.intermediate.dense, layer.output.dense
            if isinstance(layer.intermediate, BertIntermediate) and isinstance(dense, Int8Linear) and \
                    isinstance(reader, Int8Linear):
                layer.intermediate = Int8GeluIntermediate(dense, reader)
    if int8_kernels.AVAILABLE and scheme.startswith("per-token"):
        for layer in model.bert.encoder.layer:
            for parent, sublayer in ((layer.attention, "output"), (layer, "output")):
                module = getattr(parent, sublayer)
                if isinstance(module, (BertSelfOutput, BertOutput)) and isinstance(module.dense, Int8Linear) and \
                        module.LayerNorm.elementwise_affine and module.LayerNorm.bias is not None:
                    setattr(parent, sublayer, Int8ResidualNorm(module.dense, module.LayerNorm))
        kernel = int8_layer.kernel()
        layers = model.bert.encoder.layer
        for index, layer in enumerate(layers):
            if kernel is not None and fusable_into_one_call(layer):
                layers[index] = int8_layer.Int8FusedLayer(layer, kernel)
    return model


def fusable_into_one_call(layer: BertLayer) -> bool:
    """Whether `layer`'s parts are the int8 ones `model.int8_layer`'s C layer computes, with packed VNNI weights."""
    attention = layer.attention.self
    parts = (attention.fused_qkv, layer.attention.output, layer.intermediate, layer.output)
    if not (isinstance(parts[0], Int8Linear) and isinstance(parts[1], Int8ResidualNorm)
            and isinstance(parts[2], Int8GeluIntermediate) and isinstance(parts[3], Int8ResidualNorm)):
        return False
    denses = (parts[0], parts[1].dense, parts[2].dense, parts[3].dense)
    return all(dense.packed is not None for dense in denses) and attention_kernel.Kernel.fits(attention.head_dim)


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
