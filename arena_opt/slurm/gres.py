"""Slurm's text encodings inside its JSON: host lists (`n[1-3,7]`), GRES strings
(`gpu:a100:4(S:0-1)`, `gpu:a100:2(IDX:0,2-3)`, `gres:gpu:a100:2`, `gres/gpu:a100:2`) and the
map from GRES type names to the GPU catalog.

GPU map: a site file (`--gpu-map FILE`, else $ARENA_OPT_GPU_MAP, else /etc/arena-opt/gpu-map.json
when it exists) is a JSON object {"GRES type": "catalog GPU name"}; it is consulted first, then
the built-in names below, then the catalog's own names. A type with no match, or whose family
matches several catalog GPUs (`a100-sxm4`: 40 or 80 GB?), is an error naming node, GRES and choices.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from arena_opt.errors import InputError
from arena_opt.gpus import GPU_ALIASES

DEFAULT_GPU_MAP_PATH = Path("/etc/arena-opt/gpu-map.json")
GPU_MAP_ENV = "ARENA_OPT_GPU_MAP"

# common GRES spellings (lower case, '_' read as '-') -> catalog name
BUILTIN_GPU_MAP: dict[str, str] = {
    **GPU_ALIASES,  # a100 -> a100-40gb, v100 -> v100-32gb, h100 -> h100-80gb (Arena's names)
    "a100-40g": "a100-40gb", "a100-pcie-40gb": "a100-40gb", "a100-sxm4-40gb": "a100-40gb",
    "a100-80g": "a100-80gb", "a100-pcie-80gb": "a100-80gb", "a100-sxm4-80gb": "a100-80gb", "a100l": "a100-80gb",
    "v100-32g": "v100-32gb", "v100-sxm2-32gb": "v100-32gb", "v100s": "v100-32gb",
    "h100-80g": "h100-80gb", "h100-sxm5-80gb": "h100-80gb", "h100-pcie-80gb": "h100-80gb",
    "h200-141gb": "h200", "a40-48gb": "a40", "a10-24gb": "a10", "l20-48gb": "l20",
}


class SlurmFormatError(InputError):
    """Output of a Slurm command that cannot be read; names the command and the field."""


def expand_hostlist(text: str) -> list[str]:
    """`n[1-3,07],gpu-a[01-02]x` -> [n1, n2, n3, n07, gpu-a01x, gpu-a02x] (zero padding kept)."""
    out: list[str] = []
    for part in _split_top(text.strip()):
        if not part:
            continue
        m = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\](.*)", part)
        if m is None:
            if "[" in part or "]" in part:
                raise ValueError(f"cannot read host list {text!r}")
            out.append(part)
            continue
        prefix, ranges, rest = m.groups()
        for tail in expand_hostlist(rest) if rest else [""]:
            for r in ranges.split(","):
                a, _, b = r.partition("-")
                if not a.isdigit() or (b and not b.isdigit()):
                    raise ValueError(f"cannot read host list {text!r}")
                width = len(a)
                for i in range(int(a), int(b or a) + 1):
                    out.append(f"{prefix}{i:0{width}d}{tail}")
    return out


def _split_top(text: str, brackets: str = "[]") -> list[str]:
    """Split at commas outside brackets (`n[1-2],m` / `gpu:a100:4(S:0-1),nvme:1`)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == brackets[0]) - (ch == brackets[1])
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def parse_index_list(text: str) -> list[int]:
    """`0-1,3` -> [0, 1, 3]; `N/A` -> []."""
    text = text.strip()
    if text in ("", "N/A"):
        return []
    out: list[int] = []
    for r in text.split(","):
        a, _, b = r.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


@dataclass(frozen=True)
class Gres:
    name: str  # "gpu"
    type: str | None  # "a100"; None = untyped
    count: int
    indices: tuple[int, ...] | None = None  # from (IDX:...); None = not given


_GRES = re.compile(r"^(?:gres[:/])?(?P<name>[A-Za-z0-9_.-]+)(?::(?P<type>[^:()]+))?(?::(?P<count>\d+[KMG]?))?"
                   r"(?:\((?P<extra>[^)]*)\))?$")


def parse_gres(text: str | None) -> list[Gres]:
    """A GRES list: `gpu:a100:4(S:0-1),nvme:1` or `gpu:a100:2(IDX:0-1)`; `(null)`, `N/A` or empty = none.
    The count may be absent (`gpu:a100` = 1); a type that is all digits is the count (`gpu:2`)."""
    if text is None:
        return []
    text = text.strip()
    if text in ("", "(null)", "N/A"):
        return []
    out = []
    for part in [p for p in _split_top(text, "()") if p.strip()]:
        m = _GRES.match(part.strip())
        if m is None:
            raise ValueError(f"cannot read GRES {part!r}")
        name, typ, count, extra = m["name"], m["type"], m["count"], m["extra"]
        if typ is not None and count is None and typ.isdigit():
            typ, count = None, typ
        n = _count(count) if count is not None else 1
        idx = None
        if extra:
            for item in extra.split(")("):
                k, _, v = item.partition(":")
                if k == "IDX":
                    idx = tuple(parse_index_list(v))
        out.append(Gres(name, typ, n, idx))
    return out


def _count(text: str) -> int:
    mult = {"K": 1024, "M": 1024**2, "G": 1024**3}
    return int(text[:-1]) * mult[text[-1]] if text[-1] in mult else int(text)


def gpus_of(gres: list[Gres]) -> list[Gres]:
    return [g for g in gres if g.name == "gpu"]


# ---------------------------------------------------------------------------- GPU map


def _norm(name: str) -> str:
    n = name.strip().lower().replace("_", "-")
    for prefix in ("nvidia-", "tesla-"):
        if n.startswith(prefix):
            n = n[len(prefix):]
    return n


@dataclass(frozen=True)
class GpuMap:
    """GRES type -> catalog GPU name; `site` entries win over the built-in ones."""

    site: dict[str, str]
    source: str | None = None

    @classmethod
    def load(cls, path: str | Path | None = None) -> "GpuMap":
        """`path`, else $ARENA_OPT_GPU_MAP, else the default path when it exists, else built-ins only."""
        if path is None:
            env = os.environ.get(GPU_MAP_ENV)
            path = Path(env) if env else (DEFAULT_GPU_MAP_PATH if DEFAULT_GPU_MAP_PATH.is_file() else None)
        if path is None:
            return cls({})
        p = Path(path)
        try:
            raw = json.loads(p.read_text())
        except FileNotFoundError:
            raise InputError(f"{p}: GPU map file not found") from None
        except json.JSONDecodeError as e:
            raise InputError(f"{p}: malformed JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
        if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
            raise InputError(f"{p}: expected a JSON object of GRES type -> catalog GPU name strings")
        return cls({_norm(k): v for k, v in raw.items()}, str(p))

    def resolve(self, gres_type: str | None, catalog: dict, node: str, gres_text: str) -> str:
        """The catalog name of a node's GRES type, or an InputError naming node, GRES and choices."""
        choices = ", ".join(sorted(catalog))
        if gres_type is None:
            raise InputError(f"node {node}: GRES {gres_text!r} has no GPU type; give the node a typed GRES "
                             f"(gpu:TYPE:N) naming one of: {choices}")
        n = _norm(gres_type)
        if n in self.site:
            target = self.site[n].strip().lower()
            if target not in catalog:
                raise InputError(f"{self.source}: GRES type {gres_type!r} maps to unknown GPU {target!r}; "
                                 f"choices: {choices}")
            return target
        for cand in (BUILTIN_GPU_MAP.get(n), n):
            if cand is not None and cand in catalog:
                return cand
        family = n.split("-")[0]
        same = sorted(c for c in catalog if c.split("-")[0] == family)
        mem = re.search(r"(\d+)g(?:b)?\b", n)
        if mem:
            same = [c for c in same if re.search(rf"\b{mem.group(1)}gb\b", c)] or same
        if len(same) == 1:
            return same[0]
        hint = f"(a site GPU map, --gpu-map or {DEFAULT_GPU_MAP_PATH}, can name it)"
        if same:
            raise InputError(f"node {node}: GRES {gres_text!r}: GPU type {gres_type!r} is ambiguous: "
                             f"{', '.join(same)} {hint}")
        raise InputError(f"node {node}: GRES {gres_text!r}: unknown GPU type {gres_type!r}; choices: {choices} "
                         f"{hint}")

    def gres_name(self, gpu_type: str) -> str:
        """A GRES type name for a catalog GPU (the dry run's sbatch script, where no node names one)."""
        for k, v in self.site.items():
            if v == gpu_type:
                return k
        for k, v in BUILTIN_GPU_MAP.items():
            if v == gpu_type and "-" not in k:
                return k
        return gpu_type
