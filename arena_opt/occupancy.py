"""Occupancy: the free GPUs of every node, and the one set of rules that finds room for a grid.

Every placer uses it: `placement.place` (a decision's chosen grids), the baselines while they decide
(they reason about concrete free GPUs, like the schedulers they reproduce) and the MILP's greedy
fallback (on the problem's per-node free counts). The rules of `find`:

- kept jobs stay: what the caller holds is never moved by a find;
- a multi-node grid takes whole free nodes, in as few racks as possible: the smallest rack that holds
  all of them, else the racks with the most free whole nodes; the job's previous nodes first in a rack;
- a sub-node grid goes best-fit into one node: the fullest of the job's previous nodes with room,
  else a node with the fewest free GPUs that still fit;
- among choices equally good for packing (nodes with the same free count, racks with the same free
  whole nodes) a `Contention` picks the lowest predicted co-location slowdown; then the node whose
  free count changed least recently goes first (snapshot order before any change);
- GPU indices: the lowest free ones of the node.

With power-of-two sizes placed largest first this packs whatever the level-1 packing constraints
admit. `hold` / `release` change the state with incremental counts (per node, per pool, and per free
count for best fit); `mark` / `rollback` undo every change after a mark, exactly."""

from __future__ import annotations

import heapq
from collections import defaultdict
from functools import lru_cache
from itertools import count
from typing import TYPE_CHECKING, Callable, Iterable

from arena_opt.contention import Contention
from arena_opt.grids import Grid
from arena_opt.snapshot import ClusterSnapshot

if TYPE_CHECKING:
    import networkx as nx

Placement = dict[str, list[int]]


def topology(snapshot: ClusterSnapshot) -> nx.Graph:
    """cluster - rack - node tree; GPUs of a node share its links, so nodes are the leaves.
    The graph is shared between snapshots of the same nodes (a scheduler's every round): read only."""
    return _topology(_node_key(snapshot))


def rack_map(snapshot: ClusterSnapshot) -> dict[str, str]:
    """node id -> its rack in `topology` (shared like the graph: read only)."""
    return _rack_map(_node_key(snapshot))


_last_key: list = [None, None]  # (node list, its key): a scheduler's every round has the same list


def _node_key(snapshot: ClusterSnapshot) -> tuple[tuple[str, str | None, str, int, str | None], ...]:
    if _last_key[0] is not snapshot.nodes:
        _last_key[:] = [snapshot.nodes, tuple((n.id, n.rack, n.gpu_type, n.num_gpus, n.intra_link)
                                              for n in snapshot.nodes)]
    return _last_key[1]


def _rack_of(rack: str | None) -> str:
    return f"rack:{rack or 'default'}"


@lru_cache(maxsize=8)
def _rack_map(nodes: tuple) -> dict[str, str]:
    # each node's one neighbour in `topology`, without building it: networkx costs every CLI call 0.3 s
    # to import
    return {n[0]: _rack_of(n[1]) for n in nodes}


@lru_cache(maxsize=8)
def _topology(nodes: tuple) -> nx.Graph:
    import networkx as nx

    g = nx.Graph()
    g.add_node("cluster", kind="cluster")
    racks = {_rack_of(n[1]) for n in nodes}
    g.add_edges_from(("cluster", r) for r in racks)
    g.add_edges_from((_rack_of(n[1]), n[0]) for n in nodes)
    for nid, _, gpu_type, num_gpus, _ in nodes:
        g.nodes[nid].update(kind="node", gpu_type=gpu_type, num_gpus=num_gpus)
    nx.freeze(g)
    return g


class Layout:
    """What does not change between rounds: the nodes of every pool (in order), GPUs per node, racks."""

    def __init__(self, pools: dict[tuple, tuple[list[str], int]], rack_of: dict[str, str] | None = None):
        self.pools = {key: (tuple(ids), g) for key, (ids, g) in pools.items()}
        self.where = {nid: (key, i) for key, (ids, _) in self.pools.items() for i, nid in enumerate(ids)}
        self.rack_of = rack_of if rack_of is not None else defaultdict(lambda: "rack:default")
        self._racks: dict[tuple, tuple[str, ...]] = {}

    def racks(self, key: tuple) -> tuple[str, ...]:
        """The rack of each node of a pool, in pool order (made once per layout)."""
        got = self._racks.get(key)
        if got is None:
            got = self._racks[key] = tuple(self.rack_of[n] for n in self.pools[key][0])
        return got

    @staticmethod
    def of(snapshot: ClusterSnapshot) -> "Layout":
        """The snapshot's pools (same GPU type, GPUs per node and intra-node link), shared between
        snapshots of the same nodes: read only."""
        return _layout(_node_key(snapshot))


@lru_cache(maxsize=8)
def _layout(nodes: tuple) -> Layout:
    pools: dict[tuple, tuple[list[str], int]] = {}
    for nid, _, gpu_type, num_gpus, link in nodes:
        pools.setdefault((gpu_type, num_gpus, link), ([], num_gpus))[0].append(nid)
    return Layout(pools, _rack_map(nodes))


class _Pool:
    __slots__ = ("ids", "g", "count", "stamp", "bucket", "total", "rack", "whole", "first_of")

    def __init__(self, ids: tuple[str, ...], g: int, stamps: Iterable[int], racks: tuple[str, ...]):
        self.ids, self.g = ids, g
        self.count = [g] * len(ids)  # free GPUs per node
        self.stamp = list(stamps)  # when each node's free count last changed (order of ties)
        self.bucket: list[set[int]] = [set() for _ in range(g + 1)]  # free count -> node positions
        self.bucket[g].update(range(len(ids)))
        self.total = g * len(ids)
        # the whole free nodes by rack, kept as they change, so that a multi-node find reads racks, not
        # every whole node (10,000 jobs on 12,800 nodes: most of placement's time)
        self.rack = racks  # rack of each node position
        self.whole: dict[str, set[int]] = {}
        for i, r in enumerate(racks):
            self.whole.setdefault(r, set()).add(i)
        self.first_of: dict[str, int] = {}  # rack -> least stamp of its whole nodes (absent: not known)

    def move(self, i: int, delta: int, stamp: int | None) -> None:
        c = self.count[i]
        self.bucket[c].discard(i)
        self.count[i] = c + delta
        self.bucket[c + delta].add(i)
        self.total += delta
        if c == self.g:
            r = self.rack[i]
            self.whole[r].discard(i)
            if not self.whole[r]:
                del self.whole[r]
            self.first_of.pop(r, None)
        if stamp is not None:
            self.set_stamp(i, stamp)
        if c + delta == self.g:
            r = self.rack[i]
            self.whole.setdefault(r, set()).add(i)
            self.first_of.pop(r, None)

    def set_stamp(self, i: int, stamp: int) -> None:
        self.stamp[i] = stamp
        if self.count[i] == self.g:
            self.first_of.pop(self.rack[i], None)

    def first_stamp(self, rack: str) -> int:
        """The least stamp of the rack's whole free nodes (the rack's place in tie order)."""
        f = self.first_of.get(rack)
        if f is None:
            stamp = self.stamp
            f = self.first_of[rack] = min(stamp[i] for i in self.whole[rack])
        return f

    def copy(self) -> "_Pool":
        """The same free counts, stamps and whole nodes (the tie-order cache starts empty: it is a
        function of them)."""
        new = object.__new__(_Pool)
        new.ids, new.g, new.rack, new.total = self.ids, self.g, self.rack, self.total
        new.count, new.stamp = list(self.count), list(self.stamp)
        new.bucket = [set(b) for b in self.bucket]
        new.whole = {r: set(s) for r, s in self.whole.items()}
        new.first_of = {}
        return new

    def room(self, nodes: int, per_node: int, given: dict[int, int] | None = None) -> bool:
        """The one rule of where a shape fits, which `find_shape` places by and `fits_shape` answers by:
        a multi-node shape needs that many whole free nodes, a sub-node one a node with `per_node` free
        GPUs; `given`: node position -> GPUs counted as free on top of its own."""
        count, g = self.count, self.g
        if nodes > 1:
            whole = len(self.bucket[g])
            if given:
                whole += sum(1 for i, n in given.items() if count[i] < g == count[i] + n)
            return whole >= nodes
        if given and any(count[i] + n >= per_node for i, n in given.items()):
            return True
        if self.total < per_node:
            return False
        bucket = self.bucket
        return any(bucket[c] for c in range(per_node, g + 1))

    def first(self, positions) -> int:
        return min(positions, key=self.stamp.__getitem__)

    def in_order(self, positions) -> list[int]:
        return sorted(positions, key=self.stamp.__getitem__)


class Occupancy:
    """Free GPUs per node of one round; see the module doc for the rules of `find`.

    `contention`: the round's co-location state; every job held with its grid is registered in it (and
    unregistered on release), and finds break packing ties by its predicted slowdown."""

    def __init__(self, layout: Layout, contention: Contention | None = None):
        self.layout = layout
        self.contention = contention
        self._clock = count(len(layout.where))
        self.pool: dict[tuple, _Pool] = {}
        for key, (ids, g) in layout.pools.items():
            self.pool[key] = _Pool(ids, g, range(len(ids)), layout.racks(key))
        # free GPU indices of the nodes touched so far; a list is replaced on every change, never edited,
        # so that a round's copy (_copy) shares them
        self._free: dict[str, list[int]] = {}
        self.where: dict[str, Placement] = {}  # job -> its held GPUs
        self.grid_of: dict[str, Grid | None] = {}
        self._jobs_on: dict[str, set[str]] = {}
        self._journal: list[tuple] | None = None

    @staticmethod
    def of(snapshot: ClusterSnapshot, held: Iterable[tuple[str, Placement, Grid | None]] = (),
           contention: Contention | None = None) -> "Occupancy":
        """The snapshot's nodes all free, then `held` (job, placement, grid) occupied as they are."""
        occ = Occupancy(Layout.of(snapshot), contention)
        for jid, pl, grid in held:
            occ.occupy(jid, pl, grid)
        return occ

    def _copy(self, contention: Contention | None) -> "Occupancy":
        """A fresh round's occupancy with this one's free GPUs: clock and journal new, `where` and
        `grid_of` left for the caller to fill."""
        new = object.__new__(Occupancy)
        new.layout, new.contention = self.layout, contention
        new._clock = count(len(self.layout.where))
        new.pool = {k: p.copy() for k, p in self.pool.items()}
        new._free = dict(self._free)  # the lists are shared: _apply replaces a node's list, never edits it
        new.where, new.grid_of = {}, {}
        new._jobs_on = {n: set(s) for n, s in self._jobs_on.items() if s}
        new._journal = None
        return new

    # ---- reading --------------------------------------------------------------------------------
    def gpus_free(self, nid: str) -> list[int]:
        """Free GPU indices of a node, lowest first (lists are made on first touch: a round touches few)."""
        fl = self._free.get(nid)
        if fl is None:
            fl = self._free[nid] = list(range(self.pool[self.layout.where[nid][0]].g))  # untouched: all free
        return fl

    def node_free(self, nid: str) -> int:
        key, i = self.layout.where[nid]
        return self.pool[key].count[i]

    def free_gpus(self, pool_key: tuple) -> int:
        p = self.pool.get(pool_key)
        return 0 if p is None else p.total

    def free_nodes(self, pool_key: tuple) -> int:
        p = self.pool.get(pool_key)
        return 0 if p is None else len(p.bucket[p.g])

    def nodes(self, pool_key: tuple) -> tuple[str, ...]:
        return self.pool[pool_key].ids

    def gpus_per_node(self, pool_key: tuple) -> int:
        return self.pool[pool_key].g

    def jobs_on(self, nid: str) -> set[str]:
        return self._jobs_on.get(nid, set())

    # ---- finding room ---------------------------------------------------------------------------
    def find(self, grid: Grid, prev: Iterable[str] | None = (), job_id: str | None = None) -> Placement | None:
        """Where `grid` fits now (the module's rules), or None. `prev`: the job's previous nodes;
        `job_id`: the job, for the contention's tie-breaks."""
        node_cost = rack_cost = None
        c = self.contention
        if c is not None and job_id is not None and c.sensitive(job_id, grid):
            if grid.multi_node:
                rack_cost = lambda r: c.rack_cost(job_id, grid, r)  # noqa: E731
            else:
                node_cost = lambda n: c.node_cost(job_id, grid, n)  # noqa: E731
        return self.find_shape(grid.pool, grid.shape.nodes, grid.shape.gpus_per_node, prev or (), node_cost, rack_cost)

    def find_shape(self, pool_key: tuple, nodes: int, per_node: int, prev: Iterable[str] = (),
                   node_cost: Callable[[str], float] | None = None,
                   rack_cost: Callable[[str], float] | None = None) -> Placement | None:
        p = self.pool.get(pool_key)
        if p is None or not p.room(nodes, per_node):
            return None
        if nodes > 1:
            home = _smallest_rack(p, nodes)
            if home is not None:  # one rack holds them all: no order of the racks needed
                return {n: self.gpus_free(n)[:per_node] for n in _first_k(p.whole[home], p.ids, nodes, set(prev))}
            # racks in the order of their least recently changed whole node (what iterating the whole
            # nodes in tie order would give)
            by_rack = {r: p.whole[r] for r in sorted(p.whole, key=p.first_stamp)}
            pick = _fewest_racks(by_rack, p.ids, nodes, set(prev), rack_cost)
            return {n: self.gpus_free(n)[:per_node] for n in pick}
        where = self.layout.where
        prev_here = [where[n][1] for n in prev if where.get(n, (None,))[0] == pool_key]
        for c in range(per_node, p.g + 1):
            for i in prev_here:
                if p.count[i] == c:
                    nid = p.ids[i]
                    return {nid: self.gpus_free(nid)[:per_node]}
        for c in range(per_node, p.g + 1):
            b = p.bucket[c]
            if b:
                if node_cost is None:
                    i = p.first(b)
                else:
                    i = _lowest(p.in_order(b), lambda i: node_cost(p.ids[i]))
                nid = p.ids[i]
                return {nid: self.gpus_free(nid)[:per_node]}
        return None

    def fits(self, grid: Grid, freed: Placement | None = None) -> bool:
        """Whether `find(grid)` would place it, with `freed`'s GPUs counted as free, without placing
        anything: a policy that only asks is spared a hold and its rollback. `find` places exactly where
        `_Pool.room` says there is room; a job's previous nodes and the contention only choose among
        the places."""
        return self.fits_shape(grid.pool, grid.shape.nodes, grid.shape.gpus_per_node, freed)

    def fits_shape(self, pool_key: tuple, nodes: int, per_node: int, freed: Placement | None = None) -> bool:
        """`fits` of a shape, as `find_shape` finds one."""
        p = self.pool.get(pool_key)
        if p is None:
            return False
        return p.room(nodes, per_node, self._given_back(pool_key, freed) if freed else None)

    def fits_released(self, grid: Grid, job_id: str) -> bool:
        """`fits(grid)` with the job's own GPUs given back, leaving the state as `release` then
        `rollback` would: the contention's placement order (which orders its sums) has the job last."""
        if self.contention is not None:
            self.contention.requeue(job_id)
        return self.fits(grid, self.where[job_id])

    @property
    def no_contention(self) -> bool:
        """Nothing registered with a contention: holds and releases, rolled back, leave it as it was."""
        return self.contention is None or not self.contention.placed

    def _given_back(self, pool_key: tuple, freed: Placement) -> dict[int, int]:
        """Node position in the pool -> GPUs `freed` gives back there."""
        where = self.layout.where
        return {where[nid][1]: len(gpus) for nid, gpus in freed.items() if where[nid][0] == pool_key}

    def take(self, job_id: str, grid: Grid, prev: Iterable[str] | None = ()) -> Placement | None:
        """`find` and `hold` in one: the placement, or None (nothing changed)."""
        pl = self.find(grid, prev, job_id)
        if pl is not None:
            self.hold(job_id, pl, grid)
        return pl

    # ---- changing -------------------------------------------------------------------------------
    def occupy(self, job_id: str, placement: Placement, grid: Grid | None = None) -> None:
        """The state a round starts from (e.g. the running jobs): held without counting as a change
        (ties keep snapshot order) and without a journal entry."""
        self._apply(job_id, placement, grid, -1, False)

    def hold(self, job_id: str, placement: Placement, grid: Grid | None = None) -> None:
        """Give `placement` (node -> GPU indices, all free) to the job; `grid` registers it with the
        contention."""
        stamps = self._stamps(placement)
        self._apply(job_id, placement, grid, -1, True)
        if self._journal is not None:
            self._journal.append(("hold", job_id, placement, grid, stamps))

    def release(self, job_id: str) -> Placement | None:
        placement = self.where.get(job_id)
        if placement is None:
            return None
        grid = self.grid_of[job_id]
        stamps = self._stamps(placement)
        self._apply(job_id, placement, grid, +1, True)
        if self._journal is not None:
            self._journal.append(("release", job_id, placement, grid, stamps))
        return placement

    def mark(self) -> int:
        """Start (or continue) recording holds and releases; `rollback(mark)` undoes those after it."""
        if self._journal is None:
            self._journal = []
        return len(self._journal)

    def rollback(self, mark: int) -> None:
        journal = self._journal
        while len(journal) > mark:
            op, jid, pl, grid, stamps = journal.pop()
            self._apply(jid, pl, grid, +1 if op == "hold" else -1, False)
            for nid, s in stamps:
                key, i = self.layout.where[nid]
                self.pool[key].set_stamp(i, s)

    def _stamps(self, placement: Placement) -> list[tuple[str, int]]:
        out = []
        for nid in placement:
            key, i = self.layout.where[nid]
            out.append((nid, self.pool[key].stamp[i]))
        return out

    def _apply(self, job_id: str, placement: Placement, grid: Grid | None, sign: int, restamp: bool) -> None:
        """sign -1: the job takes `placement`; +1: it gives it back. `restamp`: the nodes count as
        changed now, in placement order."""
        where = self.layout.where
        for nid, gpus in placement.items():
            key, i = where[nid]
            fl = self.gpus_free(nid)
            if sign < 0:
                left = [g for g in fl if g not in gpus]
                if len(left) != len(fl) - len(gpus):
                    raise ValueError(f"GPUs {nid}:{gpus} are not all free (free: {fl})")
                self._free[nid] = left
                self._jobs_on.setdefault(nid, set()).add(job_id)
            else:
                self._free[nid] = sorted(fl + list(gpus))
                self._jobs_on[nid].discard(job_id)
            self.pool[key].move(i, sign * len(gpus), next(self._clock) if restamp else None)
        c = self.contention
        if sign < 0:
            self.where[job_id] = placement
            self.grid_of[job_id] = grid
            if c is not None and grid is not None:
                c.add(job_id, grid, placement)
        else:
            del self.where[job_id]
            del self.grid_of[job_id]
            if c is not None:
                c.remove(job_id)


def _lowest(items, cost: Callable):
    """The first item of the lowest cost, in the order given; stops at the first cost of 0."""
    best, best_c = None, float("inf")
    for x in items:
        c = cost(x)
        if c < best_c:
            best, best_c = x, c
            if c <= 0.0:
                break
    return best


def _smallest_rack(p: _Pool, k: int) -> str | None:
    """The rack `_fewest_racks` takes when one holds k whole free nodes: the fewest such nodes, ties to
    the least first stamp (its place in tie order), found in one pass instead of sorting every rack by
    stamp (10,000 jobs on 13,440 nodes: most of placement's time); None when no rack holds k."""
    best, best_n = None, None
    for r, nodes in p.whole.items():
        n = len(nodes)
        if n >= k and (best is None or n < best_n or (n == best_n and p.first_stamp(r) < p.first_stamp(best))):
            best, best_n = r, n
    return best


def _first_k(nodes: set[int], ids: tuple[str, ...], n: int, prev: set[str]) -> list[str]:
    """n of a rack's free whole nodes: the job's previous nodes first, then by id."""
    return heapq.nsmallest(n, (ids[i] for i in nodes), key=lambda x: (x not in prev, x))


def _fewest_racks(by_rack: dict[str, set[int]], ids: tuple[str, ...], k: int, prev: set[str],
                  rack_cost: Callable[[str], float] | None = None) -> list[str]:
    """k whole nodes (`by_rack`: the positions in `ids` of each rack's free whole nodes, racks in tie order)
    in as few racks as possible: the smallest rack that holds them all, else the racks with the most free nodes; in a rack
    the job's previous nodes first, then by id. Racks with as many free nodes as the last one taken are
    interchangeable for packing: with `rack_cost` (a spanning job crosses each taken rack's uplink) the
    cheapest go first."""
    def first_k(nodes: set[int], n: int) -> list[str]:
        return _first_k(nodes, ids, n, prev)

    # racks that can host the whole job first (smallest sufficient), then the fullest racks
    single = [r for r in by_rack.values() if len(r) >= k]
    if single:
        return first_k(min(single, key=len), k)
    order = sorted(by_rack, key=lambda r: len(by_rack[r]), reverse=True)
    if rack_cost is not None:
        order = _cheapest_ties(order, k, by_rack, rack_cost)
    pick: list[str] = []
    for r in order:
        pick.extend(first_k(by_rack[r], k - len(pick)))
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


class HeldOccupancy:
    """`Occupancy.of(snapshot, held, contention)` for a scheduler's every round, kept between rounds: one
    occupancy of the jobs held last round is brought up to date by the jobs that went, came or moved
    (most of a round's running jobs stay where they are), then copied for the round. The copy is the
    state `Occupancy.of` builds: the same free GPUs per node, the nodes' stamps untouched by holding
    (`occupy` does not count as a change), `where`, `grid_of` and the contention's registrations in
    `held`'s order. Which set a node position or rack sits in matters; the order inside a set does not
    (every choice among them is by unique stamp or id)."""

    def __init__(self):
        self._base: Occupancy | None = None

    def of(self, snapshot: ClusterSnapshot, held: Iterable[tuple[str, Placement, Grid | None]] = (),
           contention: Contention | None = None) -> Occupancy:
        layout = Layout.of(snapshot)
        base = self._base
        if base is None or base.layout is not layout:
            base = self._base = Occupancy(layout)
        held = list(held)
        now = {jid: pl for jid, pl, _ in held}
        if len(now) != len(held):
            raise ValueError("a job is held twice")
        try:
            gone = [jid for jid, pl in base.where.items() if now.get(jid) != pl]
            for jid in gone:  # all releases first: a job's GPUs may be another's now
                base._apply(jid, base.where[jid], None, +1, False)
            for jid, pl, _ in held:
                if jid not in base.where:
                    base._apply(jid, pl, None, -1, False)
        except Exception:
            self._base = None  # half updated (e.g. a GPU held twice): the next round starts over
            raise
        occ = base._copy(contention)
        for jid, pl, grid in held:
            occ.where[jid] = pl
            occ.grid_of[jid] = grid
            if contention is not None and grid is not None:
                contention.add(jid, grid, pl)
        return occ
