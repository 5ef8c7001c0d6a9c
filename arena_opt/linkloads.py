"""Link loads of a placed job: how long, per iteration, its communication keeps each shared link busy.

Two kinds of link are shared between jobs (see `occupancy.topology`: cluster - rack - node):

- `fabric:<node>`, the GPU-to-GPU fabric inside a node, shared by the single-node jobs on it (a
  multi-node job holds its nodes whole and shares none of their links);
- `uplink:<rack>`, a rack's link to the rest of the cluster, crossed by every multi-node job whose
  nodes lie in more than one rack (a job inside one rack stays below the rack switch).

A job's busy time on a link kind is the part of its estimated iteration time that the cost model
(`perf.analytical` terms composed by `perf.compose`) puts on that kind's bandwidth: the iteration time
minus the iteration time with that kind's transfers free. The fraction comes from the analytical model
and scales the estimator's iteration time (measured tables and online corrections included), so a
job's communication share is the model's while its speed is the estimator's. Latency terms are left
out: a shared link slows the bytes, not the per-message latency.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat

from arena_opt.gpus import GpuSpec
from arena_opt.perf.analytical import (RATE_NAMES, CostParams, cost_table, intra_link_kind, layer_terms, links_for,
                                      rate_vector)
from arena_opt.perf.compose import evaluate_split, split_stages, split_stages_shaped
from arena_opt.plan import Plan
from arena_opt.perf.sharing import Load
from models.catalog import Arch

UPLINK_GROUP = "uplink"  # a multi-node job's transfers cross all its racks' uplinks at once


class ColocationOptions(BaseModel):
    """Modelling assumptions of the co-location slowdown (what the snapshot does not say)."""

    model_config = ConfigDict(extra="forbid")

    uplink_oversubscription: PositiveFloat = Field(
        1.0, description=(
            "network bandwidth of a rack's nodes over the bandwidth of the rack's uplink. The snapshot "
            "gives racks but no switch bandwidths; 1 is a non-blocking (fat-tree) network, on which "
            "cross-rack jobs never slow each other, so set the ratio of your leaf switches (e.g. 3 for "
            "3:1) to make placement keep cross-rack jobs off the same uplinks"))
    fabric_rings: dict[str, PositiveFloat | None] = Field(
        default_factory=lambda: {"nvlink": None, "pcie": 1.0}, description=(
            "per intra-node link kind, how many jobs' collectives the node's GPU-to-GPU fabric carries "
            "at the full speed the estimator assumes (None: any number, a non-blocking fabric). NVLink "
            "gives every GPU its own links, so jobs on disjoint GPUs do not meet; PCIe peer traffic "
            "crosses the shared switch or host bridge, whose bandwidth the estimator already gives one "
            "job's ring (links_for: one x16 link per GPU)"))


@dataclass(frozen=True)
class CommShare:
    """Fractions of an iteration spent on intra-node and inter-node link bandwidth (cost model)."""

    intra: float
    inter: float


class CommShares:
    """`CommShare` per (model, batch, GPU, shape, plan), cached: a scheduler meets the same plans every round."""

    def __init__(self, params: CostParams):
        self.params = params
        self._cache: dict[tuple, CommShare] = {}

    def __call__(self, arch: Arch, batch: int, gpu_name: str, gpu: GpuSpec, intra_link: str | None, nodes: int,
                 gpus_per_node: int, plan: Plan) -> CommShare:
        key = (arch, batch, gpu_name, gpu, intra_link, nodes, gpus_per_node, plan.dp, plan.tp, plan.pp,
               plan.num_microbatches, plan.recompute, tuple(plan.stages), tuple(plan.shapes))
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._share(arch, batch, gpu_name, gpu, intra_link, nodes, gpus_per_node, plan)
        return hit

    def _share(self, arch, batch, gpu_name, gpu, intra_link, nodes, gpus_per_node, plan: Plan) -> CommShare:
        table = cost_table(arch, self.params)
        links = links_for(gpu, intra_link, self.params)
        m = plan.num_microbatches
        # one term table per distinct stage shape (a uniform plan has one)
        by_shape = {sh: layer_terms(table, gpu, links, nodes=nodes, gpus_per_node=gpus_per_node, batch=batch,
                                    dp=sh[0], tp=sh[1], m=m, recompute=plan.recompute) for sh in set(plan.shapes)}
        terms = [by_shape[sh] for sh in plan.shapes]
        rates = rate_vector(self.params, gpu_name, gpu.peak_tflops, table.dtype, links.intra_kind, table.family)
        costs = [t.costs(rates) for t in terms]
        stages = list(plan.stages)
        if not stages:  # a running plan given without its split: the model's own split
            split = (split_stages(costs[0], plan.pp, m, float("inf")) if plan.uniform else
                     split_stages_shaped(costs, [[k] for k in range(plan.pp)], m, float("inf")))
            if split is None:
                return CommShare(0.0, 0.0)
            stages = split.stages if plan.uniform else split[0].stages
        full = evaluate_split(costs, stages, m).iter_time_s

        def share(name: str) -> float:
            free = rates.copy()
            free[RATE_NAMES.index(name)] = 0.0
            return max(0.0, full - evaluate_split([t.costs(free) for t in terms], stages, m).iter_time_s) / full

        return CommShare(share("intra"), share("inter"))


@dataclass(frozen=True)
class JobComm:
    """One placed job's communication: alone iteration time, busy time per link kind, network rate."""

    iter_s: float
    intra_busy_s: float
    inter_busy_s: float
    intra_kind: str
    node_net_bps: float  # the network bandwidth its node sends at while it communicates across nodes


class LinkLoads:
    """Capacities of the shared links of one cluster and the loads a job puts on them."""

    def __init__(self, nodes: dict, rack_of: dict[str, str], catalog: dict[str, GpuSpec], params: CostParams,
                 options: ColocationOptions):
        self.options = options
        self.rack_of = rack_of
        self.params = params
        self.uplinks_shared = options.uplink_oversubscription > 1.0  # else no uplink is ever oversubscribed
        self._catalog = catalog
        self._nodes = nodes
        self._rack_bps: dict[str, float] = {}
        self._kinds: dict[tuple, str] = {}
        if self.uplinks_shared:
            for nid, n in nodes.items():
                r = rack_of[nid]
                self._rack_bps[r] = self._rack_bps.get(r, 0.0) + self.node_net_bps(n.gpu_type, n.num_gpus,
                                                                                   n.intra_link)

    def node_net_bps(self, gpu_type: str, gpus: int, intra_link: str | None) -> float:
        return gpus * links_for(self._catalog[gpu_type], intra_link, self.params).inter_bw

    def capacity(self, resource: str) -> float:
        kind, name = resource.split(":", 1)
        if kind == "uplink":
            return self._rack_bps[name] / self.options.uplink_oversubscription
        return self.fabric_rings(self.kind(self._nodes[name].gpu_type, self._nodes[name].intra_link))

    def fabric_rings(self, kind: str) -> float | None:
        """Capacity of a node fabric of this link kind, in jobs' rings; None: not shared (no limit)."""
        return self.options.fabric_rings.get(kind)

    def kind(self, gpu_type: str, intra_link: str | None) -> str:
        """The intra-node link kind of a pool (`perf.analytical.intra_link_kind`), cached."""
        key = (gpu_type, intra_link)
        hit = self._kinds.get(key)
        if hit is None:
            hit = self._kinds[key] = intra_link_kind(self._catalog[gpu_type], intra_link)
        return hit

    def fabric(self, comm: JobComm, node: str) -> dict[str, Load]:
        """Loads of a single-node job on `node`."""
        if comm.intra_busy_s <= 0 or self.fabric_rings(comm.intra_kind) is None:
            return {}
        return {f"fabric:{node}": Load(comm.intra_busy_s, 1.0)}

    def uplink(self, comm: JobComm, rack: str) -> dict[str, Load]:
        """Load of a multi-node job crossing `rack`'s uplink: one node's network rate each way (a ring
        through the job's racks enters and leaves every rack once), for its inter-node busy time."""
        if comm.inter_busy_s <= 0 or not self.uplinks_shared:
            return {}
        return {f"uplink:{rack}": Load(comm.inter_busy_s, comm.node_net_bps, UPLINK_GROUP)}

    def uplinks(self, comm: JobComm, racks) -> dict[str, Load]:
        """Loads of a multi-node job whose nodes lie in `racks` (none inside a single rack)."""
        racks = sorted(set(racks))
        out: dict[str, Load] = {}
        if len(racks) > 1:
            for r in racks:
                out.update(self.uplink(comm, r))
        return out

    def loads(self, comm: JobComm, placement: dict[str, list[int]]) -> dict[str, Load]:
        if len(placement) > 1:
            return self.uplinks(comm, (self.rack_of[n] for n in placement))
        return self.fabric(comm, next(iter(placement))) if placement else {}


__all__ = ["ColocationOptions", "CommShare", "CommShares", "JobComm", "LinkLoads", "UPLINK_GROUP"]
