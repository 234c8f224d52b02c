"""Building this package's C kernels (`kernels/c/*.c`) with the machine's C compiler, into a kernel directory.

Each kernel's C file is compiled with the system's C compiler (`CC`, else `cc`). The directories tried, in order:
`BERT_KERNEL_DIR` (the Docker image builds its kernels there), the user's cache (`XDG_CACHE_HOME`, else ~/.cache,
under bert-service/kernels), a per-user temporary one; never the package's own folder, which an installed copy
may not be allowed to write. A library's name carries a hash of its source and flags: a changed source is rebuilt,
a built one reused (about 0.4 s to build one).

Standard library only, and nothing else of this package: `python -S -m kernels.build` builds every kernel into
the first kernel directory, which is how the Docker image builds them, in a stage that has a compiler and no torch.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCES = Path(__file__).parent / "c"

# Flags that keep every float operation as the source writes it: no multiply-add contracted into one rounding, no
# reordered sums. The C layer then gives the bits of kernels.int8_reference's formulas, whatever the compiler.
EXACT_FLOATS = ("-ffp-contract=off",)
AVX512 = ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq")
AMX, AMX_CPU_FLAGS = ("-mamx-tile", "-mamx-int8"), ("amx_tile", "amx_int8")

# Every kernel: its source in kernels/c/, its compiler flags, and the CPU flags (/proc/cpuinfo) it needs. Here rather
# than in the modules that load them, so that this file alone builds them all.
KERNELS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "int8_products.c": (("-O3", "-fopenmp", *EXACT_FLOATS, "-mavx512f", "-mavx512bw", "-mavx512vnni"),
                        ("avx512f", "avx512bw", "avx512_vnni")),
    # includes int8_products.c: VNNI's loops take the rows left over from AMX's tiles of 16
    "int8_products_amx.c": (("-O3", "-fopenmp", *EXACT_FLOATS, "-mavx512f", "-mavx512bw", "-mavx512vnni", *AMX),
                            ("avx512f", "avx512bw", "avx512_vnni", *AMX_CPU_FLAGS)),
    "int8_products_avx2.c": (("-O3", "-fopenmp", "-mavx2"), ("avx2",)),
    "attention.c": (("-O3", "-fopenmp", *EXACT_FLOATS, *AVX512), ("avx512f", "avx512bw", "avx512vl", "avx512dq")),
    "attention_avx2.c": (("-O3", "-fopenmp", *EXACT_FLOATS, "-mavx2", "-mfma"), ("avx2", "fma")),
    # includes attention.c: its library serves float32 and bfloat16 networks
    "attention_bf16.c": (("-O3", "-fopenmp", *EXACT_FLOATS, *AVX512, "-mavx512bf16"),
                         ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16")),
    "bf16_products_amx.c": (("-O3", "-fopenmp", *AVX512, "-mavx512bf16", "-mamx-tile", "-mamx-bf16"),
                            ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "amx_tile", "amx_bf16")),
    # includes bf16_products_amx.c and attention_bf16_amx.c: a bfloat16 layer in one call
    "bf16_layer_amx.c": (("-O3", "-fopenmp", *EXACT_FLOATS, "-fno-math-errno", *AVX512, "-mavx512bf16", "-mamx-tile",
                          "-mamx-bf16"),
                         ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "amx_tile", "amx_bf16")),
    # includes attention_bf16.c: its loops take the head sizes and sequences the tiles do not
    "attention_bf16_amx.c": (("-O3", "-fopenmp", *EXACT_FLOATS, *AVX512, "-mavx512bf16", "-mamx-tile", "-mamx-bf16"),
                             ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "amx_tile", "amx_bf16")),
    # each includes a products and an attention kernel above (a library of its own: one call a layer)
    "int8_layer.c": (("-O3", "-fopenmp", *EXACT_FLOATS, "-fno-math-errno", *AVX512, "-mavx512vnni"),
                     ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni")),
    "int8_layer_amx.c": (("-O3", "-fopenmp", *EXACT_FLOATS, "-fno-math-errno", *AVX512, "-mavx512vnni", *AMX),
                         ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", *AMX_CPU_FLAGS)),
    # -fno-trapping-math: without AVX-512's masks, gcc vectorizes a loop with a float compare-and-select (GELU's
    # clamp, rounding half away from zero) only when compares need not raise exceptions; no value changes
    "int8_layer_avx2.c": (("-O3", "-fopenmp", *EXACT_FLOATS, "-fno-math-errno", "-fno-trapping-math", "-mavx2",
                           "-mfma"), ("avx2", "fma")),
}


class BuildFailed(Exception):
    """A kernel could not be built here; the message says why."""


def build(source_name: str, flags: tuple[str, ...] | None = None, sources: Path | None = None) -> Path:
    """The built library of `<sources>/<source_name>` (kernels/c/ by default), built now unless a kernel directory
    holds it already. `flags`: KERNELS' for that source unless given. A benchmark's own C file (bench/peak/) passes
    its folder and flags: it is then built as the product's kernels are, by the same compiler, and cached beside
    them."""
    flags = KERNELS[source_name][0] if flags is None else flags
    source = (SOURCES if sources is None else sources) / source_name
    compiler = os.environ.get("CC", "cc")
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in _sources(source)) + " ".join(flags).encode())
    name = f"{source.stem}-{digest.hexdigest()[:16]}.so"
    for directory in kernel_directories():
        if (directory / name).is_file():
            return directory / name
    if shutil.which(compiler) is None:
        raise BuildFailed(f"no C compiler ({compiler}) to build {source.name}")
    for directory in kernel_directories():
        try:
            directory.mkdir(parents=True, exist_ok=True)
            # Built under a temporary name, then renamed: a process starting beside this one never loads half a file.
            with tempfile.NamedTemporaryFile(dir=directory, prefix=".building-", suffix=".so", delete=False) as partial:
                pass
        except OSError:
            continue
        try:
            subprocess.run([compiler, *flags, "-fPIC", "-shared", str(source), "-o", partial.name], check=True,
                           capture_output=True, timeout=120)
            # Readable by all: the temporary file starts private, and an image built as root runs as another user.
            os.chmod(partial.name, 0o755)
            os.replace(partial.name, directory / name)
        except subprocess.CalledProcessError as exc:
            raise BuildFailed(f"building {source.name} failed: {exc.stderr.decode(errors='replace')[-500:]}") from None
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BuildFailed(f"building {source.name} failed: {exc}") from None
        finally:
            Path(partial.name).unlink(missing_ok=True)
        return directory / name
    raise BuildFailed(f"no writable directory to build {source.name} in (set BERT_KERNEL_DIR)")


def _sources(source: Path) -> list[Path]:
    """`source` and the files of its folder it includes (`#include "name.c"`, and what those include): a change to
    any of them makes another library."""
    found = [source]
    for path in found:  # grows as it goes: each file's includes are read in turn (a missing one: the compiler says)
        for line in (path.read_text().splitlines() if path.is_file() else ()):
            if line.startswith('#include "') and source.parent.joinpath(line.split('"')[1]) not in found:
                found.append(source.parent.joinpath(line.split('"')[1]))
    return found


def kernel_directories() -> list[Path]:
    """Where built kernels are looked for, and kept, in order."""
    directories = [Path(os.environ["BERT_KERNEL_DIR"])] if os.environ.get("BERT_KERNEL_DIR") else []
    cache = os.environ.get("XDG_CACHE_HOME") or (Path.home() / ".cache")
    directories.append(Path(cache) / "bert-service" / "kernels")
    directories.append(Path(tempfile.gettempdir()) / f"bert-service-kernels-{os.getuid()}")
    return directories


def build_all() -> list[Path]:
    """Build every kernel into the first writable kernel directory, whatever this CPU runs."""
    return [build(source_name) for source_name in KERNELS]


if __name__ == "__main__":
    import sys

    try:
        for path in build_all():
            print(path)
    except BuildFailed as exc:
        sys.exit(f"kernels.build: {exc}")
