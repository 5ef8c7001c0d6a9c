"""Placement: map each chosen grid onto concrete nodes and GPU indices.

Kept jobs stay where they are; multi-node grids take whole free nodes, as few racks as
possible (networkx topology: cluster - rack - node); sub-node grids go best-fit into one
node, largest first, preferring the job's previous node. With power-of-two sizes this
packs whatever the level-1 packing constraints admit."""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache

import networkx as nx

from arena_opt.grids import Grid
from arena_opt.snapshot import ClusterSnapshot


class PlacementError(RuntimeError):
    pass


def topology(snapshot: ClusterSnapshot) -> nx.Graph:
    """cluster - rack - node tree; GPUs of a node share its links, so nodes are the leaves.
    The graph is shared between snapshots of the same nodes (a scheduler's every round): read only."""
    return _topology(tuple((n.id, n.rack, n.gpu_type, n.num_gpus) for n in snapshot.nodes))


@lru_cache(maxsize=8)
def _topology(nodes: tuple[tuple[str, str | None, str, int], ...]) -> nx.Graph:
    g = nx.Graph()
    g.add_node("cluster", kind="cluster")
    racks = {f"rack:{rack or 'default'}" for _, rack, _, _ in nodes}
    g.add_edges_from(("cluster", r) for r in racks)
    g.add_edges_from((f"rack:{rack or 'default'}", nid) for nid, rack, _, _ in nodes)
    for nid, _, gpu_type, num_gpus in nodes:
        g.nodes[nid].update(kind="node", gpu_type=gpu_type, num_gpus=num_gpus)
    nx.freeze(g)
    return g


class FreeIndex:
    """Free GPU count of every node of a pool, bucketed by count, for O(GPUs per node) best fit."""

    def __init__(self, node_ids: list[str], free_counts: dict[str, int], gpus_per_node: int):
        self.g = gpus_per_node
        self.bucket: list[dict[str, None]] = [dict() for _ in range(gpus_per_node + 1)]  # ordered sets
        self.count: dict[str, int] = {}
        for n in node_ids:
            self.count[n] = free_counts[n]
            self.bucket[free_counts[n]][n] = None

    def whole(self) -> list[str]:
        return list(self.bucket[self.g])

    def best_fit(self, k: int, prefer: set[str] = frozenset()) -> str | None:
        for c in range(k, self.g + 1):
            for n in prefer:
                if self.count.get(n) == c:
                    return n
        for c in range(k, self.g + 1):
            if self.bucket[c]:
                return next(iter(self.bucket[c]))
        return None

    def take(self, n: str, k: int) -> None:
        c = self.count[n]
        del self.bucket[c][n]
        self.count[n] = c - k
        self.bucket[c - k][n] = None


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
    rack_of = {n: next(iter(topo.neighbors(n))) for n in nodes}
    pool_nodes: dict[tuple, list[str]] = defaultdict(list)
    for n in snapshot.nodes:
        pool_nodes[(n.gpu_type, n.num_gpus, n.intra_link)].append(n.id)
    index = {key: FreeIndex(ids, {n: len(free[n]) for n in ids}, key[1]) for key, ids in pool_nodes.items()}

    todo = [(jid, g) for jid, g in chosen.items() if not g.current]
    todo.sort(key=lambda x: (not x[1].multi_node, -x[1].num_gpus, x[0]))
    for jid, g in todo:
        prev = set(jobs[jid].running.placement) if jobs[jid].running else set()
        idx = index[g.pool]
        if g.multi_node:
            whole = idx.whole()
            pick = _fewest_racks(whole, g.shape.nodes, rack_of, prev)
            if pick is None:
                raise PlacementError(f"job {jid}: needs {g.shape.nodes} free {g.pool[0]} nodes, "
                                     f"{len(whole)} are free")
            out[jid] = {}
            for n in pick:
                out[jid][n] = free[n][: g.shape.gpus_per_node]
                free[n] = free[n][g.shape.gpus_per_node:]
                idx.take(n, g.shape.gpus_per_node)
        else:
            best = idx.best_fit(g.num_gpus, prev)
            if best is None:
                raise PlacementError(f"job {jid}: no {g.pool[0]} node has {g.num_gpus} free GPUs")
            out[jid] = {best: free[best][: g.num_gpus]}
            free[best] = free[best][g.num_gpus:]
            idx.take(best, g.num_gpus)
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
