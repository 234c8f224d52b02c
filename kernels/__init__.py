"""CPU kernels for the network in `model`: the int8 encoder (quantizer, layers, their row-wise steps and products),
the bfloat16 encoder on AMX, and attention, in C (built with the machine's compiler at first use), numba and torch.

The layout, from the formulas out:
- int8_reference: the int8 formulas in plain torch, the definition every other implementation gives the bits of;
- int8_numba, int8_rows: those steps as numba kernels, and the dispatch between numba and the reference;
- int8_products, attention, int8_layer: the C kernels' wrappers (int8 products, attention in float32 and
  bfloat16, a whole int8 layer; each for AVX-512 and for AVX2 alone, and on AMX's tiles where the CPU has them);
- bf16_linear, bf16_layer: a bfloat16 network's Linear layers and whole layers on AMX's tiles;
  c/ holds their sources, build compiles them (`python -S -m kernels.build`), loading loads and checks them,
  cpu_features says what the CPU can run;
- int8_modules, quantize: the int8 modules and the quantizer that puts them into a model;
- int8_path: what runs here, and an identity of the int8 output's bits.

`model` never imports this package: `install()` hands the attention kernel to `model.attention`. Importing this
package imports nothing, so that `python -S -m kernels.build` needs the standard library alone.
"""

from __future__ import annotations


def install() -> None:
    """Make `model.attention` ask this package for its CPU attention kernel (kernels.attention)."""
    from kernels import attention

    attention.install()


def int8_path_identity() -> str:
    """The same string on two hosts whose int8 outputs are the same bits, another wherever they may differ
    (kernels.int8_path)."""
    from kernels import int8_path

    return int8_path.int8_path_identity()
