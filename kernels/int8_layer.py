"""Whole int8 encoder layers in one C call: `kernels/c/int8_layer.c` on CPUs with AVX512-VNNI and AVX-512,
`kernels/c/int8_layer_amx.c` (the same over the AMX products) on those with AMX too, `kernels/c/int8_layer_avx2.c`
(the same body over the AVX2 products and attention) on CPUs with AVX2 and FMA.

At one sentence a batch, the Python around an int8 layer (module calls, allocations, twelve kernel calls a layer)
costs about as much as the layer's arithmetic, and runs on one thread. `Int8FusedLayer` takes the place of a
`BertLayer` made of int8 parts (`fusable`: fused query | key | value, `Int8ResidualNorm` after attention and after
the feed-forward, `Int8GeluIntermediate` between), keeps those parts (their parameters keep their names), and runs
the whole layer as one call where it can: packed float32 input, no rows selected (`keep`, for the heads' last layer),
no gradients asked for. Elsewhere the parts run as before. Faster than the parts at every length measured, most at
few rows (BENCHMARKS.md, "One query at a time on a CPU"), and a sequence gets the same bits alone or in any batch.

The C layer computes kernels.int8_reference's formulas, bit for bit, with kernels.attention's attention, on torch's
thread count (OpenMP, torch's own pool). Each variant needs the products and attention kernels of its own instruction
set to be the ones this process runs (the layers' weights are in the products kernel's layout, and the modules'
attention must be the layer's). Before first use it is held to exactly that on a small random layer; `kernel()` is
None where neither variant can run, and `why_not()` says why.
"""

from __future__ import annotations

import ctypes

import torch

from kernels import attention, int8_products, int8_reference
from kernels.int8_modules import Int8GeluIntermediate, Int8Linear, Int8ResidualNorm, fuse_int8_steps, \
    refuse_device_moves
from kernels.layer_call import LayerCall
from kernels.loading import FirstOf, FirstUse, KernelUnavailable
from model.bert import BertLayer
from model.config import BertConfig
from model.packing import Packing

SOURCE_NAME = "int8_layer.c"
AVX2_SOURCE_NAME = "int8_layer_avx2.c"
AMX_SOURCE_NAME = "int8_layer_amx.c"


class _Dense(ctypes.Structure):
    _fields_ = [("blocked", ctypes.c_void_p), ("correction", ctypes.c_void_p), ("input_scale", ctypes.c_void_p),
                ("weight_scale", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("in_features", ctypes.c_int64),
                ("out_features", ctypes.c_int64), ("input_bits", ctypes.c_int64)]


class _Layer(ctypes.Structure):
    _fields_ = [("qkv", _Dense), ("attention_output", _Dense), ("expand", _Dense), ("contract", _Dense),
                ("norm1_weight", ctypes.c_void_p), ("norm1_bias", ctypes.c_void_p), ("norm2_weight", ctypes.c_void_p),
                ("norm2_bias", ctypes.c_void_p), ("norm1_eps", ctypes.c_double), ("norm2_eps", ctypes.c_double),
                ("heads", ctypes.c_int64), ("head_dim", ctypes.c_int64)]


def int8_denses(layer: BertLayer) -> tuple[Int8Linear, Int8Linear, Int8Linear, Int8Linear]:
    """A layer's four int8 products: query | key | value, attention output, feed-forward in and out."""
    return (layer.attention.self.fused_qkv, layer.attention.output.dense, layer.intermediate.dense,
            layer.output.dense)


def fusable(layer: BertLayer) -> bool:
    """Whether `layer`'s parts are the int8 ones the C layer computes, with weights in the products kernel's layout:
    int8 inputs throughout, but for the feed-forward output layer's, which may be 12-bit."""
    parts = (layer.attention.self.fused_qkv, layer.attention.output, layer.intermediate, layer.output)
    if not (isinstance(parts[0], Int8Linear) and isinstance(parts[1], Int8ResidualNorm)
            and isinstance(parts[2], Int8GeluIntermediate) and isinstance(parts[3], Int8ResidualNorm)):
        return False
    denses, attention_kernel = int8_denses(layer), attention.kernel()
    return all(dense.blocked is not None for dense in denses) and \
        all(dense.input_bits == 8 for dense in denses[:3]) and \
        attention_kernel is not None and attention_kernel.fits(layer.attention.self.head_dim)


def layer_constants(layer: BertLayer) -> int8_reference.Layer:
    """What a `fusable` layer computes with, as the reference formulas take it."""
    norms = [int8_reference.Norm(norm.weight.detach().float().contiguous(), norm.bias.detach().float().contiguous(),
                                 norm.eps) for norm in (layer.attention.output.LayerNorm, layer.output.LayerNorm)]
    self_attention = layer.attention.self
    return int8_reference.Layer(*(dense.constants() for dense in int8_denses(layer)), *norms,
                                heads=self_attention.num_heads, head_dim=self_attention.head_dim)


class LayerWeights:
    """A fusable layer's constants as the C layer reads them: pointers into tensors this object keeps alive."""

    def __init__(self, layer: BertLayer):
        constants = layer_constants(layer)
        self.kept: list[torch.Tensor] = []  # every tensor the struct points into
        parts = (constants.qkv, constants.attention_output, constants.expand, constants.contract)
        dense = [self._dense(part, linear.blocked) for part, linear in zip(parts, int8_denses(layer))]
        norms = [self._pointer(t) for norm in (constants.norm1, constants.norm2) for t in (norm.weight, norm.bias)]
        self.struct = _Layer(*dense, *norms, constants.norm1.eps, constants.norm2.eps, constants.heads,
                             constants.head_dim)
        self.hidden = constants.heads * constants.head_dim

    def _pointer(self, tensor: torch.Tensor) -> int:
        if not tensor.is_contiguous() or tensor.device.type != "cpu":
            raise ValueError("the C layer reads contiguous tensors on the CPU")
        self.kept.append(tensor)
        return tensor.data_ptr()

    def _dense(self, constants: int8_reference.Dense, blocked: int8_products.BlockedWeights) -> _Dense:
        return _Dense(self._pointer(blocked.blocked), self._pointer(blocked.correction),
                      self._pointer(constants.input_scale), self._pointer(constants.weight_scale),
                      self._pointer(constants.bias), constants.in_features, constants.out_features,
                      constants.input_bits)


class Kernel:
    """The loaded VNNI library."""

    products = "VNNI"  # the instruction sets of the products and attention kernels it is built over
    attention = "AVX-512"
    layout = "VNNI"  # the blocked weights' layout it reads: the products kernel of this process must write it

    def __init__(self, library: ctypes.CDLL):
        self._call = LayerCall(library, "int8_layer")

    def run(self, weights: LayerWeights, x: torch.Tensor, packing: Packing, threads: int | None = None) -> torch.Tensor:
        """The layer applied to packed float32 rows x (N, hidden), laid out as `packing` says, on `threads` threads
        (torch's count unless given)."""
        tokens = packing.indices.shape[0]
        if x.dtype != torch.float32 or x.dim() != 2 or x.shape != (tokens, weights.hidden):
            raise ValueError(f"the int8 layer takes packed float32 ({tokens}, {weights.hidden}) rows, one per token of "
                             f"the packing, not {tuple(x.shape)} {x.dtype}")
        return self._call(weights.struct, x.contiguous(), packing, threads)


class AmxKernel(Kernel):
    """The loaded AMX library: the same calls, once Linux lets the process use AMX's tiles."""

    products = "AMX"

    def __init__(self, library: ctypes.CDLL):
        int8_products.AmxKernel(library)  # asks Linux for the tiles, as the products kernel does, or refuses
        super().__init__(library)


class Avx2Kernel(Kernel):
    """The loaded AVX2 library: the same calls."""

    products = "AVX2"
    attention = "AVX2"
    layout = "AVX2"


class Int8FusedLayer(BertLayer):
    """A BertLayer of int8 parts (see the module's text) that runs as one C call where it can. The C layer reads
    the parts' constants through pointers: a cast or a copy of the model re-derives them, and a move off the CPU is
    refused."""

    def __init__(self, layer: BertLayer, kernel: Kernel):
        torch.nn.Module.__init__(self)
        self.attention, self.intermediate, self.output = layer.attention, layer.intermediate, layer.output
        self.kernel = kernel
        self.weights = LayerWeights(self)

    def _apply(self, fn, recurse=True):
        refuse_device_moves(fn, self)
        module = super()._apply(fn, recurse)
        self.weights = LayerWeights(self)  # the LayerNorms may hold new tensors now
        return module

    def __getstate__(self):
        state = super().__getstate__()
        return {name: value for name, value in state.items() if name not in ("kernel", "weights")}

    def __setstate__(self, state):
        """A copy (copy.deepcopy) points the C layer at its own parts' tensors, never at the original's."""
        super().__setstate__(state)
        self.kernel = kernel()
        self.weights = LayerWeights(self)

    def forward(self, x: torch.Tensor, attn_mask, keep: torch.Tensor | None = None) -> torch.Tensor:
        # The C layer attends each sequence to all of itself: a packing that restricts keys runs the parts.
        if keep is None and isinstance(attn_mask, Packing) and attn_mask.key_lengths is None and \
                x.dtype == torch.float32 and x.device.type == "cpu" and not x.requires_grad and self.kernel is not None:
            return self.kernel.run(self.weights, x, attn_mask)
        return super().forward(x, attn_mask, keep)


def random_int8_layer(config: BertConfig, generator: torch.Generator, contract_input_bits: int = 8) -> BertLayer:
    """A BertLayer of `config` with random parameters drawn from `generator` (the global RNG untouched), made of the
    int8 parts the C layer computes; its feed-forward output layer's input quantized to `contract_input_bits`."""
    with torch.device("meta"):  # built without drawing from torch's global generator
        layer = BertLayer(config)
    layer = layer.to_empty(device="cpu").eval()
    with torch.no_grad():
        for name, parameter in layer.named_parameters():
            # LayerNorms near ones and zeros, but not exactly: a mixed-up wiring would not show
            centre = 1.0 if name.endswith("LayerNorm.weight") else 0.0
            spread = 0.1 if "LayerNorm" in name or name.endswith("bias") else 0.05
            parameter.copy_(centre + spread * torch.randn(parameter.shape, generator=generator))
    self_attention = layer.attention.self
    self_attention.fused_qkv = Int8Linear.fused([self_attention.query, self_attention.key, self_attention.value])
    self_attention.query = self_attention.key = self_attention.value = None
    for parent, name in ((layer.attention.output, "dense"), (layer.intermediate, "dense")):
        setattr(parent, name, Int8Linear.from_linear(getattr(parent, name)))
    layer.output.dense = Int8Linear.from_linear(layer.output.dense, input_bits=contract_input_bits)
    fuse_int8_steps(layer, exact_gelu=config.hidden_act == "gelu")
    return layer


def _check(candidate: Kernel) -> None:
    """The C layer against the reference formulas with the attention kernel's attention, on small random int8
    layers (4 heads of 16; five sequences of 1-130 tokens, 236 rows: two chunks of the row-wise steps; the
    feed-forward output layer's input 8-bit and 12-bit), on one thread and on three: equal bit for bit."""
    attention_kernel = attention.kernel()
    products = int8_products.kernel()
    if products is None or products.layout != candidate.layout:
        raise KernelUnavailable(f"the int8 layer needs a products kernel of the {candidate.layout} layout: "
                                f"{int8_products.why_not() or f'the one here is the {products.instruction_set} one'}")
    if attention_kernel is None or attention_kernel.instruction_set != candidate.attention:
        found = attention.why_not() or f"the one here is the {attention_kernel.instruction_set} one"
        raise KernelUnavailable(f"the int8 layer needs the {candidate.attention} attention kernel: {found}")
    generator = torch.Generator().manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=160)
    packing = Packing.from_lengths([40, 1, 130, 5, 60])
    x = torch.randn(int(packing.lengths.sum()), config.hidden_size, generator=generator) * 2
    for bits in int8_reference.INPUT_BITS:
        layer = random_int8_layer(config, generator, contract_input_bits=bits)
        if not fusable(layer):
            raise KernelUnavailable("the int8 layer's parts are not the ones it computes")
        expected = int8_reference.layer_forward(layer_constants(layer), x, packing.spans, attention_kernel.attend_spans)
        weights = LayerWeights(layer)
        for threads in (1, 3):
            got = candidate.run(weights, x, packing, threads)
            if not torch.equal(got, expected):
                raise KernelUnavailable(f"the int8 layer ({bits}-bit feed-forward output inputs) differs from the "
                                        f"reference formulas by {float((got - expected).abs().max()):.3g} on "
                                        f"{threads} thread(s)")


# Each variant, built and checked at its first call (None where it cannot run), and the one the layers use: AMX's
# where it runs, else VNNI's, else AVX2's (None where none can run; why_not() says why not).
amx_kernel = FirstUse(AMX_SOURCE_NAME, AmxKernel, _check,
                      "int8 layers: the VNNI or AVX2 C layer or one module call per part")
vnni_kernel = FirstUse(SOURCE_NAME, Kernel, _check, "int8 layers: the AVX2 C layer or one module call per part")
avx2_kernel = FirstUse(AVX2_SOURCE_NAME, Avx2Kernel, _check, "int8 layers: one module call per part")
kernel = FirstOf(amx_kernel, vnni_kernel, avx2_kernel)
why_not = kernel.why_not
