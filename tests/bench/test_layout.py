"""bench/ imports without a circle: every import of one bench module by another (lazy ones inside functions
included) points down the tree, report -> serving/precision, gpu -> serving, serving -> precision."""

from __future__ import annotations

import ast

from devkit.paths import REPO_ROOT

BENCH = REPO_ROOT / "bench"


def module_name(path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def bench_imports() -> dict[str, set[str]]:
    """Module -> the bench modules it imports (`from bench.x import y` counts as bench.x.y where that is a module)."""
    modules = {module_name(path): path for path in BENCH.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("bench"):
                found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                          for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name.startswith("bench")}
        graph[name] = found - {name}
    return graph


def find_circle(graph: dict[str, set[str]]) -> list[str]:
    done, path = set(), []

    def visit(name: str) -> list[str]:
        if name in path:
            return path[path.index(name):] + [name]
        if name in done:
            return []
        path.append(name)
        for imported in sorted(graph.get(name, ())):
            if circle := visit(imported):
                return circle
        path.pop()
        done.add(name)
        return []

    for name in sorted(graph):
        if circle := visit(name):
            return circle
    return []


def test_bench_has_no_import_circle():
    assert find_circle(bench_imports()) == []


def test_the_circle_finder_finds_one():
    # so that the test above cannot pass by never looking
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_benchmark_module_is_left_loose_in_bench():
    # the layout shows what each benchmark measures: serving, precision, gpu, report, quality, training
    assert sorted(p.name for p in BENCH.glob("*.py")) == ["__init__.py"]
