"""int8 Linear layers, and the sublayers around them, as torch modules: the int8 encoder's path wherever the C layer
(kernels.int8_layer) does not take a batch, and the parts that layer is made from.

Each module runs kernels.int8_rows' row-wise steps (numba's kernels or the reference formulas: the same bits) and
its products in a C kernel (kernels.int8_products: VNNI or AVX2) where the CPU has one, else `torch._int_mm` (the
same integers). int8 runs on a CPU only: moving these modules to another device is refused, and a cast of the model
(bfloat16 around the int8 layers) leaves their int8 constants exact and re-derives what they read from its
parameters.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from kernels import int8_products, int8_reference, int8_rows
from kernels.int8_rows import MIN_ROWS, QuantizedRows
from model.bert import BertIntermediate, BertLayer, BertOutput, BertSelfOutput


def refuse_device_moves(fn: Callable[[torch.Tensor], torch.Tensor], module: nn.Module) -> None:
    """Raise, before anything moves, when `fn` (what Module._apply applies: `.to()`, `.cuda()`, `.type()`, ...)
    would take a tensor off the CPU or turn int8 weights into another type: int8 modules compute on a CPU only, from
    constants no device move reaches."""
    probe = fn(torch.empty(0, dtype=torch.int8))
    if probe.device.type != "cpu":
        raise ValueError(f"{type(module).__name__} computes on a CPU only (int8 runs there); it cannot move to "
                         f"{probe.device}: quantize the float model on the device it will run on")
    if probe.dtype != torch.int8:
        raise ValueError(f"{type(module).__name__} keeps int8 weights; it cannot turn them into {probe.dtype}")


class Int8Linear(nn.Module):
    """y = x W^T + b with W int8 (one scale per output channel) and x quantized per row to int8 on the fly;
    the product runs in integers (int32 accumulation). With `smoothing` s, computes (x / s)(W s)^T: the same
    function, easier to quantize. x may be float32 or bfloat16; y has x's type, quantization and dequantization run
    in float32 (kernels/int8_reference.py has the formulas). x may also arrive already quantized (`QuantizedRows`,
    from `Int8GeluIntermediate`).

    The float constants (scales, bias) are plain attributes, not buffers, so that casting the model to
    bfloat16 for the layers around this one leaves them exact. `blocked` is the weights in the products kernel's
    layout, where one runs (None elsewhere).

    `input_bits` 12 quantizes the input to 12 bits (held in int16) instead of 8, the weights staying int8: each
    product then runs as two int8 products, of the value's high and low parts (`int8_products.twelve_bit_products`),
    at twice the cost and exactly; the AVX2 kernel, whose products are 16-bit ones, takes them in one."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, smoothing: torch.Tensor | None = None,
                 input_bits: int = 8):
        super().__init__()
        int8_reference.steps(input_bits)  # refuses what it is not
        if input_bits == 12 and weight.shape[1] > int8_products.TWELVE_BIT_MAX_INPUTS:
            raise ValueError(f"12-bit inputs take at most {int8_products.TWELVE_BIT_MAX_INPUTS} features (their "
                             f"products must fit an int32), not {weight.shape[1]}")
        self.input_bits = input_bits
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
        self._derive()
        self.blocked = self.products_kernel.block(self.weight_t) if self.products_kernel is not None else None

    def _derive(self) -> None:
        """What this layer reads besides its constants: numpy views of them, for numba's kernels (one conversion
        fewer per call; same memory), and the products kernel where one runs here."""
        self.weight_scale_array, self.bias_array = self.weight_scale.numpy(), self.bias.numpy()
        self.input_scale_array = self.input_scale.numpy()
        self.products_kernel = int8_products.kernel_for(self.in_features)

    def __getstate__(self):
        return {name: value for name, value in super().__getstate__().items() if name != "products_kernel"}

    def __setstate__(self, state):
        """A copy (copy.deepcopy) reads its own constants, and the loaded kernel of this process."""
        super().__setstate__(state)
        self._derive()
        if self.products_kernel is None:
            self.blocked = None

    @classmethod
    def from_linear(cls, linear: nn.Linear, smoothing: torch.Tensor | None = None, input_bits: int = 8) -> Int8Linear:
        return cls(linear.weight, linear.bias, smoothing, input_bits)

    @classmethod
    def fused(cls, linears: list[nn.Linear], smoothing: torch.Tensor | None = None) -> Int8Linear:
        """One layer computing the concatenation of `linears`' outputs (which share their input), so that
        input is quantized once."""
        biases = [lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.out_features) for lin in linears]
        return cls(torch.cat([lin.weight for lin in linears]), torch.cat(biases), smoothing)

    def constants(self) -> int8_reference.Dense:
        """What this layer computes with, as the reference formulas and the C layer take it."""
        return int8_reference.Dense(self.weight_t, self.weight_scale, self.bias, self.input_scale, self.input_bits)

    def forward(self, x: torch.Tensor | QuantizedRows) -> torch.Tensor:
        return self.from_quantized(x if isinstance(x, QuantizedRows) else self.quantize_input(x))

    def quantize_input(self, x: torch.Tensor) -> QuantizedRows:
        """x (..., in) -> its rows smoothed and quantized, as this layer's product wants them."""
        return int8_rows.quantize_rows(x, self.input_scale_array, self.input_bits)

    def products(self, x: QuantizedRows) -> torch.Tensor:
        """The int32 products of quantized rows and the int8 weights: (rows, out) from the products kernel where one
        runs, else `_int_mm`'s, whose input is padded with zero rows as it wants; 12-bit rows as two such products
        (in one where the kernel takes 16-bit rows)."""
        values = x.values[:x.rows] if self.blocked is not None else x.values
        if values.dtype != torch.int8 and not (self.blocked is not None and self.products_kernel.takes_16_bits):
            return int8_products.twelve_bit_products(values, self._int8_products)
        return self._int8_products(values)

    def _int8_products(self, values: torch.Tensor) -> torch.Tensor:
        if self.blocked is not None:
            return self.products_kernel.matmul(values, self.blocked)
        if values.shape[0] < MIN_ROWS:
            values = torch.cat([values, values.new_zeros(MIN_ROWS - values.shape[0], values.shape[1])])
        return torch._int_mm(values, self.weight_t)

    def from_quantized(self, x: QuantizedRows) -> torch.Tensor:
        """The layer's output for an already quantized input."""
        out = int8_rows.dequantize(self.products(x), x, self.weight_scale_array, self.bias_array)
        return out.to(x.dtype).reshape(*x.shape, self.out_features)

    def _apply(self, fn, recurse=True):
        refuse_device_moves(fn, self)
        return super()._apply(fn, recurse)

    def extra_repr(self) -> str:
        smooth = ", smoothed" if self.smoothed else ""
        inputs = "int8" if self.input_bits == 8 else f"{self.input_bits}-bit"
        return (f"in_features={self.in_features}, out_features={self.out_features}, {inputs} per token x int8 per "
                f"channel{smooth}")


class Int8GeluIntermediate(nn.Module):
    """BertIntermediate (dense + exact GELU) of an int8 feed-forward whose output layer is int8 too: the
    dense layer's dequantization, GELU and the quantization of the result for the output layer run as one
    fused step, and what goes on is `QuantizedRows`, never the float (tokens x intermediate) activation. Only the
    output layer reads it (BertOutput or Int8ResidualNorm), which accepts it as it is."""

    def __init__(self, dense: Int8Linear, reader: Int8Linear):
        super().__init__()
        self.dense = dense
        self.reader_input_scale = reader.input_scale  # a plain attribute: stays float32 (see Int8Linear)
        self.reader_input_scale_array = self.reader_input_scale.numpy()
        self.reader_input_bits = reader.input_bits

    def __setstate__(self, state):
        super().__setstate__(state)
        self.reader_input_scale_array = self.reader_input_scale.numpy()  # a view of the copy's own scale

    def forward(self, x: torch.Tensor) -> QuantizedRows:
        dense = self.dense
        rows = dense.quantize_input(x)
        return int8_rows.dequantize_gelu_quantize(dense.products(rows), rows, dense.weight_scale_array,
                                                  dense.bias_array, self.reader_input_scale_array,
                                                  self.reader_input_bits)


class Int8ResidualNorm(nn.Module):
    """BertSelfOutput or BertOutput (dense, dropout, residual add, LayerNorm) over an int8 dense layer, at inference:
    the product's dequantization, the residual add and the LayerNorm run as one fused step. Keeps the replaced
    module's `dense` and `LayerNorm`, so its parameters keep their names; dropout is left out (int8 layers are
    inference-only)."""

    def __init__(self, dense: Int8Linear, norm: nn.LayerNorm):
        super().__init__()
        self.dense = dense
        self.LayerNorm = norm
        self.norm_arrays = self._norm_arrays()

    def _norm_arrays(self) -> tuple:
        """The LayerNorm's weights as float32 numpy (views of the parameters where they are float32 already)."""
        norm = self.LayerNorm
        return norm.weight.detach().float().numpy(), norm.bias.detach().float().numpy(), norm.eps

    def _apply(self, fn, recurse=True):
        refuse_device_moves(fn, self)
        module = super()._apply(fn, recurse)
        self.norm_arrays = self._norm_arrays()  # a cast gave the LayerNorm new tensors: read those
        return module

    def __setstate__(self, state):
        super().__setstate__(state)
        self.norm_arrays = self._norm_arrays()  # views of the copy's own parameters

    def forward(self, x: torch.Tensor | QuantizedRows, residual: torch.Tensor) -> torch.Tensor:
        dense = self.dense
        rows = x if isinstance(x, QuantizedRows) else dense.quantize_input(x)
        return int8_rows.dequantize_residual_norm(dense.products(rows), rows, dense.weight_scale_array,
                                                  dense.bias_array, residual, *self.norm_arrays)


def fuse_int8_steps(layer: BertLayer, exact_gelu: bool) -> None:
    """In place, where `layer`'s Linears are Int8Linear: its feed-forward's GELU (when `exact_gelu`, the model's
    activation) joins the quantization for the next product (`Int8GeluIntermediate`), and each sublayer's residual
    add and LayerNorm join their product's dequantization (`Int8ResidualNorm`)."""
    dense, reader = layer.intermediate.dense, layer.output.dense
    if exact_gelu and isinstance(layer.intermediate, BertIntermediate) and isinstance(dense, Int8Linear) and \
            isinstance(reader, Int8Linear):
        layer.intermediate = Int8GeluIntermediate(dense, reader)
    for parent, sublayer in ((layer.attention, "output"), (layer, "output")):
        module = getattr(parent, sublayer)
        if isinstance(module, (BertSelfOutput, BertOutput)) and isinstance(module.dense, Int8Linear) and \
                module.LayerNorm.elementwise_affine and module.LayerNorm.bias is not None:
            setattr(parent, sublayer, Int8ResidualNorm(module.dense, module.LayerNorm))
