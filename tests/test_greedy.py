"""The greedy's packer (milp/greedy.py `_Free`, counts and pointers) takes exactly what the occupancy
engine's rules would: the packer it replaced, which placed every take with `Occupancy.find_shape`, is
kept here as the oracle, and every greedy selection must be the same with either (the oracle never
reports the cluster full, so the greedy's early stop on a full cluster is checked too)."""

import numpy as np
import pytest

from arena_opt.grids import enumerate_grids
from arena_opt.instances import generate_snapshot
from arena_opt.milp import greedy
from arena_opt.milp.greedy import greedy_select, greedy_start, unit_prices
from arena_opt.milp.options import ArenaOptions
from arena_opt.milp.problem import ClusterProblem, build_problem
from arena_opt.occupancy import Layout, Occupancy
from test_milp import EST, TINY_MODELS, shared_nodes


class OccupancyFree:
    """The old packer: the problem's free GPUs as an occupancy (per pool one slot per node, occupied
    nodes first, then empty ones; the GPUs of the kept jobs held), every take a `find_shape`."""

    def __init__(self, p: ClusterProblem, kept: set[int]):
        layout, held = {}, []
        for key, pi in p.pools.items():
            ids = [f"{key}/{i}" for i in range(len(pi.occupied) + pi.empty_nodes)]
            layout[key] = (ids, pi.gpus_per_node)
            for nid, users in zip(ids, pi.occupied.values()):
                n = sum(n for j, n in users if j in kept)
                if n:
                    held.append({nid: list(range(n))})
        self.occ = Occupancy(Layout(layout))
        for i, pl in enumerate(held):
            self.occ.occupy(f"kept/{i}", pl)
        self.homes: dict[int, list[tuple[str, int]]] = {}
        for key, pi in p.pools.items():
            for i, users in enumerate(pi.occupied.values()):
                for j, n in users:
                    self.homes.setdefault(j, []).append((f"{key}/{i}", n))
        self._n = 0
        self.taken: list = []  # every take's placement, to compare more than the selection

    def take(self, key: tuple, units: int) -> bool:
        g = self.occ.gpus_per_node(key)
        pl = self.occ.find_shape(key, units // g, g) if units > g else self.occ.find_shape(key, 1, units)
        if pl is None:
            return False
        self._n += 1
        self.occ.hold(f"grid/{self._n}", pl)
        return True

    def full(self) -> bool:
        return False  # never skips the jobs left once the cluster is full: the new packer's skip is checked

    def stay(self, j: int) -> bool:
        home = self.homes.get(j, [])
        if not home or any(self.occ.node_free(nid) < n for nid, n in home):
            return False
        self._n += 1
        self.occ.hold(f"grid/{self._n}", {nid: self.occ.gpus_free(nid)[:n] for nid, n in home})
        return True


def free_counts(free) -> dict:
    """Per pool and slot, the free GPUs a packer has left."""
    if isinstance(free, OccupancyFree):
        occ = free.occ
        return {key: [occ.node_free(n) for n in occ.nodes(key)] for key in occ.pool}
    return {key: list(c) for key, c in free.count.items()}


def problems():
    """Rounds with many nodes per pool (slot ids "POOL/10" sort before "POOL/2"), running jobs on them,
    multi-node grids, and more demand than GPUs; and the rounds whose running jobs share nodes."""
    spec = {"a100": (24, 4), "v100": (12, 8), "a10": (30, 2)}
    for seed, jobs in ((0, 40), (1, 90), (2, 160), (3, 320)):
        snap = generate_snapshot(spec, jobs, seed=seed, running_fraction=0.5, deadline_fraction=0.3,
                                 models=TINY_MODELS)
        yield f"gen{seed}-{jobs}", build_problem(snap, enumerate_grids(snap, EST, max_gpus_default=32),
                                                 ArenaOptions(max_gpus_per_job=32))
    for seed in (0, 1):
        snap, opts = shared_nodes(seed, cap=None)
        yield f"shared{seed}", build_problem(snap, enumerate_grids(snap, EST, max_gpus_default=4), opts)


PROBLEMS = list(problems())
NEW = greedy._Free


@pytest.mark.parametrize("name,p", PROBLEMS, ids=[n for n, _ in PROBLEMS])
def test_packer_selects_and_packs_as_the_occupancy_engine(name, p, monkeypatch):
    prices = unit_prices(p)
    made = {}

    def recording(cls):
        def make(p_, kept):
            made[cls] = cls(p_, kept)
            return made[cls]
        return make

    runs = [dict(), dict(keep_running=False)] + [dict(keep_running=False, price=f * prices) for f in (0.35, 0.75, 1.5)]
    multi = 0
    for kw in runs:
        monkeypatch.setattr(greedy, "_Free", recording(OccupancyFree))
        old = greedy_select(p, **kw)
        monkeypatch.setattr(greedy, "_Free", recording(NEW))
        new = greedy_select(p, **kw)
        assert new == old
        assert free_counts(made[NEW]) == free_counts(made[OccupancyFree])
        assert p.feasible(new)
        multi += sum(1 for k in new.values() if not p.current[k] and p.units[k] > p.pools[p.pool_of[k]].gpus_per_node)
    if name.startswith("gen") and name != "gen0-40":
        assert multi > 0  # the multi-node path was exercised


def test_greedy_start_fills_a_full_cluster_as_before(monkeypatch):
    """The 320-job round asks for more than its GPUs: the best of the greedy orders is the same."""
    p = dict(PROBLEMS)["gen3-320"]
    monkeypatch.setattr(greedy, "_Free", OccupancyFree)
    old = greedy_start(p)
    monkeypatch.setattr(greedy, "_Free", NEW)
    assert greedy_start(p) == old
    demand = sum(p.units[p.grids_of(j)].min() for j in range(p.num_jobs) if len(p.grids_of(j)))
    capacity = sum(pi.gpus_per_node * (pi.empty_nodes + len(pi.occupied)) for pi in p.pools.values())
    assert demand > capacity



def test_a_wrong_early_stop_changes_the_selection(monkeypatch):
    """A round that tells a wrong 'cluster full' stop from the right one: its small a100 pool runs out of
    GPUs while the a10 pool still takes jobs. The rule 'stop once one pool has no free GPU' then leaves
    jobs unplaced that the oracle (which never stops early) places; the real rule gives the oracle's."""
    snap = generate_snapshot({"a100": (1, 2), "a10": (16, 2)}, 60, seed=1, running_fraction=0.0,
                             models=TINY_MODELS)
    p = build_problem(snap, enumerate_grids(snap, EST, max_gpus_default=16), ArenaOptions(max_gpus_per_job=16))
    monkeypatch.setattr(greedy, "_Free", OccupancyFree)
    oracle = greedy_select(p)
    monkeypatch.setattr(greedy, "_Free", NEW)
    assert greedy_select(p) == oracle
    monkeypatch.setattr(NEW, "full", lambda self: any(u <= 1 for u in self._fails.values()))
    wrong = greedy_select(p)
    assert wrong != oracle and len(wrong) < len(oracle)


def per_job_prices(p: ClusterProblem, rounds: int = 40) -> np.ndarray:
    """unit_prices read job by job: each job takes its first grid of the best gain less price x units when
    that is positive, and each pool's price is bisected on whether those takes ask for more than its GPUs."""
    gain, units = p.gain(), p.units.astype(float)
    keys = list(p.pools)
    cap = np.array([p.pools[k].gpus_per_node * (p.pools[k].empty_nodes + len(p.pools[k].occupied)) for k in keys],
                   dtype=float)
    pool = np.array([keys.index(k) for k in p.pool_of])
    lo, hi = np.zeros(len(keys)), np.full(len(keys), float(np.max(gain / np.maximum(units, 1))))
    lam = (lo + hi) / 2
    for _ in range(rounds):
        ask = np.zeros(len(keys))
        for j in range(p.num_jobs):
            ks = p.grids_of(j)
            if not len(ks):
                continue
            score = [gain[k] - lam[pool[k]] * units[k] for k in ks]
            best = max(score)
            if best > 0:
                k = ks[score.index(best)]
                ask[pool[k]] += units[k]
        over = ask > cap
        lo, hi = np.where(over, lam, lo), np.where(over, hi, lam)
        lam = (lo + hi) / 2
    return lam[pool]


@pytest.mark.parametrize("name,p", PROBLEMS, ids=[n for n, _ in PROBLEMS])
def test_unit_prices_are_the_per_job_bisection(name, p):
    """The vectorised prices (grids as a job x grid table) are the per-job rule's, to the last bit, and
    price the pools that more jobs ask for than they have GPUs."""
    prices = unit_prices(p)
    assert np.array_equal(prices, per_job_prices(p))
    if name == "gen3-320":
        assert prices.max() > 0  # a full cluster: some pool is priced
