"""Imports go one way, down the order of packages written in docs/ARCHITECTURE.md:

    models -> core -> sim | runners -> profiling -> cli

(a package may import those to its left and its own layer; sim and runners are siblings that import
neither each other). Layers, by module name:

- models:    `models`, `models.*`
- cli:       every module named `cli` or `*_cli` (`arena_opt.cli`, `arena_opt.sim.cli`,
             `arena_opt.profiling.cli`, `runners.cli`, `runners.slurm_cli`): the command lines, which may
             import everything; every plugin `arena_opt.cli.PLUGINS` names must be one
- sim:       `arena_opt.sim`, `arena_opt.sim.*`
- runners:   `runners`, `runners.*`
- profiling: `arena_opt.profiling`, `arena_opt.profiling.*`
- core:      every other module of `arena_opt` (snapshot, gpus, plan, decision, perf, grids, milp,
             placement, policies, trace, cluster, ...)

Every import counts: top level, inside functions, under `if TYPE_CHECKING`, relative ones, and string
literals that name a module of the tree ('pkg.mod' or 'pkg.mod:attr', as the policy registry and the
CLI's plugin list hand to importlib). An import names the deepest module file it reaches
(`from a.b import c` names a/b/c.py when that exists, else a/b/__init__.py); the packages above it run
too, and the test checks that no package's `__init__` sits above a module inside it. Any cycle between
files fails as well. There is no list of exceptions: move the code instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from arena_opt.sourcetree import PACKAGES, Edge, imports, module_name, sources

ROOT = Path(__file__).resolve().parent.parent
RANK = {"models": 0, "core": 1, "sim": 2, "runners": 2, "profiling": 3, "cli": 4}
ORDER = "models -> core -> sim | runners -> profiling -> cli"


def layer_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "models":
        return "models"
    if parts[-1] == "cli" or parts[-1].endswith("_cli"):
        return "cli"
    if parts[0] == "runners":
        return "runners"
    if parts[:2] == ["arena_opt", "sim"]:
        return "sim"
    if parts[:2] == ["arena_opt", "profiling"]:
        return "profiling"
    if parts[0] == "arena_opt":
        return "core"
    raise ValueError(f"{module}: not a module of {', '.join(PACKAGES)}")


def allowed(importer: str, imported: str) -> bool:
    a, b = layer_of(importer), layer_of(imported)
    return a == b or RANK[a] > RANK[b]


def describe(e: Edge) -> str:
    return (f"{e.path}:{e.line}: {e.importer} ({layer_of(e.importer)}) imports "
            f"{e.imported} ({layer_of(e.imported)})")


def cycles(edges: list[Edge]) -> list[list[Edge]]:
    """One cycle (as its edges) for every strongly connected group of files (Tarjan)."""
    graph: dict[str, dict[str, Edge]] = {}
    for e in edges:
        graph.setdefault(e.importer, {}).setdefault(e.imported, e)
        graph.setdefault(e.imported, {})
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the number of files (~100)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)

    out = []
    for group in groups:
        start = min(group)
        # breadth-first inside the group from `start` back to `start`: the shortest cycle through it
        prev: dict[str, Edge] = {}
        frontier = [start]
        while frontier and start not in prev:
            nxt = []
            for v in frontier:
                for w, e in sorted(graph[v].items()):
                    if w in group and w not in prev:
                        prev[w] = e
                        nxt.append(w)
            frontier = nxt
        path, v = [], start
        while True:
            e = prev[v]
            path.append(e)
            v = e.importer
            if v == start:
                break
        out.append(path[::-1])
    return out


def check(sources: dict[str, str]) -> list[str]:
    """Every problem of a tree given as {relative path: source}, one line each."""
    modules = {module_name(p) for p in sources}
    problems: list[str] = []
    edges: list[Edge] = []
    for path, source in sorted(sources.items()):
        found, missing = imports(path, source, modules)
        edges += found
        problems += missing
    for e in edges:
        if not allowed(e.importer, e.imported):
            problems.append(f"{describe(e)}: against the order {ORDER}")
    for m in sorted(modules):
        parts = m.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent in modules and not allowed(m, parent):
                problems.append(f"{m} ({layer_of(m)}) sits in package {parent}, whose __init__ is in layer "
                                f"{layer_of(parent)}: importing {m} runs it")
    for cyc in cycles(edges):
        chain = " -> ".join([cyc[0].importer] + [e.imported for e in cyc])
        where = "; ".join(f"{e.path}:{e.line}" for e in cyc)
        problems.append(f"import cycle between files: {chain} ({where})")
    return problems


def tree_sources() -> dict[str, str]:
    return sources(ROOT)


def test_imports_follow_the_order_and_form_no_cycle():
    sources = tree_sources()
    assert len(sources) > 50 and "arena_opt/cli.py" in sources  # the walk found the tree
    problems = check(sources)
    assert not problems, "\n".join(problems)


def test_every_module_has_a_layer():
    layers = {module_name(p): layer_of(module_name(p)) for p in tree_sources()}
    cli = {m for m, layer in layers.items() if layer == "cli"}
    assert {"arena_opt.cli", "arena_opt.sim.cli", "arena_opt.profiling.cli", "runners.cli"} <= cli
    # the modules the CLI loads by name are command lines themselves, and nothing else is
    tree = ast.parse((ROOT / "arena_opt" / "cli.py").read_text())
    plugins = next(ast.literal_eval(n.value) for n in tree.body
                   if isinstance(n, ast.Assign) and [t.id for t in n.targets if isinstance(t, ast.Name)] == ["PLUGINS"])
    assert cli == {"arena_opt.cli", *plugins}
    assert set(layers.values()) == set(RANK)
    assert layers["arena_opt.perf.planner"] == layers["arena_opt.perf.sharing"] == "core"


def test_architecture_doc_states_the_order():
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    assert ORDER in doc


# --- the checker itself, on a synthetic tree ---------------------------------------------------------------------

SYNTHETIC = {
    "models/__init__.py": "",
    "models/cat.py": "import numpy\n",
    "models/bad.py": "def f():\n    from arena_opt.core_mod import x\n",          # models -> core
    "arena_opt/__init__.py": "",
    "arena_opt/core_mod.py": "from models.cat import y\nfrom .sim import engine\n",  # core -> sim (relative)
    "arena_opt/cli.py": "from arena_opt.sim import engine\nimport runners.run\nPLUGINS = ['arena_opt.sim.cli']\n",
    "arena_opt/sim/__init__.py": "",
    "arena_opt/sim/cli.py": "from . import a\nfrom ..core_mod import y\n",          # cli -> sim, core: allowed
    "arena_opt/sim/engine.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from runners.run import R\n",
    "arena_opt/sim/a.py": "from . import b\n",
    "arena_opt/sim/b.py": "def g():\n    from arena_opt.sim.a import z\n",       # cycle a <-> b
    "arena_opt/profiling/__init__.py": "",
    "arena_opt/profiling/m.py": "from runners import run\nfrom arena_opt.sim import engine\n",  # allowed
    "arena_opt/policies/__init__.py": "REG = {'x': 'arena_opt.profiling.m:M'}\n",  # string: core -> profiling
    "runners/__init__.py": "",
    "runners/run.py": "from arena_opt.gone import x\nimport models.cat\n",  # a missing module
}


def test_checker_finds_upward_sibling_string_and_cycle_imports():
    problems = check(SYNTHETIC)
    text = "\n".join(problems)
    assert "models/bad.py:2: models.bad (models) imports arena_opt.core_mod (core)" in text
    assert "arena_opt/core_mod.py:2: arena_opt.core_mod (core) imports arena_opt.sim.engine (sim)" in text
    assert "arena_opt/sim/engine.py:3: arena_opt.sim.engine (sim) imports runners.run (runners)" in text
    assert ("arena_opt/policies/__init__.py:1: arena_opt.policies (core) imports arena_opt.profiling.m (profiling)"
            in text)
    assert "runners/run.py:1: runners.run imports arena_opt.gone, which is no module of the tree" in text
    cyc = [p for p in problems if p.startswith("import cycle")]
    assert cyc == ["import cycle between files: arena_opt.sim.a -> arena_opt.sim.b -> arena_opt.sim.a "
                   "(arena_opt/sim/a.py:1; arena_opt/sim/b.py:2)"]
    # allowed edges are not reported: cli -> anything, profiling -> runners and sim, runners -> core
    assert not [p for p in problems if p.startswith(("arena_opt/cli.py", "arena_opt/sim/cli.py",
                                                      "arena_opt/profiling/m.py", "runners/run.py:2"))]
    assert len(problems) == 6, text


def test_checker_passes_a_clean_tree_and_checks_packages():
    bad = ("models/bad.py", "arena_opt/core_mod.py", "arena_opt/sim/engine.py", "arena_opt/sim/b.py",
           "arena_opt/policies/__init__.py", "runners/run.py")
    clean = {p: "" if p in bad else s for p, s in SYNTHETIC.items()}
    assert check(clean) == []
    # a core module inside a package whose __init__ is the cli layer would run the CLI when imported
    assert check({"arena_opt/__init__.py": "", "arena_opt/cli/__init__.py": "", "arena_opt/cli/x.py": ""}) == [
        "arena_opt.cli.x (core) sits in package arena_opt.cli, whose __init__ is in layer cli: importing "
        "arena_opt.cli.x runs it"]


@pytest.mark.parametrize("module, layer", [
    ("models.layers", "models"), ("arena_opt", "core"), ("arena_opt.slurm.apply", "core"),
    ("arena_opt.sim.engine", "sim"), ("runners.live", "runners"), ("arena_opt.profiling.layers", "profiling"),
    ("runners.cli", "cli"), ("runners.slurm_cli", "cli")])
def test_layer_of(module, layer):
    assert layer_of(module) == layer
