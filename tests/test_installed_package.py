"""The product as a user installs it: `pip install .` (not editable) into a fresh virtual environment, run from a
directory outside the repository, so that nothing of the checkout can be imported.

Offline and in seconds: the wheel is built here, installed with pip, and its dependencies are exactly the closure of
pyproject.toml's `dependencies` over what this environment has installed (each linked into the new environment,
its version checked against the declared range; `pip check` there agrees). A dependency pyproject.toml forgets is
then missing there, as it would be for a user: the server and the corpus job must run with what it declares, and
every third-party module the installed packages import must be declared (ray in its extra)."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest
from packaging.requirements import Requirement

from devkit.paths import REPO_ROOT
from devkit.server import free_port, start
from kernels import attention, int8_layer, int8_products

pytestmark = pytest.mark.timeout(300)
PRODUCT = ("model", "kernels", "service", "corpus", "trainer")
OPTIONAL = {"ray": "ray"}  # imported only by `python -m corpus embed --ray`: the extra that brings it
BUNDLED = REPO_ROOT / "checkpoints" / "minilm-wikipedia"  # data, not code: read in place


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject() -> dict:
    import tomllib

    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]


def closure(requirements: list[Requirement]) -> dict[str, metadata.Distribution]:
    """The installed distributions `requirements` need, recursively (markers and extras honoured); each must
    satisfy every range asked of it."""
    found: dict[str, metadata.Distribution] = {}
    pending = [(requirement, "") for requirement in requirements]
    while pending:
        requirement, extra = pending.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": extra}):
            continue
        distribution = metadata.distribution(requirement.name)  # PackageNotFoundError: not installed here
        assert requirement.specifier.contains(distribution.version, prereleases=True), \
            f"{requirement} is asked for, {distribution.version} is installed"
        name = normal(requirement.name)
        extras = sorted(requirement.extras)
        key = f"{name}[{','.join(extras)}]"
        if key in found:
            continue
        found[key] = distribution
        for text in distribution.requires or []:
            needed = Requirement(text)
            for wanted in extras or [""]:
                if not needed.marker or needed.marker.evaluate({"extra": wanted}):
                    pending.append((needed, wanted))
                    break
    return {normal(d.metadata["Name"]): d for d in found.values()}


def link_into(distributions: dict[str, metadata.Distribution], site: Path) -> None:
    """Make each distribution importable in `site` by linking its top-level files and folders there."""
    for distribution in distributions.values():
        home = Path(distribution.locate_file(""))
        tops = {Path(str(f)).parts[0] for f in distribution.files or [] if not str(f).startswith("..")}
        for top in tops:
            target = site / top
            if not target.exists() and (home / top).exists():
                target.symlink_to(home / top)


def tracked(paths: tuple[str, ...]) -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-z", "--", *paths], cwd=REPO_ROOT, capture_output=True, check=True)
    return [name for name in listed.stdout.decode().split("\0") if name]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """A fresh virtual environment holding the package, installed from a wheel built from the working tree."""
    if shutil.which("git") is None or not (REPO_ROOT / ".git").exists():
        pytest.skip("not a git checkout: the files to package are git's")
    root = tmp_path_factory.mktemp("installed")
    source = root / "source"
    for name in tracked(("pyproject.toml", "README.md", *PRODUCT)):
        if (REPO_ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(root / "dist"),
                    str(source)], check=True, capture_output=True, timeout=180)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    link_into(closure([Requirement(text) for text in pyproject()["dependencies"]]), site)
    wheel = next((root / "dist").glob("bert_serve-*.whl"))
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
                   check=True, capture_output=True, timeout=180)
    checked = subprocess.run([*pip, "--python", str(python), "check"], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    work = root / "work"  # where the commands run: outside the repository
    work.mkdir()
    env = {"PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "HOME": str(work), "BERT_KERNEL_DIR": str(root / "built"),
           "NUMBA_CACHE_DIR": str(root / "numba"), "HF_HUB_OFFLINE": "1", "LANG": "C.UTF-8"}
    return {"python": python, "site": site, "work": work, "env": env, "built": root / "built"}


def run(installed: dict, code: str) -> str:
    done = subprocess.run([str(installed["python"]), "-c", code], cwd=installed["work"], env=installed["env"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_the_installed_copy_is_what_runs_and_carries_its_c_sources(installed):
    where = json.loads(run(installed, "import json, corpus, kernels, model, service, trainer, kernels.build as b; "
                                      "print(json.dumps([m.__file__ for m in (corpus, kernels, model, service, "
                                      "trainer)] + sorted(p.name for p in b.SOURCES.glob('*.c'))))"))
    assert all(Path(path).is_relative_to(installed["site"]) for path in where[:5]), where
    assert where[5:] == sorted(path.name for path in (REPO_ROOT / "kernels" / "c").glob("*.c"))  # kernels, includes
    included = {"attention_float32.c", "attention_teams.c", "int8_layer_body.c", "vectors_avx2.c", "vectors_avx512.c"}
    assert included <= set(where[5:])


def test_pyproject_declares_every_third_party_module_the_installed_packages_import(installed):
    project = pyproject()
    declared = {normal(Requirement(text).name) for text in project["dependencies"]}
    extras = {name: {normal(Requirement(text).name) for text in texts}
              for name, texts in project.get("optional-dependencies", {}).items()}
    providers = metadata.packages_distributions()
    missing = []
    for path in sorted(p for package in PRODUCT for p in (installed["site"] / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for top in {name.split(".")[0] for name in names}:
                if top in sys.stdlib_module_names or top in PRODUCT:
                    continue
                owners = {normal(d) for d in providers.get(top, [top])}
                wanted = extras.get(OPTIONAL[top], set()) if top in OPTIONAL else declared
                if not owners & wanted:
                    missing.append(f"{path.relative_to(installed['site'])}: {top} ({', '.join(sorted(owners))})")
    assert missing == []
    serve_in = {normal(line.split("#")[0].split("[")[0].split("=")[0].strip())
                for line in (REPO_ROOT / "requirements" / "serve.in").read_text().splitlines()
                if line.split("#")[0].strip()}
    assert serve_in == declared  # the pins of requirements/serve.txt are made from the same list


def test_the_installed_server_serves_int8_with_the_c_kernels(installed):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [str(installed["python"]), "-m", "service", "--checkpoint", str(BUNDLED), "--dtype", "int8",
               "--port", str(port)]
    server = start(command, url, timeout_s=240, env=installed["env"], cwd=installed["work"])
    try:
        precision = httpx.get(url + "/info", timeout=10).json()["dtype"]  # the precision, as it runs
        vectors = httpx.post(url + "/embed", json={"inputs": ["a crane is flying"]}, timeout=30).json()
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert precision.startswith("int8") and len(vectors[0]) == 384
    if int8_layer.kernel() is not None:  # this machine runs the C layer from the checkout: so must the installed copy
        assert precision.endswith(f"; each layer in one C call ({int8_layer.kernel().products} products))"), precision
        # built from the installed sources into the kernel directory: nothing written beside the package
        used = [next(choice.source_name.removesuffix(".c") for choice in module.kernel.choices if choice())
                for module in (attention, int8_layer, int8_products)]  # each the first of its kinds that runs here
        assert sorted(p.name.split("-")[0] for p in installed["built"].glob("*.so")) == sorted(used)
        assert list((installed["site"] / "kernels").rglob("*.so")) == []
    else:
        assert "layers as modules" in precision and int8_layer.why_not() in precision, precision


def test_the_installed_corpus_job_embeds_a_file(installed):
    source = installed["work"] / "tiny.jsonl"
    texts = ["the storm moved north .", "it weakened over land .", "the album sold well ."]
    source.write_text("".join(json.dumps({"text": text}) + "\n" for text in texts), encoding="utf-8")
    output = installed["work"] / "vectors"
    done = subprocess.run([str(installed["python"]), "-m", "corpus", "embed", str(source), "--output", str(output),
                           "--checkpoint", str(BUNDLED), "--dtype", "int8"], cwd=installed["work"],
                          env=installed["env"], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    table = pq.read_table(output / "shards")
    assert table.num_rows == len(texts) and table.schema.field("embedding").type.list_size in (384, -1)
