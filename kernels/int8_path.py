"""Which int8 path this host runs: a description for /info and the log, and an identity of its output's bits: two
hosts with the same identity give the same bits for the same model and input, and two whose outputs may differ
have different identities.

What decides the bits of an int8 model's output, and what does not:
- the row-wise steps (quantize, dequantize, GELU, residual and LayerNorm) are kernels.int8_reference's formulas on
  every path (the C layer, numba, the reference itself), bit for bit: `FORMULAS` names them;
- the products are exact integers on every path (the VNNI or AVX2 kernel, or torch._int_mm);
- attention is float32 attention whose rounding depends on the code that runs it: a C kernel
  (kernels.attention, AVX-512 or AVX2: they sum in different orders) or torch's. The C layer runs its instruction
  set's kernel at every length; the modules run a kernel up to its longest sequence and torch's above; without AVX2,
  torch's throughout;
- everything else (embeddings, their LayerNorm, pooling, and torch's attention) is torch's, whose CPU kernels may
  round differently from one release or instruction set to the next: the identity names torch's version and the
  instruction set its kernels use here.
The identity is cautious: two hosts it tells apart may still agree (the C layer and the modules with the C kernel
agree on sequences the kernel takes). Thread counts change no bit of the int8 layers on any path, and with the C
kernels neither does batching.
"""

from __future__ import annotations

import torch

from kernels import attention, int8_layer, int8_numba, int8_products

FORMULAS = "int8 formulas 2"  # raise the number whenever kernels.int8_reference's results change (2: 12-bit inputs)


def attention_variant() -> str:
    """Which code computes attention inside int8 layers here, as the service's start-up arranges it."""
    layer = int8_layer.kernel()
    if layer is not None:
        return f"attention in C ({layer.attention}) at every length"
    found = attention.kernel()
    if found is not None:
        return f"attention in C ({found.instruction_set}) up to {found.max_length} tokens, torch's above"
    return "attention torch's"


def int8_path_identity() -> str:
    """The same string on two hosts whose int8 outputs for the same model and input are the same bits, another
    wherever they may differ (see the module's text)."""
    return f"{FORMULAS}; {attention_variant()}; torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()})"


def describe() -> str:
    """What runs the int8 layers here, and why not the fastest path where it does not run."""
    layer = int8_layer.kernel()
    if layer is not None:
        return f"each layer in one C call ({layer.products} products)"
    steps = "row steps in numba" if int8_numba.AVAILABLE else "row steps in torch (numba is not installed)"
    found = int8_products.kernel()
    products = f"{found.instruction_set} products" if found is not None else "torch._int_mm products"
    return f"layers as modules, {steps}, {products}: {int8_layer.why_not()}"
