"""Placement: map each chosen grid onto concrete nodes and GPU indices.

Kept jobs stay where they are; multi-node grids take whole free nodes, as few racks as
possible (networkx topology: cluster - rack - node); sub-node grids go best-fit into one
node, largest first, preferring the job's previous node. With power-of-two sizes this
packs whatever the level-1 packing constraints admit.

Given a `Contention` (arena_opt/contention.py), choices that are equally good for packing (nodes with
the same free count; racks with the same free whole nodes) go to the one with the lowest predicted
co-location slowdown, the rule above breaking ties; the contention then holds every placed job."""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache
from typing import Callable

import networkx as nx

from arena_opt.contention import Contention
from arena_opt.grids import Grid
from arena_opt.snapshot import ClusterSnapshot


class PlacementError(RuntimeError):
    pass


def topology(snapshot: ClusterSnapshot) -> nx.Graph:
    """cluster - rack - node tree; GPUs of a node share its links, so nodes are the leaves.
    The graph is shared between snapshots of the same nodes (a scheduler's every round): read only."""
    return _topology(_node_key(snapshot))


def rack_map(snapshot: ClusterSnapshot) -> dict[str, str]:
    """node id -> its rack in `topology` (shared like the graph: read only)."""
    return _rack_map(_node_key(snapshot))


def _node_key(snapshot: ClusterSnapshot) -> tuple[tuple[str, str | None, str, int], ...]:
    return tuple((n.id, n.rack, n.gpu_type, n.num_gpus) for n in snapshot.nodes)


@lru_cache(maxsize=8)
def _rack_map(nodes: tuple[tuple[str, str | None, str, int], ...]) -> dict[str, str]:
    topo = _topology(nodes)
    return {n[0]: next(iter(topo.neighbors(n[0]))) for n in nodes}


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

    def best_fit(self, k: int, prefer: set[str] = frozenset(), cost: Callable[[str], float] | None = None
                 ) -> str | None:
        """A preferred node with room (the fullest), else a node among the fullest with room: the first
        of them, or the first of the lowest `cost` (a cost of 0 cannot be beaten: the search stops)."""
        for c in range(k, self.g + 1):
            for n in prefer:
                if self.count.get(n) == c:
                    return n
        for c in range(k, self.g + 1):
            if self.bucket[c]:
                return next(iter(self.bucket[c])) if cost is None else _lowest(self.bucket[c], cost)
        return None

    def take(self, n: str, k: int) -> None:
        c = self.count[n]
        del self.bucket[c][n]
        self.count[n] = c - k
        self.bucket[c - k][n] = None


def place(snapshot: ClusterSnapshot, chosen: dict[str, Grid], contention: Contention | None = None
          ) -> dict[str, dict[str, list[int]]]:
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
            if contention is not None:
                contention.add(jid, g, out[jid])

    rack_of = rack_map(snapshot)
    pool_nodes: dict[tuple, list[str]] = defaultdict(list)
    for n in snapshot.nodes:
        pool_nodes[(n.gpu_type, n.num_gpus, n.intra_link)].append(n.id)
    index = {key: FreeIndex(ids, {n: len(free[n]) for n in ids}, key[1]) for key, ids in pool_nodes.items()}

    todo = [(jid, g) for jid, g in chosen.items() if not g.current]
    todo.sort(key=lambda x: (not x[1].multi_node, -x[1].num_gpus, x[0]))
    for jid, g in todo:
        prev = set(jobs[jid].running.placement) if jobs[jid].running else set()
        idx = index[g.pool]
        scored = contention is not None and contention.sensitive(jid, g)
        if g.multi_node:
            whole = idx.whole()
            rack_cost = (lambda r, jid=jid, g=g: contention.rack_cost(jid, g, r)) if scored else None
            pick = _fewest_racks(whole, g.shape.nodes, rack_of, prev, rack_cost)
            if pick is None:
                raise PlacementError(f"job {jid}: needs {g.shape.nodes} free {g.pool[0]} nodes, "
                                     f"{len(whole)} are free")
            out[jid] = {}
            for n in pick:
                out[jid][n] = free[n][: g.shape.gpus_per_node]
                free[n] = free[n][g.shape.gpus_per_node:]
                idx.take(n, g.shape.gpus_per_node)
        else:
            node_cost = (lambda n, jid=jid, g=g: contention.node_cost(jid, g, n)) if scored else None
            best = idx.best_fit(g.num_gpus, prev, node_cost)
            if best is None:
                raise PlacementError(f"job {jid}: no {g.pool[0]} node has {g.num_gpus} free GPUs")
            out[jid] = {best: free[best][: g.num_gpus]}
            free[best] = free[best][g.num_gpus:]
            idx.take(best, g.num_gpus)
        if contention is not None:
            contention.add(jid, g, out[jid])
    return out


def _lowest(items, cost: Callable[[str], float]):
    """The first item of the lowest cost, in the order given; stops at the first cost of 0."""
    best, best_c = None, float("inf")
    for x in items:
        c = cost(x)
        if c < best_c:
            best, best_c = x, c
            if c <= 0.0:
                break
    return best


def _fewest_racks(whole: list[str], k: int, rack_of: dict[str, str], prev: set[str],
                  rack_cost: Callable[[str], float] | None = None) -> list[str] | None:
    """k whole nodes in as few racks as possible: the smallest rack that holds them all, else the racks
    with the most free nodes. Racks with as many free nodes as the last one taken are interchangeable
    for packing: with `rack_cost` (a spanning job crosses each taken rack's uplink) the cheapest go first."""
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
    order = sorted(by_rack, key=lambda r: len(by_rack[r]), reverse=True)
    if rack_cost is not None:
        order = _cheapest_ties(order, k, by_rack, rack_cost)
    pick: list[str] = []
    for r in order:
        pick.extend(by_rack[r][: k - len(pick)])
        if len(pick) == k:
            break
    return pick


def _cheapest_ties(order: list[str], k: int, by_rack: dict[str, list[str]], rack_cost) -> list[str]:
    """`order` (racks by free nodes, descending) with the racks as free as the last one the job needs
    sorted by cost (stable: equal costs keep the order); unchanged when the job takes all of them."""
    need, taken = k, 0
    for taken, r in enumerate(order, 1):
        need -= len(by_rack[r])
        if need <= 0:
            break
    last = len(by_rack[order[taken - 1]])
    first = next(i for i, r in enumerate(order) if len(by_rack[r]) == last)
    end = first
    while end < len(order) and len(by_rack[order[end]]) == last:
        end += 1
    if end <= taken:
        return order
    return order[:first] + sorted(order[first:end], key=rack_cost) + order[end:]
