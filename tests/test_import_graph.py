"""How the project's packages depend on each other: no import cycle between any two of its modules (imports inside
functions count: a lazy import only defers a cycle), `model` (the network) imports no other package of the project,
and no kernel code lives under model/ (C sources and built libraries, numba, libraries loaded through ctypes: they
belong to `kernels`)."""

from __future__ import annotations

import ast
from pathlib import Path

from devkit.paths import REPO_ROOT

PACKAGES = ("model", "kernels", "service", "corpus", "trainer", "devkit", "bench")
KERNEL_FILES = (".c", ".h", ".cc", ".cpp", ".so")
KERNEL_IMPORTS = ("numba", "llvmlite", "cffi")


def project_modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted name -> file, for every Python module of `packages` under `root`."""
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_names(name: str, path: Path) -> set[str]:
    """Every name `path` (module `name`) imports, anywhere in it: `import X.Y` gives X.Y, `from X import Y` X.Y
    (relative imports resolved)."""
    found = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project's modules it imports: X.Y where that is a module, else X (a name from module X)."""
    graph = {}
    for name, path in modules.items():
        edges = set()
        for target in imported_names(name, path):
            if target not in modules:
                target = target.rpartition(".")[0]
            if target in modules and target != name:
                edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_among_the_projects_modules():
    graph = import_graph(project_modules(REPO_ROOT, PACKAGES))
    assert {"kernels.int8_layer", "kernels.quantize", "model.attention"} <= set(graph)  # the scan sees them
    assert cycles(graph) == []


def test_model_imports_no_other_package_of_the_project():
    """The network stands alone: `kernels` installs itself into it (kernels.attention.install), not the reverse."""
    modules = project_modules(REPO_ROOT, PACKAGES)
    outside = sorted(f"{name} imports {target}" for name, edges in import_graph(modules).items()
                     if name.split(".")[0] == "model" for target in edges if target.split(".")[0] != "model")
    assert outside == []


def test_no_kernel_code_under_model():
    files = [path.name for path in (REPO_ROOT / "model").rglob("*") if path.suffix in KERNEL_FILES]
    assert files == []
    found = []
    for name, path in project_modules(REPO_ROOT, ("model",)).items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for imported in imported_names(name, path):
            if imported.split(".")[0] in KERNEL_IMPORTS:
                found.append(f"{name} imports {imported}")
        for node in ast.walk(tree):  # a library loaded through ctypes, other than the C library the process runs on
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("CDLL", "PyDLL", "LoadLibrary") and not (
                        len(node.args) == 1 and isinstance(node.args[0], ast.Constant) and node.args[0].value is None):
                found.append(f"{name}:{node.lineno} loads a library through ctypes")
    assert found == []


def test_the_checks_see_a_cycle_a_lazy_import_and_kernel_code(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def f():\n    from pkg.c import g\n")  # the lazy import closes the cycle
    (package / "c.py").write_text("from . import a\nimport numba\n")
    (package / "d.py").write_text("from pkg import a\n")
    graph = import_graph(project_modules(tmp_path, ("pkg",)))
    assert graph["pkg.c"] == {"pkg.a"} and graph["pkg.d"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert "numba" in imported_names("pkg.c", package / "c.py")
