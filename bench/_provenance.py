"""What made a result in bench/results: the command, the commit, and a hash of every file the bench can run.

A bench records, when it writes its results, the files its script reaches by import (arena_opt.sourcetree's
walk over arena_opt/, models/, runners/ and bench/, string module names such as `python -m arena_opt.cli`
included, so code a bench runs in a child process counts) plus every repository module loaded in the process,
each with its hash; the repository files it read (`inputs`) and the files it wrote (`outputs`) with theirs.
`check` recomputes the hashes of the working files: a result is stale when any of them moved, and the check
names the file and the command that remakes the result. Working-file hashes need no git history, so a clean
clone (CI) checks the same way.

A Python file's hash is of its syntax tree without docstrings (a comment, a docstring or formatting changes
no result, so they force no rerun); every other file's is git's blob hash (`git hash-object`).
This module and arena_opt/sourcetree.py record results and measure nothing: they are not part of any
result's code.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from arena_opt.sourcetree import module_name, reachable, sources

ROOT = Path(__file__).resolve().parent.parent
RESULTS = "bench/results"
TREE = ("arena_opt", "models", "runners", "bench")
DATA_SUFFIXES = (".json", ".toml", ".yaml", ".csv")
RECORDERS = frozenset({"bench/_provenance.py", "arena_opt/sourcetree.py"})
_STARTED = time.monotonic()  # imported at a bench's start (through _perf_common or directly)
_LOAD_AT_START = os.getloadavg()


def _canon(node) -> str:
    # ast.dump's text differs between Python versions (3.12 adds empty type_params, 3.13 drops empty
    # fields): empty fields are left out here, so one tree hashes alike on every version
    if isinstance(node, ast.AST):
        fields = ((f, _canon(getattr(node, f, None))) for f in node._fields)
        return f"{type(node).__name__}({','.join(f'{f}={v}' for f, v in fields if v not in ('None', '[]'))})"
    if isinstance(node, list):
        return f"[{','.join(_canon(n) for n in node)}]"
    return repr(node)


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:]
    return tree


def file_hash(path: Path) -> str:
    data = path.read_bytes()
    if path.suffix == ".py":
        try:
            tree = _strip_docstrings(ast.parse(data, filename=str(path)))
            return "py:" + hashlib.sha1(_canon(tree).encode()).hexdigest()
        except SyntaxError:
            pass  # not Python this interpreter reads: its bytes, then
    return "blob:" + hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _rel(path: str | Path) -> str:
    """A path relative to the repository root when it lies inside, else absolute."""
    p = Path(path).resolve()
    try:
        return p.relative_to(ROOT).as_posix()
    except ValueError:
        return str(p)


def code_files(script: str | Path, loaded: bool = True) -> list[str]:
    """Repository files a bench script can run: its import closure, plus (`loaded`) the tree's modules this
    process has loaded (a bench's process: whatever it imported by a name the walk cannot see)."""
    tree = sources(ROOT, TREE)
    # bench scripts import their siblings by bare name (`from _perf_common import ...`)
    aliases = {module_name(p).split(".")[-1]: module_name(p) for p in tree if p.startswith("bench/")}
    files = set(reachable(_rel(script), tree, TREE, aliases, stop=RECORDERS))
    for mod in list(sys.modules.values()) if loaded else ():
        f = getattr(mod, "__file__", None)
        if f and (r := _rel(f)) in tree and r not in RECORDERS:
            files.add(r)
    return sorted(files | package_data(files))


def package_data(files: set[str]) -> set[str]:
    """The data files shipped beside the package modules among `files` (arena_opt/perf/band.json): the
    code reads them by path, which no import walk sees, and a result depends on them as on code."""
    out = set()
    for d in {Path(f).parent for f in files if f.endswith(".py") and not f.startswith("bench/")}:
        for p in (ROOT / d).iterdir():
            if p.is_file() and p.suffix in DATA_SUFFIXES and not p.name.startswith("."):
                out.add(_rel(p))
    return out


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def uncommitted(files: list[str]) -> list[str]:
    """Those of `files` whose working copy differs from the commit's (git's view: formatting counts)."""
    if not files:
        return []
    try:  # not _git: its strip() would eat the status column of the first line
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", *files], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return sorted(ln[3:].split(" -> ")[-1] for ln in out.splitlines() if ln[3:])


def command() -> str:
    """The command line that reruns this bench from the repository root."""
    return " ".join(shlex.quote(a) for a in ["python", _rel(sys.modules["__main__"].__file__), *sys.argv[1:]])


def git_rev(short: bool = True) -> str | None:
    return _git("rev-parse", *(["--short"] if short else []), "HEAD")


def machine() -> dict:
    info = {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(), "host": platform.node()}
    try:
        with open("/proc/cpuinfo") as f:
            models = {ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")}
        if models:
            info["cpu_model"] = ", ".join(sorted(models))
    except OSError:
        pass
    if "torch" in sys.modules:  # only where the bench used it: importing torch costs 2 s
        torch = sys.modules["torch"]
        info["torch"] = torch.__version__
        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return info


def record(into: Path, written: list[Path] = (), inputs: list[str | Path] = ()) -> dict:
    """The provenance of the run now ending, for the result file `into` (written after this record, so
    its own hash is None), beside the files `written` before it, after reading `inputs`."""
    script = Path(sys.modules["__main__"].__file__)
    code = code_files(script)
    return {
        "command": command(),
        "argv": [_rel(script), *sys.argv[1:]],
        "commit": git_rev(short=False),
        # the code files that differed from the commit (named: a bench rerun after a regenerated data file
        # is told apart from one on edited code)
        "uncommitted": (changed := uncommitted(code)),
        "dirty": bool(changed),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - _STARTED, 1),
        "load_avg_start": [round(x, 2) for x in _LOAD_AT_START],
        "load_avg_end": [round(x, 2) for x in os.getloadavg()],
        "machine": machine(),
        "plan_cache": os.environ.get("ARENA_OPT_CACHE"),
        "code": {f: file_hash(ROOT / f) for f in code},
        "inputs": {_rel(p): file_hash(Path(p)) for p in inputs},
        "outputs": {_rel(into): None, **{_rel(p): file_hash(Path(p)) for p in written}},
    }


def write_result(path: Path, payload: dict, markdown: str | None = None, written: list[Path] = (),
                 inputs: list[str | Path] = (), **json_kw) -> dict:
    """Write a bench's result: the Markdown beside `path` (ending with the provenance line) first, then the
    JSON with the provenance of both and of `written` (files the bench wrote itself) last, each atomically:
    a run that fails leaves the old JSON, whose recorded hashes then flag a half-written set."""
    from arena_opt.io import atomic_write, write_json

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rec = record(path, written, inputs)
    if markdown is not None:
        md = path.with_suffix(".md")
        atomic_write(md, markdown.rstrip("\n") + "\n" + footer(rec))
        rec["outputs"][_rel(md)] = file_hash(md)
    write_json(path, {**payload, "provenance": rec}, **json_kw)
    return rec


def footer(rec: dict) -> str:
    """The line every Markdown result ends with."""
    return (f"\n---\nMade by `{rec['command']}` at commit {(rec['commit'] or 'unknown')[:10]}"
            f"{_uncommitted_note(rec)}, {rec['date']}, {rec['seconds']:.0f} s, "
            f"load average {rec['load_avg_start'][0]:.2f} at the start, {rec['load_avg_end'][0]:.2f} at the end; freshness: tests/test_bench_fresh.py.\n")


def _uncommitted_note(rec: dict) -> str:
    if not rec.get("dirty"):
        return ""
    names = rec.get("uncommitted") or []
    if not names:  # a record from before the files were named
        return " (uncommitted changes)"
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f" (uncommitted: {', '.join(names[:3])}{more})"


# --- the check ------------------------------------------------------------------------------------------------

def records(results: Path | None = None) -> dict[str, dict]:
    """{result file: its provenance} for every JSON result that carries one."""
    out = {}
    for p in sorted((results or ROOT / RESULTS).glob("*.json")):
        try:
            data = json.loads(p.read_text())
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("provenance"), dict):
            out[_rel(p)] = data["provenance"]
    return out


def problems(results: Path | None = None) -> dict[str, list[str]]:
    """{result file: why it is not fresh} for every file of bench/results that is stale or unaccounted for;
    files that are fresh are left out."""
    results = results or ROOT / RESULTS
    recs = records(results)
    owner: dict[str, str] = {}
    out: dict[str, list[str]] = {}
    for name, rec in recs.items():
        why = []
        for f, h in rec.get("code", {}).items():
            p = ROOT / f
            if not p.is_file():
                why.append(f"{f} is gone")
            elif file_hash(p) != h:
                why.append(f"{f} changed")
        for f, h in rec.get("inputs", {}).items():
            p = ROOT / f if not Path(f).is_absolute() else Path(f)
            if p.is_file() and file_hash(p) != h:  # inputs outside the tree (Arena's data) count where present
                why.append(f"input {f} changed")
            elif not p.is_file() and not Path(f).is_absolute():
                why.append(f"input {f} is gone")
        for f, h in rec.get("outputs", {}).items():
            owner[f] = name
            p = ROOT / f
            if f != name and (not p.is_file() or file_hash(p) != h):
                why.append(f"{f} is not the file this run wrote")
        if name not in rec.get("outputs", {}):
            why.append(f"written elsewhere ({', '.join(rec.get('outputs', {})) or 'no outputs'}) and copied here")
        if why:
            out[name] = why
    for p in sorted(results.iterdir()):
        if p.is_file() and _rel(p) not in owner and _rel(p) not in out:
            out[_rel(p)] = ["records no provenance (no result's provenance names it)"]
    return out


def command_of(name: str, recs: dict[str, dict] | None = None) -> str | None:
    recs = records() if recs is None else recs
    for rname, rec in recs.items():
        if name == rname or name in rec.get("outputs", {}):
            return rec["command"]
    return None
