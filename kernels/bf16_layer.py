"""Whole bfloat16 encoder layers in one C call on CPUs with AMX-BF16 (`kernels/c/bf16_layer_amx.c`): the four
products and attention on AMX's tiles, the residual sums, LayerNorms and GELU between, one team of threads.

At one query's rows, once the products ran on the tiles (kernels.bf16_linear), the Python around a bfloat16 layer
(module calls, allocations, a dozen torch ops a layer, each on one thread at those sizes) cost more than its
arithmetic, as it did for int8 before `kernels.int8_layer`. `BFloat16FusedLayer` takes the place of a `BertLayer`
whose products the tiles take (`fusable`), keeps its parts (their parameters keep their names), and runs the whole
layer as one call where it can: packed bfloat16 input of up to `bf16_linear.MOST_ROWS` rows on a CPU, no rows
selected (`keep`, for the heads' last layer), each sequence attending to all of itself, no gradients asked for.
Elsewhere the parts run as before: in bulk, torch's products are level with the tiles' or faster.

The C layer rounds where the modules round (each product's output, the residual sum, LayerNorm's and GELU's
outputs, to bfloat16), with the same tile products as `bf16_linear.TiledLinear`; its LayerNorm and GELU sum and
approximate in their own ways, so the two differ in last bits. A sequence gets the same bits alone or in any batch,
on any number of threads. Before first use it is held to the modules on a small random layer; `kernel()` is None
where it cannot run, and `why_not()` says why.
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from kernels import bf16_linear
from kernels.layer_call import LayerCall
from kernels.loading import FirstUse, KernelUnavailable, ask_for_amx
from model.bert import BertLayer
from model.config import BertConfig
from model.fuse import fuse_attention_projections
from model.packing import Packing

SOURCE_NAME = "bf16_layer_amx.c"


class _Dense(ctypes.Structure):
    _fields_ = [("blocked", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("in_features", ctypes.c_int64),
                ("out_features", ctypes.c_int64)]


class _Layer(ctypes.Structure):
    _fields_ = [("qkv", _Dense), ("attention_output", _Dense), ("expand", _Dense), ("contract", _Dense),
                ("norm1_weight", ctypes.c_void_p), ("norm1_bias", ctypes.c_void_p), ("norm2_weight", ctypes.c_void_p),
                ("norm2_bias", ctypes.c_void_p), ("norm1_eps", ctypes.c_double), ("norm2_eps", ctypes.c_double),
                ("heads", ctypes.c_int64), ("head_dim", ctypes.c_int64)]


def denses(layer: BertLayer) -> tuple[nn.Linear, nn.Linear, nn.Linear, nn.Linear]:
    """A layer's four products: query | key | value, attention output, feed-forward in and out."""
    return (layer.attention.self.fused_qkv, layer.attention.output.dense, layer.intermediate.dense,
            layer.output.dense)


def fusable(layer: BertLayer, config: BertConfig) -> bool:
    """Whether the C layer computes `layer`: fused query | key | value, its products on the tiles already
    (`bf16_linear.TiledLinear`, with biases: the C layer reads their laid-out weights), exact GELU."""
    return config.hidden_act == "gelu" and all(
        isinstance(dense, bf16_linear.TiledLinear) and dense.bias is not None for dense in denses(layer))


class LayerWeights:
    """What the C layer reads, from the layer's parameters (its TiledLinears' laid-out weights and float32 biases, one
    copy shared with their own calls; float32 LayerNorm parameters), and whether the parameters it came from are as
    they were (`current`: asked at every call, so it checks the parameters it holds rather than walk the modules)."""

    def __init__(self, layer: BertLayer):
        self._parameters = list(layer.parameters())  # a cast or a load changes these tensors' data, not the objects
        self._identity = bf16_linear.written(self._parameters)
        self._keep = []  # the tensors the struct points into

        def floats(tensor: torch.Tensor) -> int:
            kept = tensor.detach().float().contiguous()
            self._keep.append(kept)
            return kept.data_ptr()

        def dense(linear: bf16_linear.TiledLinear) -> _Dense:
            blocked, bias = linear.laid_out()
            self._keep += (blocked, bias)
            return _Dense(blocked.data_ptr(), bias.data_ptr(), linear.in_features, linear.out_features)

        first, second = layer.attention.output.LayerNorm, layer.output.LayerNorm
        attention = layer.attention.self
        self.hidden = attention.num_heads * attention.head_dim
        self.struct = _Layer(*(dense(linear) for linear in denses(layer)), floats(first.weight), floats(first.bias),
                             floats(second.weight), floats(second.bias), first.eps, second.eps, attention.num_heads,
                             attention.head_dim)

    def current(self) -> bool:
        return bf16_linear.written(self._parameters) == self._identity


class Kernel:
    """The loaded library. It reads the weights in bf16_products_amx.c's layout, which it is built over: the layout
    `bf16_linear.TiledLinear.laid_out` writes."""

    def __init__(self, library: ctypes.CDLL):
        ask_for_amx(library)
        self._call = LayerCall(library, "bf16_layer")

    def run(self, weights: LayerWeights, x: torch.Tensor, packing: Packing, threads: int | None = None) -> torch.Tensor:
        """The layer applied to packed bfloat16 rows x (N, hidden), laid out as `packing` says, on `threads` threads
        (torch's count unless given)."""
        tokens = packing.tokens + packing.spare_rows
        if x.dtype != torch.bfloat16 or x.shape != (tokens, weights.hidden):
            raise ValueError(f"the bfloat16 layer takes packed bfloat16 ({tokens}, {weights.hidden}) rows, one per "
                             f"token of the packing, not {tuple(x.shape)} {x.dtype}")
        return self._call(weights.struct, x.contiguous(), packing, threads)


class BFloat16FusedLayer(BertLayer):
    """A BertLayer (see the module's text) that runs as one C call where it can; its weights are laid out for the
    call at its first one, and again whenever a parameter changes (a cast, a copy, a load)."""

    def __init__(self, layer: BertLayer, fused: Kernel):
        nn.Module.__init__(self)
        self.attention, self.intermediate, self.output = layer.attention, layer.intermediate, layer.output
        self._fused, self._weights = fused, None

    def __getstate__(self):
        """A copy (copy.deepcopy) lays out its own weights; the library's handles are not copied."""
        state = super().__getstate__()
        return {name: value for name, value in state.items() if name not in ("_fused", "_weights")}

    def __setstate__(self, state):
        super().__setstate__(state)
        self._fused, self._weights = kernel(), None

    def forward(self, x: torch.Tensor, attn_mask, keep: torch.Tensor | None = None) -> torch.Tensor:
        # A packing whose rows are not its sequences' and spare rows (a CUDA graph's static layout) runs the modules.
        if self._fused is not None and keep is None and isinstance(attn_mask, Packing) and \
                attn_mask.key_lengths is None and x.shape[0] == attn_mask.tokens + attn_mask.spare_rows > 0 and \
                x.dtype == torch.bfloat16 and x.device.type == "cpu" and \
                x.shape[0] <= bf16_linear.MOST_ROWS and not (torch.is_grad_enabled() and x.requires_grad) and \
                not (torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())):
            if self._weights is None or not self._weights.current():
                self._weights = LayerWeights(self)
            return self._fused.run(self._weights, x, attn_mask)
        return super().forward(x, attn_mask, keep)


def random_layer(config: BertConfig, generator: torch.Generator) -> BertLayer:
    """A bfloat16 BertLayer of `config` with random parameters drawn from `generator` (the global RNG untouched), its
    query, key and value fused, its Linears on the tiles (as `install_into` finds a served layer)."""
    with torch.device("meta"):
        layer = BertLayer(config)
    layer = layer.to_empty(device="cpu").eval()
    with torch.no_grad():
        for name, parameter in layer.named_parameters():
            # LayerNorms near ones and zeros, but not exactly: a mixed-up wiring would not show
            centre = 1.0 if name.endswith("LayerNorm.weight") else 0.0
            spread = 0.1 if "LayerNorm" in name or name.endswith("bias") else config.hidden_size ** -0.5
            parameter.copy_(centre + spread * torch.randn(parameter.shape, generator=generator))
    holder = nn.Module()
    holder.layer = layer
    with torch.random.fork_rng(devices=[]):  # the fused Linear's own initialisation draws (then overwritten)
        fuse_attention_projections(holder)
    tiles = bf16_linear.kernel()
    if tiles is None:
        raise KernelUnavailable(f"the bfloat16 layer needs the bfloat16 tile products: {bf16_linear.why_not()}")
    bf16_linear.tile_linears(layer, tiles)
    return layer.bfloat16()


def _check(candidate: Kernel) -> None:
    """The C layer against the layer's own modules (their products on the tiles, as served), on a small random layer
    (2 heads of 32; five sequences of 1-130 tokens and four spare rows), on one thread and on three: within a few
    bfloat16 steps of the outputs (a wrong wiring is off by the outputs' own size), and the same bits on both thread
    counts."""
    generator = torch.Generator().manual_seed(0)
    config = BertConfig(vocab_size=64, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=160)
    packing = Packing.from_lengths([40, 1, 130, 5, 60], spare_rows=4)
    x = (torch.randn(packing.tokens + packing.spare_rows, config.hidden_size, generator=generator) * 2).bfloat16()
    layer = random_layer(config, generator)
    with torch.no_grad():
        expected = layer(x, packing).float()
        weights = LayerWeights(layer)
        one, three = (candidate.run(weights, x, packing, threads) for threads in (1, 3))
    if not torch.equal(one, three):
        raise KernelUnavailable("the bfloat16 layer's bits depend on its thread count")
    difference = (one.float() - expected).abs()
    if not bool((difference <= 2 ** -5 * expected.abs() + 2 ** -5).all()):
        raise KernelUnavailable(f"the bfloat16 layer differs from its modules by {float(difference.max()):.3g}")


kernel = FirstUse(SOURCE_NAME, Kernel, _check, "bfloat16 layers: one module call per part")
why_not = kernel.why_not


def install_into(model: nn.Module) -> int:
    """Make every layer of `model`'s encoder that the C layer computes a `BFloat16FusedLayer`, where it runs here
    (none elsewhere); returns how many."""
    fused = kernel()
    if fused is None:
        return 0
    layers = model.bert.encoder.layer
    swapped = 0
    for index, layer in enumerate(layers):
        if type(layer) is BertLayer and fusable(layer, model.config):
            layers[index] = BFloat16FusedLayer(layer, fused)
            swapped += 1
    return swapped
