"""Placement: map each chosen grid onto concrete nodes and GPU indices.

Kept jobs stay where they are; multi-node grids take whole free nodes, as few racks as
possible (networkx topology: cluster - rack - node); sub-node grids go best-fit into one
node, largest first, preferring the job's previous node. With power-of-two sizes this
packs whatever the level-1 packing constraints admit."""

from __future__ import annotations

from collections import defaultdict

import networkx as nx

from arena_opt.grids import Grid
from arena_opt.snapshot import ClusterSnapshot


class PlacementError(RuntimeError):
    pass


def topology(snapshot: ClusterSnapshot) -> nx.Graph:
    g = nx.Graph()
    g.add_node("cluster", kind="cluster")
    for n in snapshot.nodes:
        rack = f"rack:{n.rack or 'default'}"
        g.add_edge("cluster", rack)
        g.add_edge(rack, n.id)
        g.nodes[n.id].update(kind="node", gpu_type=n.gpu_type, num_gpus=n.num_gpus)
        for i in range(n.num_gpus):
            g.add_edge(n.id, (n.id, i))
    return g


def place(snapshot: ClusterSnapshot, chosen: dict[str, Grid]) -> dict[str, dict[str, list[int]]]:
    nodes = {n.id: n for n in snapshot.nodes}
    free: dict[str, list[int]] = {n.id: list(range(n.num_gpus)) for n in snapshot.nodes}
    jobs = {j.id: j for j in snapshot.jobs}
    out: dict[str, dict[str, list[int]]] = {}
    for jid, g in chosen.items():
        if g.current:
            placement = jobs[jid].running.placement
            for nid, gpus in placement.items():
                for i in gpus:
                    free[nid].remove(i)
            out[jid] = {nid: sorted(gs) for nid, gs in placement.items()}

    topo = topology(snapshot)
    rack_of = {n: next(r for r in topo.neighbors(n) if str(r).startswith("rack:")) for n in nodes}
    pool_nodes: dict[tuple, list[str]] = defaultdict(list)
    for n in snapshot.nodes:
        pool_nodes[(n.gpu_type, n.num_gpus, n.intra_link)].append(n.id)

    todo = [(jid, g) for jid, g in chosen.items() if not g.current]
    todo.sort(key=lambda x: (not x[1].multi_node, -x[1].num_gpus, x[0]))
    for jid, g in todo:
        prev = set(jobs[jid].running.placement) if jobs[jid].running else set()
        cands = pool_nodes[g.pool]
        if g.multi_node:
            whole = [n for n in cands if len(free[n]) == nodes[n].num_gpus]
            pick = _fewest_racks(whole, g.shape.nodes, rack_of, prev)
            if pick is None:
                raise PlacementError(f"job {jid}: needs {g.shape.nodes} free {g.pool[0]} nodes, "
                                     f"{len(whole)} are free")
            out[jid] = {}
            for n in pick:
                out[jid][n] = free[n][: g.shape.gpus_per_node]
                free[n] = free[n][g.shape.gpus_per_node:]
        else:
            fits = [n for n in cands if len(free[n]) >= g.num_gpus]
            if not fits:
                raise PlacementError(f"job {jid}: no {g.pool[0]} node has {g.num_gpus} free GPUs")
            best = min(fits, key=lambda n: (n not in prev, len(free[n]), n))
            out[jid] = {best: free[best][: g.num_gpus]}
            free[best] = free[best][g.num_gpus:]
    return out


def _fewest_racks(whole: list[str], k: int, rack_of: dict[str, str], prev: set[str]) -> list[str] | None:
    if len(whole) < k:
        return None
    by_rack: dict[str, list[str]] = defaultdict(list)
    for n in whole:
        by_rack[rack_of[n]].append(n)
    for r in by_rack.values():
        r.sort(key=lambda n: (n not in prev, n))
    # racks that can host the whole job first (smallest sufficient), then the fullest racks
    single = [r for r in by_rack.values() if len(r) >= k]
    if single:
        return min(single, key=len)[:k]
    pick: list[str] = []
    for r in sorted(by_rack.values(), key=len, reverse=True):
        pick.extend(r[: k - len(pick)])
        if len(pick) == k:
            break
    return pick
