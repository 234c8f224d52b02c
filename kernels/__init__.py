"""CPU kernels for the network in `model`: the int8 encoder (quantizer, layers, their row-wise steps and products)
and attention for short sequences, in C (built with the machine's compiler at first use), numba and torch.

The layout, from the formulas out:
- int8_reference: the int8 formulas in plain torch, the definition every other implementation gives the bits of;
- int8_numba, int8_rows: those steps as numba kernels, and the dispatch between numba and the reference;
- int8_products, attention, int8_layer: the C kernels' wrappers (VNNI products, attention, a whole int8 layer);
  c/ holds their sources, build compiles them (`python -S -m kernels.build`), loading loads and checks them,
  cpu_features says what the CPU can run;
- int8_modules, quantize: the int8 modules and the quantizer that puts them into a model;
- int8_path: what runs here, and an identity of the int8 output's bits.

`model` never imports this package: `install()` hands the attention kernel to `model.attention`. Names are imported
on first use, so that `python -S -m kernels.build` needs nothing but the standard library.
"""

from __future__ import annotations

import importlib

_HOMES = {"install": "kernels.attention", "int8_path_identity": "kernels.int8_path"}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value
