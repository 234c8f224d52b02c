"""Building and loading this package's C kernels (`model/*.c`) at first use, for the CPU the service runs on.

Each kernel's C file is compiled with the system's C compiler (`CC`, else `cc`) into a kernel directory and loaded
through ctypes (which lets go of the GIL during each call, as torch's own kernels do). The directories tried, in
order: `BERT_KERNEL_DIR` (the Docker image builds its kernels there), the user's cache (`XDG_CACHE_HOME`, else
~/.cache, under bert-service/kernels), a per-user temporary one. A library's name carries a hash of its source and
flags: a changed source is rebuilt, a built one reused (about 0.4 s to build one).

Every kernel needs some CPU features (its intrinsics); where they, the compiler or a build are missing,
`load` raises `NativeUnavailable` with the reason, and the caller keeps torch's path, which computes the same.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).parent
log = logging.getLogger("model")

# Every kernel: its source in model/, compiler flags, and the CPU flags (/proc/cpuinfo) it needs. Here rather than
# in the modules that use them, so that this file alone (standard library only) builds them all: `python
# model/native.py` is how the Docker image builds its kernels, in a stage that has a compiler and no torch.
KERNELS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "int8_vnni.c": (("-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vnni"),
                    ("avx512f", "avx512bw", "avx512_vnni")),
    "attention_cpu.c": (("-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"),
                        ("avx512f", "avx512bw", "avx512vl", "avx512dq")),
    # includes the two above (a library of its own: one call a layer)
    "int8_layer.c": (("-O3", "-fopenmp", "-fno-math-errno", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
                      "-mavx512vnni"), ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni")),
}


class NativeUnavailable(Exception):
    """A kernel cannot run here; the message says why."""


def load(source_name: str) -> ctypes.CDLL:
    """The library built from `model/<source_name>` (one of KERNELS), on a CPU with the flags it needs."""
    flags, cpu_flags = KERNELS[source_name]
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        raise NativeUnavailable(f"the C kernels are for x86-64 Linux, not {platform.system()} {platform.machine()}")
    missing = [flag for flag in cpu_flags if flag not in _cpu_flags()]
    if missing:
        raise NativeUnavailable(f"this CPU lacks {', '.join(missing)}")
    try:
        library = ctypes.CDLL(str(build(source_name, flags)))
    except OSError as exc:
        raise NativeUnavailable(f"{source_name} did not load: {exc}") from None
    runtimes = openmp_runtimes()
    if "-fopenmp" in flags and len(runtimes) > 1:
        # Its threads would spin against torch's on the same cores; torch's kernels serve instead.
        raise NativeUnavailable(f"{source_name} loaded an OpenMP runtime other than torch's: {', '.join(runtimes)}")
    return library


def openmp_runtimes() -> list[str]:
    """The OpenMP runtime libraries mapped into this process (torch's; a kernel built with -fopenmp must find that
    same one: torch loads its libgomp.so.1 into the global namespace, where the kernel's libgomp.so.1 resolves)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    return sorted({line.split()[-1] for line in maps.splitlines() if "libgomp" in line or "libiomp" in line})


class FirstUse:
    """A kernel built, loaded and checked at the first call, once: `make` wraps the library, `check` raises
    NativeUnavailable where its results differ from torch's. Calling it gives the wrapper, or None where the kernel
    cannot run; `why_not()` then says why (and `fallback`, what runs instead, is logged with it)."""

    def __init__(self, source_name: str, make: Callable, check: Callable, fallback: str):
        self.source_name, self.make, self.check, self.fallback = source_name, make, check, fallback
        self.asked, self.checking, self.kernel, self.reason = False, False, None, None
        # Another thread's first call waits for the build and check; a call from within the check itself (which
        # may build models that ask for this kernel) gets None.
        self.lock = threading.RLock()

    def __call__(self):
        if self.asked:
            return self.kernel
        with self.lock:
            if self.asked or self.checking:
                return self.kernel
            self.checking = True
            try:
                candidate = self.make(load(self.source_name))
                self.check(candidate)
                self.kernel = candidate
            except NativeUnavailable as exc:
                self.reason = str(exc)
                log.info("%s (%s)", self.fallback, exc)
            finally:
                self.checking, self.asked = False, True
        return self.kernel

    def why_not(self) -> str | None:
        """Why the kernel is None, once it has been asked for; None while it is available or not yet asked."""
        return self.reason


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError as exc:
        raise NativeUnavailable(f"cannot read the CPU's flags: {exc}") from None
    return set(text.split())


def build(source_name: str, flags: tuple[str, ...]) -> Path:
    """The built library of `model/<source_name>`, built now unless a kernel directory holds it already."""
    source = HERE / source_name
    compiler = os.environ.get("CC", "cc")
    digest = hashlib.sha256(b"".join(path.read_bytes() for path in _sources(source)) + " ".join(flags).encode())
    digest = digest.hexdigest()[:16]
    name = f"{source.stem}-{digest}.so"
    for directory in kernel_directories():
        if (directory / name).is_file():
            return directory / name
    if shutil.which(compiler) is None:
        raise NativeUnavailable(f"no C compiler ({compiler}) to build {source.name}")
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
            raise NativeUnavailable(f"building {source.name} failed: {exc.stderr.decode(errors='replace')[-500:]}") \
                from None
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NativeUnavailable(f"building {source.name} failed: {exc}") from None
        finally:
            Path(partial.name).unlink(missing_ok=True)
        return directory / name
    raise NativeUnavailable(f"no writable directory to build {source.name} in (set BERT_KERNEL_DIR)")


def _sources(source: Path) -> list[Path]:
    """`source` and the files of this directory it includes (`#include "name.c"`, one level): a change to any of
    them makes another library."""
    included = [source.parent.joinpath(line.split('"')[1]) for line in source.read_text().splitlines()
                if line.startswith('#include "')]
    return [source, *included]


def kernel_directories() -> list[Path]:
    """Where built kernels are looked for, and kept, in order."""
    directories = [Path(os.environ["BERT_KERNEL_DIR"])] if os.environ.get("BERT_KERNEL_DIR") else []
    cache = os.environ.get("XDG_CACHE_HOME") or (Path.home() / ".cache")
    directories.append(Path(cache) / "bert-service" / "kernels")
    directories.append(Path(tempfile.gettempdir()) / f"bert-service-kernels-{os.getuid()}")
    return directories


def build_all() -> None:
    """Build every kernel into the first kernel directory, whatever this CPU runs."""
    for source_name, (flags, _) in KERNELS.items():
        print(build(source_name, flags))


if __name__ == "__main__":
    build_all()
