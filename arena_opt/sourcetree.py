"""The repository's own Python modules and the imports between them, read with `ast` (nothing is imported).

tests/test_layering.py checks the edges against the layer order; bench/_provenance.py follows them from a bench
script to every file the bench can run, so a result records the code it measured.

Every import counts: top level, inside functions, under `if TYPE_CHECKING`, relative ones, and string literals
that name a module of the tree ('pkg.mod' or 'pkg.mod:attr', as registries, importlib and `python -m` are given
them). An import names the deepest module file it reaches (`from a.b import c` names a/b/c.py when that exists,
else a/b/__init__.py).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("arena_opt", "models", "runners")


@dataclass(frozen=True)
class Edge:
    importer: str
    imported: str
    path: str  # the importer's file, relative to the root
    line: int


def module_name(path: str) -> str:
    parts = list(Path(path).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: str, source: str, modules: set[str], packages: tuple[str, ...] = PACKAGES,
            aliases: dict[str, str] | None = None) -> tuple[list[Edge], list[str]]:
    """Edges from one file to the tree's modules, and the imports of the tree's packages that name
    no module file (a stale import after a move, even one inside a function that no test runs).
    `aliases` maps a top-level name in an import statement to the module it is (a bench script imports
    `_perf_common`, which is bench/_perf_common.py because the script's folder is on sys.path); the
    packages' own names are never aliased (the root comes first on sys.path)."""
    me = module_name(path)
    package = me if path.endswith("__init__.py") else me.rpartition(".")[0]
    # a bare name is a sibling only for a file of the same folder (a script's folder is on its sys.path)
    aliases = {k: v for k, v in (aliases or {}).items() if k not in packages and v.rpartition(".")[0] == package}
    edges: list[Edge] = []
    missing: list[str] = []

    def canonical(name: str) -> str:
        head, dot, rest = name.partition(".")
        return aliases[head] + dot + rest if head in aliases else name

    def ours(name: str) -> bool:
        return name.split(".")[0] in packages

    def add(target: str, line: int) -> None:
        if target not in modules:
            missing.append(f"{path}:{line}: {me} imports {target}, which is no module of the tree")
        elif target != me and Edge(me, target, path, line) not in edges:  # one per line: `from m import a, b`
            edges.append(Edge(me, target, path, line))

    for node in ast.walk(ast.parse(source, filename=path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = canonical(alias.name)
                if ours(name):
                    add(name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[:-(node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = canonical(node.module or "")
            if not ours(target):
                continue
            if target not in modules:
                add(target, node.lineno)
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                add(sub if sub in modules else target, node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value.split(":")[0]
            if "." in name and ours(name) and name in modules:
                add(name, node.lineno)
    return edges, missing


def sources(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """{path relative to root: source} of every .py file of the packages."""
    return {p.relative_to(root).as_posix(): p.read_text()
            for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}


def reachable(start: str, tree: dict[str, str], packages: tuple[str, ...] = PACKAGES,
              aliases: dict[str, str] | None = None, stop: frozenset[str] = frozenset()) -> list[str]:
    """The files `start` (a path of `tree`) can run: itself, what it imports transitively, and the packages'
    `__init__` files above each of them (importing a.b.c runs a and a.b first). Files in `stop` are left out
    and not followed."""
    by_module = {module_name(p): p for p in tree}
    modules = set(by_module)
    seen: set[str] = set()
    todo = [start]
    while todo:
        path = todo.pop()
        if path in seen or path in stop:
            continue
        seen.add(path)
        parts = module_name(path).split(".")
        todo += [by_module[p] for i in range(1, len(parts)) if (p := ".".join(parts[:i])) in by_module]
        edges, _ = imports(path, tree[path], modules, packages, aliases)
        todo += [by_module[e.imported] for e in edges]
    return sorted(seen)
