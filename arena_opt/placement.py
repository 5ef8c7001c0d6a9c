"""Placement: map each chosen grid onto concrete nodes and GPU indices, by the occupancy engine's
rules (arena_opt/occupancy.py): kept jobs stay where they are, then the others go in the order
multi-node first, largest first (with power-of-two sizes this packs whatever the level-1 packing
constraints admit), each preferring its previous nodes.

Given a `Contention` (arena_opt/contention.py), choices that are equally good for packing go to the
one with the lowest predicted co-location slowdown; the contention then holds every placed job."""

from __future__ import annotations

from arena_opt.contention import Contention
from arena_opt.grids import Grid
from arena_opt.occupancy import HeldOccupancy, Occupancy
from arena_opt.snapshot import ClusterSnapshot


class PlacementError(RuntimeError):
    pass


def place(snapshot: ClusterSnapshot, chosen: dict[str, Grid], contention: Contention | None = None,
          held: HeldOccupancy | None = None) -> dict[str, dict[str, list[int]]]:
    """`held`: the caller's occupancy of the kept jobs from its last round (the same placement, faster)."""
    jobs = {j.id: j for j in snapshot.jobs}
    kept = [(jid, {nid: sorted(gs) for nid, gs in jobs[jid].running.placement.items()}, g)
            for jid, g in chosen.items() if g.current]
    occ = Occupancy.of(snapshot, kept, contention) if held is None else held.of(snapshot, kept, contention)
    todo = [(jid, g) for jid, g in chosen.items() if not g.current]
    todo.sort(key=lambda x: (not x[1].multi_node, -x[1].num_gpus, x[0]))
    for jid, g in todo:
        prev = jobs[jid].running.placement if jobs[jid].running else ()
        if occ.take(jid, g, prev) is None:
            if g.multi_node:
                raise PlacementError(f"job {jid}: needs {g.shape.nodes} free {g.pool[0]} nodes, "
                                     f"{occ.free_nodes(g.pool)} are free")
            raise PlacementError(f"job {jid}: no {g.pool[0]} node has {g.num_gpus} free GPUs")
    for jid, g in chosen.items():
        plan = g.result.plan
        # a per-stage plan's tp groups sit wherever its stage boundaries fall: check them on the GPUs given
        why = None if plan.uniform else plan.tp_group_error([len(gs) for gs in occ.where[jid].values()])
        if why:
            raise PlacementError(f"job {jid}: plan {plan.describe()} on {occ.where[jid]}: {why}")
    return {jid: occ.where[jid] for jid in chosen}
