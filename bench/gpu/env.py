"""The packages bench.gpu needs beyond what a GPU machine's Python holds, installed from .whl/gpu offline.

On the GPU machines this was made for, `python3` is itself a virtual environment holding torch. A venv
made from it with --system-site-packages sees the *base* interpreter's packages, not torch. So the wheels go
into a plain folder (`pip install --target`) that the same interpreter then reads through PYTHONPATH:
bench.gpu re-runs itself with it set, and every process it starts (pytest, the service, the trainer, the
load generator) inherits it. Console scripts (py-spy) land in the folder's bin/, put on PATH too.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from devkit.paths import REPO_ROOT

WHEELS = REPO_ROOT / ".whl" / "gpu"  # `make gpu-wheels` fills it (requirements/gpu-extra.txt)
SITE = REPO_ROOT / ".whl" / "gpu-site"  # where they are installed (ignored by git, as .whl/ is)
MARK = "BERT_GPU_SITE"  # set in the re-run process: the install happened, do not loop
# Modules whose absence means the wheels must be installed (what service/, the trainer and bench.gpu import
# beyond the machine's own packages); py-spy is a program.
NEEDED_MODULES = ("fastapi", "uvicorn", "httptools", "pydantic_settings", "orjson", "prometheus_client",
                  "fastapi_offline", "opentelemetry", "zmq", "msgpack", "pysbd")
NEEDED_PROGRAMS = ("py-spy",)

# The Python packages such a GPU machine's python3 already holds (its package list, read 2026-11-17), normalised
# names: what requirements/gpu-extra.txt need not carry.
MACHINE_PACKAGES = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax
fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx humanize huggingface-hub
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2
joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch
mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver
nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex
requests rich sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate
tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())


def program(name: str) -> str | None:
    """A console script of an installed package: beside this interpreter (a venv's bin/, not always on
    PATH), in SITE/bin, or on PATH."""
    for folder in (Path(sys.executable).parent, SITE / "bin"):
        if (folder / name).is_file():
            return str(folder / name)
    return shutil.which(name)


def missing() -> list[str]:
    return [m for m in NEEDED_MODULES if importlib.util.find_spec(m) is None] + \
        [p for p in NEEDED_PROGRAMS if program(p) is None]


def ensure_packages(argv: list[str]) -> None:
    """Return when everything is importable; else install .whl/gpu into SITE and re-run `python -m bench.gpu
    argv` with PYTHONPATH (and PATH) pointing there. Exits with a message naming what to do when it cannot."""
    absent = missing()
    if not absent:
        return
    if os.environ.get(MARK):
        sys.exit(f"error: {absent} still missing after installing {WHEELS.relative_to(REPO_ROOT)} into "
                 f"{SITE.relative_to(REPO_ROOT)}: is requirements/gpu-extra.txt complete, and were the wheels "
                 f"downloaded for this Python ({sys.version_info.major}.{sys.version_info.minor})?")
    wheels = sorted(WHEELS.glob("*.whl")) if WHEELS.is_dir() else []
    if not wheels:
        sys.exit(f"error: bench.gpu needs {absent}; run `make gpu-wheels` on a machine with a network first "
                 f"(it fills {WHEELS.relative_to(REPO_ROOT)}; GPU_PYTHON=3.12 by default)")
    shutil.rmtree(SITE, ignore_errors=True)
    print(f"installing {len(wheels)} wheels from {WHEELS.relative_to(REPO_ROOT)} into {SITE.relative_to(REPO_ROOT)} "
          f"(for {absent})", file=sys.stderr)
    installed = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                                "--no-cache-dir", "--disable-pip-version-check", "--target", str(SITE),
                                *map(str, wheels)])
    if installed.returncode:
        sys.exit(f"error: installing {WHEELS.relative_to(REPO_ROOT)} failed (above); were they downloaded for "
                 f"this Python? `make gpu-wheels GPU_PYTHON={sys.version_info.major}.{sys.version_info.minor}`")
    env = {**os.environ, MARK: str(SITE),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(SITE), str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
           "PATH": os.pathsep.join(filter(None, [str(SITE / "bin"), os.environ.get("PATH")]))}
    os.execve(sys.executable, [sys.executable, "-m", "bench.gpu", *argv], env)
