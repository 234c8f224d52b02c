"""A bfloat16 network's encoder Linear layers on AMX's tiles (`kernels/c/bf16_products_amx.c`), where the CPU has
AMX-BF16: the weights laid out for the tiles once, where torch's bfloat16 Linear (oneDNN) lays them out at every
call, which made a bfloat16 query on such a CPU several times slower than an int8 one.

Built and loaded at first use (`kernels.loading`) and checked against float32 products of the same bfloat16 numbers
(each output within its rounding to bfloat16). `kernel()` is None where it cannot run (`why_not()` says why), and
the layers keep torch's Linear.

`install_into(model)` (the service's start-up, for a bfloat16 model) makes every Linear of the encoder's layers a
`TiledLinear`: the same parameters, the same module tree and state dict; it runs the kernel on a CPU at inference in
bfloat16, and `nn.Linear`'s own forward anywhere else (a GPU, float32, gradients). Its rows are computed alone, in
one order: a row's result does not depend on the batch it came in, which torch's bfloat16 products on AMX do not
promise (docs/precision.md).
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from kernels.loading import FirstUse, KernelUnavailable, ask_for_amx

SOURCE_NAME = "bf16_products_amx.c"
INPUTS_MULTIPLE = 32  # a tile row's bfloat16 inputs: a layer's input width must be a multiple of it
# Above this many rows torch's Linear takes the product: level with the tiles from about 1,024 rows, faster at 4,096
# (all-MiniLM-L6-v2's four products, tiles / torch at 21 / 256 / 1,024 / 4,096 rows: one core 0.46 / 0.92 / 0.99 /
# 1.12, two 0.31 / 0.60 / 0.97 / 1.14; a Sapphire Rapids-class Xeon, `python -m bench.peak.bf16_products`)
MOST_ROWS = 1024


class Kernel:
    """The loaded library."""

    instruction_set = "AMX"

    def __init__(self, library: ctypes.CDLL):
        ask_for_amx(library)
        pointer, size = ctypes.c_void_p, ctypes.c_int64
        self._size = library.bf16_blocked_size
        self._size.argtypes, self._size.restype = [size, size], size
        self._block = library.bf16_block_weights
        self._block.argtypes, self._block.restype = [pointer, size, size, pointer], None
        self._linear = library.bf16_linear
        self._linear.argtypes, self._linear.restype = [pointer, size, size, pointer, pointer, size, pointer, size], None

    @staticmethod
    def fits(in_features: int) -> bool:
        return in_features % INPUTS_MULTIPLE == 0

    def block(self, weight: torch.Tensor) -> torch.Tensor:
        """nn.Linear's (out, in) bfloat16 weight in the kernel's layout."""
        weight = weight.detach().to(torch.bfloat16).contiguous()
        out_features, in_features = weight.shape
        if not self.fits(in_features):
            raise ValueError(f"the bfloat16 tile products take inputs of a multiple of {INPUTS_MULTIPLE} features, "
                             f"not {in_features}")
        blocked = torch.empty(self._size(in_features, out_features), dtype=torch.bfloat16)
        self._block(weight.data_ptr(), in_features, out_features, blocked.data_ptr())
        return blocked

    def linear(self, rows: torch.Tensor, blocked: torch.Tensor, bias: torch.Tensor, out_features: int,
               threads: int | None = None) -> torch.Tensor:
        """rows (m, in) bfloat16 times the blocked weights, plus `bias` (out_features float32): (m, out) bfloat16."""
        if rows.dtype != torch.bfloat16 or rows.dim() != 2 or not self.fits(rows.shape[1]) or \
                bias.dtype != torch.float32 or bias.shape != (out_features,):
            raise ValueError(f"the bfloat16 tile products take (m, a multiple of {INPUTS_MULTIPLE}) bfloat16 rows and "
                             f"a float32 bias of {out_features}, not {tuple(rows.shape)} {rows.dtype} and "
                             f"{tuple(bias.shape)} {bias.dtype}")
        rows = rows.contiguous()
        out = torch.empty(rows.shape[0], out_features, dtype=torch.bfloat16)
        threads = torch.get_num_threads() if threads is None else threads
        self._linear(rows.data_ptr(), rows.shape[0], rows.shape[1], blocked.data_ptr(), bias.data_ptr(), out_features,
                     out.data_ptr(), threads)
        return out


def _check(candidate: Kernel) -> None:
    """Against float32 products of the same bfloat16 numbers: each output within its rounding to bfloat16 (half a
    step, 2^-9 of it) plus what float32 sums in another order may differ by; every row tail (1-17 rows, 40), a last
    block of columns narrower than 64 and a column count below 16."""
    generator = torch.Generator().manual_seed(0)
    for rows, inputs, outputs in ((1, 64, 70), (5, 96, 16), (16, 64, 128), (17, 32, 200), (40, 384, 10), (3, 32, 64)):
        x = torch.randn(rows, inputs, generator=generator).bfloat16()
        weight = torch.randn(outputs, inputs, generator=generator).bfloat16()
        bias = torch.randn(outputs, generator=generator)
        exact = x.float() @ weight.float().T + bias
        got = candidate.linear(x, candidate.block(weight), bias, outputs).float()
        tolerance = 2 ** -8 * exact.abs() + 1e-5 * (x.float().abs() @ weight.float().abs().T + bias.abs())
        if not bool(((got - exact).abs() <= tolerance).all()):
            raise KernelUnavailable(f"the bfloat16 tile products differ from float32's at {rows} x {inputs} x "
                                    f"{outputs}")


kernel = FirstUse(SOURCE_NAME, Kernel, _check, "bfloat16 Linear layers: torch's (oneDNN)")
why_not = kernel.why_not


def written(tensors) -> tuple:
    """Where each tensor's data lives, how often it was written in place, and its type (None for a missing one):
    another tuple once any of them changes (a cast, a load, a copy into it). What laid-out copies are checked by."""
    return tuple(None if t is None else (t.data_ptr(), t._version, t.dtype) for t in tensors)


class TiledLinear(nn.Linear):
    """nn.Linear whose bfloat16 inference on a CPU, up to MOST_ROWS rows, runs on AMX's tiles (`Kernel.linear`), its
    weights laid out at the first such call and again whenever they change; anything else runs nn.Linear's forward."""

    def __init__(self, linear: nn.Linear, tiles: Kernel):
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias  # the same parameters: the state dict is unchanged
        self._tiles = tiles
        self._laid_out: tuple | None = None  # (the weight's identity, blocked weights, float32 bias)

    def __getstate__(self):
        """A copy (copy.deepcopy) lays out its own weights; the library's handles are not copied."""
        state = super().__getstate__()
        return {name: value for name, value in state.items() if name not in ("_tiles", "_laid_out")}

    def __setstate__(self, state):
        super().__setstate__(state)
        self._tiles, self._laid_out = kernel(), None

    def laid_out(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The weights in the tiles' layout and the bias in float32 (zeros for none), laid out again whenever a
        parameter changed (a cast, a load): what `forward` and kernels.bf16_layer's one-call layer read."""
        identity = written((self.weight, self.bias))
        if self._laid_out is None or self._laid_out[0] != identity:
            bias = torch.zeros(self.out_features) if self.bias is None else self.bias.detach().float()
            self._laid_out = (identity, self._tiles.block(self.weight), bias)
        return self._laid_out[1], self._laid_out[2]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._tiles is None or x.device.type != "cpu" or x.dtype != torch.bfloat16 or \
                self.weight.dtype != torch.bfloat16 or \
                x.numel() > MOST_ROWS * self.in_features or \
                (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):
            return super().forward(x)
        blocked, bias = self.laid_out()
        out = self._tiles.linear(x.reshape(-1, self.in_features), blocked, bias, self.out_features)
        return out.view(*x.shape[:-1], self.out_features)


def tile_linears(module: nn.Module, tiles: Kernel) -> int:
    """Make every Linear inside `module` whose inputs the tiles take a `TiledLinear`; returns how many."""
    swapped = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and tiles.fits(child.in_features):
                setattr(parent, name, TiledLinear(child, tiles))
                swapped += 1
    return swapped


def install_into(model: nn.Module) -> int:
    """Make every Linear of `model`'s encoder layers whose inputs the tiles take a `TiledLinear`, where the kernel
    runs here (none elsewhere); returns how many."""
    tiles = kernel()
    if tiles is None:
        return 0
    return sum(tile_linears(layer, tiles) for layer in model.bert.encoder.layer)
