"""Whole int8 encoder layers in one C call (`model/int8_layer.c`) on CPUs with AVX512-VNNI and AVX-512.

At one sentence a batch, the Python around an int8 layer (module calls, allocations, twelve kernel calls a layer)
costs about as much as the layer's arithmetic, and runs on one thread. `Int8FusedLayer` takes the place of a
`BertLayer` whose parts `model.quantize` made int8 (fused query | key | value, `Int8ResidualNorm` after attention
and after the feed-forward, `Int8GeluIntermediate` between: `quantize.fusable_into_one_call`), keeps those parts
(their parameters keep their names), and runs the whole layer as one call where it can: packed float32 input, no
rows selected (`keep`, for the heads' last layer), no gradients asked for. Elsewhere the parts run as before. Faster
than the parts at every length measured, most at few rows (all-MiniLM-L6-v2's layer, BENCHMARKS.md: 0.70x their time
for one 34-token sentence on one thread, 0.52x on two; 0.97x and 0.90x for one of 512 tokens), so a sequence gets
the same bits alone or in any batch.

The C layer computes what those parts compute, in the same formulas, on torch's thread count (OpenMP, torch's own
pool). Before first use it is checked against the parts on a small random layer; `kernel()` is None where it cannot
run, and `why_not()` says why.
"""

from __future__ import annotations

import ctypes

import torch

from model import int8_vnni, native
from model.bert import BertLayer
from model.packing import Packing

SOURCE_NAME = "int8_layer.c"


class _Dense(ctypes.Structure):
    _fields_ = [("packed", ctypes.c_void_p), ("correction", ctypes.c_void_p), ("input_scale", ctypes.c_void_p),
                ("weight_scale", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("in_features", ctypes.c_int64),
                ("out_features", ctypes.c_int64)]


class _Layer(ctypes.Structure):
    _fields_ = [("qkv", _Dense), ("attention_output", _Dense), ("expand", _Dense), ("contract", _Dense),
                ("norm1_weight", ctypes.c_void_p), ("norm1_bias", ctypes.c_void_p), ("norm2_weight", ctypes.c_void_p),
                ("norm2_bias", ctypes.c_void_p), ("norm1_eps", ctypes.c_double), ("norm2_eps", ctypes.c_double),
                ("heads", ctypes.c_int64), ("head_dim", ctypes.c_int64)]


class LayerWeights:
    """A layer's constants as the C layer reads them: pointers into tensors this object keeps alive."""

    def __init__(self, layer: BertLayer):
        attention = layer.attention.self
        qkv, attention_output = attention.fused_qkv, layer.attention.output.dense
        expand, contract = layer.intermediate.dense, layer.output.dense
        norms = (layer.attention.output.LayerNorm, layer.output.LayerNorm)
        norm_tensors = [t.detach().float().contiguous() for norm in norms for t in (norm.weight, norm.bias)]
        self.kept = list(norm_tensors)  # every tensor the struct points into
        dense = [self._dense(linear, self.kept) for linear in (qkv, attention_output, expand, contract)]
        self.struct = _Layer(*dense, *(t.data_ptr() for t in norm_tensors), norms[0].eps, norms[1].eps,
                             attention.num_heads, attention.head_dim)
        self.hidden = attention.num_heads * attention.head_dim

    @staticmethod
    def _dense(linear, kept: list[torch.Tensor]) -> _Dense:
        constants = [linear.input_scale.float().contiguous(), linear.weight_scale.float().contiguous(),
                     linear.bias.float().contiguous(), linear.packed.packed, linear.packed.correction]
        kept.extend(constants)
        input_scale, weight_scale, bias, packed, correction = constants
        return _Dense(packed.data_ptr(), correction.data_ptr(), input_scale.data_ptr(), weight_scale.data_ptr(),
                      bias.data_ptr(), linear.in_features, linear.out_features)


class Kernel:
    """The loaded library."""

    def __init__(self, library: ctypes.CDLL):
        pointer, size = ctypes.c_void_p, ctypes.c_int64
        self._workspace = library.int8_layer_workspace
        self._workspace.argtypes, self._workspace.restype = [pointer, size, size, size], size
        self._layer = library.int8_layer
        self._layer.argtypes = [pointer, pointer, size, pointer, pointer, size, size, pointer, pointer, size]
        self._layer.restype = None

    def run(self, weights: LayerWeights, x: torch.Tensor, packing: Packing) -> torch.Tensor:
        """The layer applied to packed float32 rows x (N, hidden), laid out as `packing` says."""
        tokens = packing.indices.shape[0]
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape != (tokens, weights.hidden):
            raise ValueError(f"the int8 layer takes packed float32 ({tokens}, {weights.hidden}) rows, one per token of "
                             f"the packing, not {tuple(x.shape)} {x.dtype}")
        x = x.contiguous()
        rows, threads, longest = x.shape[0], torch.get_num_threads(), packing.max_length
        struct = ctypes.byref(weights.struct)
        workspace = torch.empty(self._workspace(struct, rows, longest, threads), dtype=torch.uint8)
        out = torch.empty_like(x)
        self._layer(struct, x.data_ptr(), rows, packing.starts.data_ptr(), packing.lengths.data_ptr(),
                    len(packing.starts), longest, out.data_ptr(), workspace.data_ptr(), threads)
        return out


class Int8FusedLayer(BertLayer):
    """A BertLayer of int8 parts (see the module's text) that runs as one C call where it can."""

    def __init__(self, layer: BertLayer, kernel: Kernel):
        torch.nn.Module.__init__(self)
        self.attention, self.intermediate, self.output = layer.attention, layer.intermediate, layer.output
        self.kernel = kernel
        self.weights = LayerWeights(self)

    def forward(self, x: torch.Tensor, attn_mask, keep: torch.Tensor | None = None) -> torch.Tensor:
        # The C layer attends each sequence to all of itself: a packing that restricts keys runs the parts.
        if keep is None and isinstance(attn_mask, Packing) and attn_mask.key_lengths is None and \
                x.dtype == torch.float32 and x.device.type == "cpu" and not x.requires_grad:
            return self.kernel.run(self.weights, x, attn_mask)
        return super().forward(x, attn_mask, keep)


# Agreement with the layer's parts: outputs are LayerNorm'd (about unit scale); a value within rounding of a
# quantization step may take the neighbouring step in one of the two, which moves a few outputs by up to ~0.02.
CHECK_TOLERANCE = 0.05


def _check(candidate: Kernel) -> None:
    """The C layer against the modules, on a small random int8 layer (4 heads of 16, five sequences of 1-130 tokens), on
    one thread and on three."""
    from model.bert import BertConfig, BertForPreTraining
    from model.quantize import fusable_into_one_call, quantize

    torch.manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=160)
    model = BertForPreTraining(config).eval()
    with torch.no_grad():  # freshly made LayerNorms are all ones and zeros: a mixed-up wiring would not show
        for name, parameter in model.named_parameters():
            if "bias" in name or "LayerNorm" in name:
                parameter.add_(torch.randn_like(parameter) * 0.1)
    model = quantize(model, "per-token")
    layer = model.bert.encoder.layer[0]
    if int8_vnni.kernel() is None or not fusable_into_one_call(layer):
        raise native.NativeUnavailable(f"the int8 layer needs the VNNI kernel: {int8_vnni.why_not()}")
    fused = Int8FusedLayer(layer, candidate)
    packing = Packing.from_lengths([40, 1, 130, 5, 60])  # 236 rows: two chunks of the row-wise steps
    x = torch.randn(int(packing.lengths.sum()), config.hidden_size) * 2
    before = torch.get_num_threads()
    try:
        with torch.inference_mode():
            expected = layer(x, packing)
            for threads in (1, 3):
                torch.set_num_threads(threads)
                got = fused(x, packing)
                if not torch.allclose(got, expected, atol=CHECK_TOLERANCE, rtol=0):
                    raise native.NativeUnavailable(
                        f"the int8 layer differs from its modules by {float((got - expected).abs().max()):.3g} "
                        f"on {threads} thread(s)")
    finally:
        torch.set_num_threads(before)


# The kernel, built and checked at the first call (None where it cannot run); why_not() says why not.
kernel = native.FirstUse(SOURCE_NAME, Kernel, _check, "int8 layers: one module call per part")
why_not = kernel.why_not
