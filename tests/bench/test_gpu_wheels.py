"""The wheel list for a GPU machine (requirements/gpu-extra.txt, `make gpu-wheels`) is complete: every
third-party package that what bench.gpu runs imports (service/, model/, kernels/, trainer/, the benchmarks, the GPU-marked
tests), and everything those packages require at serve.txt's pins, is either on the list or among the GPU
machine's own packages (bench.gpu.env.MACHINE_PACKAGES). FastAPI 0.165's import of opentelemetry-api was
missed once: bench.gpu stopped at `import fastapi` on the GPU machine."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys

from packaging.markers import default_environment
from packaging.requirements import Requirement

from bench.gpu.env import MACHINE_PACKAGES, NEEDED_MODULES
from devkit.paths import REPO_ROOT

# What bench.gpu runs on the GPU machine.
RUN_THERE = ["service", "model", "kernels", "trainer", "devkit/server.py", "devkit/paths.py", "tests/gpu", "bench/gpu",
             "bench/serving/__main__.py", "bench/serving/throughput.py", "bench/serving/in_process_limit.py",
             "bench/serving/rows.py", "bench/serving/load.py",
             "bench/serving/naive_peer.py"]
GPU_PYTHON = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3", "extra": ""}
OURS = {"bench", "devkit", "kernels", "model", "service", "trainer", "tests"}
# Imported only on model.hub's download path (serving a Hub id, which needs a network the GPU machine does not
# have; bench.gpu serves directories), inside the functions that download.
DOWNLOAD_ONLY = {"httpx2"}


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: str) -> dict[str, str]:
    lines = (REPO_ROOT / "requirements" / path).read_text().splitlines()
    return {normal(name): version for name, _, version in
            (line.split("#")[0].strip().partition("==") for line in lines) if version}


def imported_top_levels() -> set[str]:
    files = [f for entry in RUN_THERE for f in ([REPO_ROOT / entry] if entry.endswith(".py")
                                                 else (REPO_ROOT / entry).rglob("*.py")) if f.exists()]
    found = set()
    for file in files:
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {name for name in found if name not in sys.stdlib_module_names and name not in OURS | DOWNLOAD_ONLY}


def test_the_list_of_what_runs_there_names_files_that_exist():
    # imported_top_levels skips an entry it cannot find: without this, a moved module would drop out of the
    # check unnoticed.
    assert [entry for entry in RUN_THERE if not (REPO_ROOT / entry).exists()] == []


def test_every_imported_package_travels_or_is_there():
    carried = set(pins("gpu-extra.txt"))
    distributions = metadata.packages_distributions()
    absent = {}
    for module in imported_top_levels() | {m.split(".")[0] for m in NEEDED_MODULES}:
        names = {normal(d) for d in distributions.get(module, [module])}
        if not names & (carried | MACHINE_PACKAGES):
            absent[module] = sorted(names)
    assert not absent, f"add to requirements/gpu-extra.txt (at serve.txt's pins): {absent}"


def test_the_list_is_closed_under_its_requirements():
    carried = pins("gpu-extra.txt")
    unmet = {}
    for name in carried:
        try:
            requirements = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # not installed here (py-spy at another version is fine: it has none)
        for text in requirements:
            requirement = Requirement(text)
            if requirement.marker and not requirement.marker.evaluate(GPU_PYTHON):
                continue
            if normal(requirement.name) not in set(carried) | MACHINE_PACKAGES:
                unmet.setdefault(name, []).append(text)
    assert not unmet, f"requirements of the listed wheels that neither travel nor are there: {unmet}"


def test_pins_match_the_service_lock():
    serve, carried = pins("serve.txt"), pins("gpu-extra.txt")
    differ = {n: (v, serve[n]) for n, v in carried.items() if n in serve and serve[n] != v}
    assert not differ, f"gpu-extra.txt pins that differ from serve.txt: {differ}"
    assert {"opentelemetry-api", "pyzmq", "msgpack", "py-spy", "fastapi", "uvicorn"} <= set(carried)
