"""The call both one-call layer libraries share (int8_layer*.c, bf16_layer_amx.c): `<name>_workspace(layer, rows,
longest, threads)` gives the bytes of scratch the layer needs, `<name>(layer, x, rows, starts, lengths, count,
longest, out, workspace, threads)` applies it to packed rows. The wrappers (kernels.int8_layer, kernels.bf16_layer)
check their inputs and build the layer's struct; this makes the call."""

from __future__ import annotations

import ctypes

import torch

from model.packing import Packing


class LayerCall:
    def __init__(self, library: ctypes.CDLL, name: str):
        pointer, size = ctypes.c_void_p, ctypes.c_int64
        self._workspace = getattr(library, f"{name}_workspace")
        self._workspace.argtypes, self._workspace.restype = [pointer, size, size, size], size
        self._layer = getattr(library, name)
        self._layer.argtypes = [pointer, pointer, size, pointer, pointer, size, size, pointer, pointer, size]
        self._layer.restype = None

    def __call__(self, struct: ctypes.Structure, x: torch.Tensor, packing: Packing, threads: int | None) -> torch.Tensor:
        """The layer `struct` describes applied to contiguous packed rows x, into a new tensor like x, on `threads`
        threads (torch's count unless given)."""
        threads = torch.get_num_threads() if threads is None else threads
        layer = ctypes.byref(struct)
        workspace = torch.empty(self._workspace(layer, x.shape[0], packing.max_length, threads), dtype=torch.uint8)
        out = torch.empty_like(x)
        self._layer(layer, x.data_ptr(), x.shape[0], packing.starts.data_ptr(), packing.lengths.data_ptr(),
                    len(packing.starts), packing.max_length, out.data_ptr(), workspace.data_ptr(), threads)
        return out
