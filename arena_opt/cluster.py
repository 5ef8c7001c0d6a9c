"""Cluster specs for the simulator: a snapshot without jobs.

`--cluster` accepts
- inline `TYPE:NODESxGPUS[,...]`, e.g. `a100:4x8,a40:8x2`;
- a ClusterSnapshot JSON (`{"nodes": [...], "gpu_catalog": {...}}`, no jobs);
- our compact JSON: `{"gpus": {"a100": {"nodes": 80, "gpus_per_node": 4}, ...}}` with optional
  `intra_link` ("nvlink"/"pcie") and `nodes_per_rack` per type, and an optional `gpu_catalog`;
- Arena's `cluster_spec_derived.json` as it is (`{"gpu_types": {"a100": {"node_num": 80,
  "gpus_per_node": 4, ...}}}`), its nodes' intra-node links as `ARENA_INTRA_LINKS` says.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, PositiveInt, ValidationError

from arena_opt.edge import EdgeModel
from arena_opt.errors import InputError
from arena_opt.gpus import GpuSpec, canonical_gpu
from arena_opt.io import load_json
from arena_opt.snapshot import MAX_GPUS_PER_NODE, MAX_NODES, ClusterSnapshot, Node

# The intra-node link of Arena's testbed where it is not the catalog's. Arena's spec names no link; its
# own per-plan estimates of the same testbed do (arena_estimated, pp = tp = 1, one node of two GPUs): the
# dp gradient all-reduce runs at 6.5 GB/s of fp16 gradient on the A40s, 7 on the PCIe-only A10s and 29 on
# the A100s, so its A40 pairs have no NVLink bridge. Wherever Arena's cluster or measurements are priced
# (its spec read here, the calibration on its table in bench/estimator.py) the same links apply.
ARENA_INTRA_LINKS: dict[str, Literal["nvlink", "pcie"]] = {"a40": "pcie"}

_INLINE = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*:\s*(\d+)\s*[xX]\s*(\d+)\s*$")


class NodeGroup(EdgeModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    nodes: PositiveInt = Field(le=MAX_NODES)
    gpus_per_node: PositiveInt = Field(le=MAX_GPUS_PER_NODE)
    intra_link: Literal["nvlink", "pcie"] | None = None
    nodes_per_rack: PositiveInt | None = None


class CompactSpec(EdgeModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str | None = None
    description: str | None = None
    gpus: dict[str, NodeGroup] = Field(min_length=1)
    gpu_catalog: dict[str, GpuSpec] = Field(default_factory=dict)


class _ArenaType(EdgeModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    node_num: PositiveInt
    gpus_per_node: PositiveInt


class ArenaSpec(EdgeModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    gpu_types: dict[str, _ArenaType] = Field(min_length=1)


def build_nodes(groups: dict[str, NodeGroup]) -> list[Node]:
    nodes = []
    for gtype, g in groups.items():
        t = canonical_gpu(gtype)
        width = max(3, len(str(g.nodes - 1)))
        for i in range(g.nodes):
            rack = None if g.nodes_per_rack is None else f"{t}-r{i // g.nodes_per_rack}"
            nodes.append(Node(id=f"{t}-{i:0{width}d}", gpu_type=t, num_gpus=g.gpus_per_node,
                              intra_link=g.intra_link, rack=rack))
    return nodes


def load_cluster(spec: str | Path) -> ClusterSnapshot:
    """A job-free ClusterSnapshot from an inline spec or a JSON file (see module doc)."""
    text = str(spec)
    if not Path(text).exists() and ":" in text and not text.lower().endswith(".json"):
        return _inline(text)
    path = Path(text)
    if not path.is_file():
        raise InputError(f"{path}: cluster spec not found (give a JSON file or TYPE:NODESxGPUS,...)")
    data = load_json(path, "cluster spec")
    if isinstance(data, list) and len(data) == 1 and isinstance(data[0], dict):
        data = data[0]
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object")
    try:
        if "nodes" in data and isinstance(data["nodes"], list):
            if data.get("jobs"):
                raise InputError(f"{path}: a cluster spec must not contain jobs ({len(data['jobs'])} found)")
            return _validated(path, ClusterSnapshot.model_validate({**data, "jobs": []}))
        if "gpus" in data:
            c = CompactSpec.model_validate(data)
            return _validated(path, ClusterSnapshot(nodes=build_nodes(c.gpus), gpu_catalog=c.gpu_catalog))
        if "gpu_types" in data:
            a = ArenaSpec.model_validate(data)
            groups = {t: NodeGroup(nodes=v.node_num, gpus_per_node=v.gpus_per_node,
                                   intra_link=ARENA_INTRA_LINKS.get(canonical_gpu(t)))
                      for t, v in a.gpu_types.items()}
            return _validated(path, ClusterSnapshot(nodes=build_nodes(groups)))
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(map(str, err["loc"])) or "spec"
        raise InputError(f"{path}: field {loc}: {err['msg']} (value {err.get('input')!r})") from None
    if all(isinstance(v, dict) and "node_num" in v for v in data.values()):
        raise InputError(f"{path}: Arena's sim_cluster_spec.json has no GPUs per node; use "
                         f"cluster_spec_derived.json or our format {{\"gpus\": {{TYPE: {{\"nodes\": N, "
                         f"\"gpus_per_node\": G}}}}}}")
    raise InputError(f"{path}: unknown cluster spec format (expected keys `gpus`, `nodes` or `gpu_types`)")


def _validated(path: Path, snap: ClusterSnapshot) -> ClusterSnapshot:
    if not snap.nodes:
        raise InputError(f"{path}: cluster has no nodes")
    return snap


def parse_inline(text: str, flag: str = "--cluster") -> dict[str, NodeGroup]:
    """`TYPE:NODESxGPUS[,...]` -> node groups by canonical GPU type; a type given twice is an error
    (keeping the last one would silently drop nodes)."""
    groups: dict[str, NodeGroup] = {}
    for part in text.split(","):
        m = _INLINE.match(part)
        if not m:
            raise InputError(f"{flag}: cannot read {part.strip()!r}; expected TYPE:NODESxGPUS, e.g. a100:4x8")
        t, n, g = canonical_gpu(m.group(1)), int(m.group(2)), int(m.group(3))
        if n < 1 or g < 1:
            raise InputError(f"{flag}: {part.strip()!r} needs at least one node and one GPU per node")
        if t in groups:
            raise InputError(f"{flag}: GPU type {t!r} is given twice ({part.strip()!r}); give each type once, "
                             f"nodes of one type share one shape")
        try:
            groups[t] = NodeGroup(nodes=n, gpus_per_node=g)
        except ValidationError as e:
            err = e.errors()[0]
            raise InputError(f"{flag}: {part.strip()!r}: {err['loc'][0]} {err['msg']} (value {err['input']})") \
                from None
    return groups


def _inline(text: str) -> ClusterSnapshot:
    groups = parse_inline(text)
    try:
        return ClusterSnapshot(nodes=build_nodes(groups))
    except ValidationError as e:
        err = e.errors()[0]
        raise InputError(f"--cluster: {err['msg']}") from None


def describe(snapshot: ClusterSnapshot) -> str:
    by: dict[tuple[str, int], int] = {}
    for n in snapshot.nodes:
        by[(n.gpu_type, n.num_gpus)] = by.get((n.gpu_type, n.num_gpus), 0) + 1
    total = sum(n.num_gpus for n in snapshot.nodes)
    return ", ".join(f"{c}x{g} {t}" for (t, g), c in sorted(by.items())) + f" ({total} GPUs)"
