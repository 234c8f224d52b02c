"""Whether every model of a server fits the device, checked before any is loaded: a server either serves all its
models or does not start, and says what would not fit, with the figures.

Each model's need is estimated from its weight files and its config: the weights in the precision it will compute
in (its safetensors header gives each tensor's shape; int8 keeps the encoder layers' Linear weights in one byte, plus
the int8 products kernel's blocked copy where one runs, and the rest in four), its activations for one batch at the
token budget (the widest layer's, several at once), and on a GPU as much again for the CUDA graphs' memory pool, and
again for a second stream's cached blocks where a model's batches may also run on an express runner's stream
(--gpu-express-lane: the allocator keeps each stream's freed blocks for that stream).
What is free: the GPU's free memory (torch.cuda.mem_get_info), or on a CPU what the kernel calls available, within
the container's memory limit (cgroup v2).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

GIB = 2**30
ACTIVATION_COPIES = 6  # live activation tensors of the widest size during one layer's forward pass, and headroom
ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Need:
    name: str
    weight_bytes: int
    activation_bytes: int

    @property
    def total(self) -> int:
        return self.weight_bytes + self.activation_bytes


def tensor_shapes(directory: Path) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape from the checkpoint's safetensors headers (no weights read)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(directory.glob("*.safetensors")):
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        shapes.update((name, tuple(info["shape"])) for name, info in header.items() if name != "__metadata__")
    return shapes


def quantized_in_int8(name: str, shape: tuple[int, ...]) -> bool:
    """Whether --dtype int8 turns this tensor into an int8 Linear's weights: an encoder layer's Linear (keys with or
    without a model prefix: `bert.encoder.layer.0...` in BertForPreTraining's files, `encoder.layer.0...` in
    BertModel's)."""
    return (name.startswith("encoder.layer.") or ".encoder.layer." in name) and name.endswith(".weight") \
        and "LayerNorm" not in name and len(shape) == 2


def int8_linear_bytes(out_features: int, in_features: int) -> int:
    """An int8 Linear's weights: one byte each, and as many again in the products kernel's blocked layout where one
    runs here (two again for the AVX2 kernel's 16-bit pairs)."""
    from kernels import int8_products  # the kernel's own layout; loaded only for an int8 model

    found = int8_products.kernel_for(in_features)
    return out_features * in_features + (found.blocked_bytes(in_features, out_features) if found is not None else 0)


def model_need(name: str, directory: Path, dtype: str, config, batch_tokens: int, on_gpu: bool,
               streams: int = 1) -> Need:
    """The memory one model will take, estimated (see the module's doc). `dtype` as resolved (auto: bfloat16 on a
    GPU, else float32: the larger of what a CPU may choose); `streams`: the GPU streams its batches may run on."""
    shapes = tensor_shapes(directory)
    if dtype == "int8":
        weights = sum(int8_linear_bytes(*shape) if quantized_in_int8(key, shape) else 4 * math.prod(shape)
                      for key, shape in shapes.items())
    else:
        weights = ELEMENT_BYTES.get(dtype, 4) * sum(math.prod(shape) for shape in shapes.values())
    element = 4 if dtype in ("float32", "int8") else 2
    widest = max(config.intermediate_size, 3 * config.hidden_size)
    activations = ACTIVATION_COPIES * batch_tokens * widest * element
    if on_gpu:
        activations *= 1 + streams  # the CUDA graphs' pool beside the eager pass's on each stream
    return Need(name, weights, activations)


def free_memory(device) -> tuple[int, str]:
    """(bytes free for the models, what that is) on `device` (a torch.device)."""
    if device.type == "cuda":
        import torch

        free, total = torch.cuda.mem_get_info(device)
        return free, f"{free / GIB:.1f} GiB free of the GPU's {total / GIB:.1f} GiB"
    available = _meminfo_available()
    limit = _cgroup_room()
    if limit is not None and (available is None or limit < available):
        return limit, f"{limit / GIB:.1f} GiB left under the container's memory limit"
    if available is None:
        return 1 << 62, "unknown (no /proc/meminfo)"
    return available, f"{available / GIB:.1f} GiB available on this host"


def check_fits(needs: list[Need], free: int, described: str) -> str | None:
    """None if every model fits, else the reason, with the figures."""
    total = sum(n.total for n in needs)
    if total <= free:
        return None
    each = ", ".join(f"{n.name} {n.total / GIB:.2f} GiB ({n.weight_bytes / GIB:.2f} weights)" for n in needs)
    return (f"the models would need about {total / GIB:.2f} GiB and the device has {described}: {each}; serve fewer "
            f"or smaller models, a smaller --max-batch-tokens, or a narrower --model-setting NAME:dtype=...")


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _cgroup_room() -> int | None:
    """cgroup v2: memory.max less memory.current, None without a limit."""
    base = Path("/sys/fs/cgroup")
    try:
        limit = (base / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((base / "memory.current").read_text()))
    except (OSError, ValueError):
        return None
