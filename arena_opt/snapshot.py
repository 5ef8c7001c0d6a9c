"""Cluster snapshot: the input of every policy (pydantic, validated at the edge)."""

from __future__ import annotations

from typing import Literal

from pydantic import (ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat,
                      PositiveInt, field_validator, model_validator)

from arena_opt.edge import EdgeModel
from arena_opt.gpus import BUILTIN_GPUS, GpuSpec, canonical_gpu
from arena_opt.plan import Plan
from models.catalog import ARCHITECTURES, Arch, arena_model_name
from models.layers import layer_table

SCHEMA_VERSION = 1

# Sane bounds at the edge (a value past one is a typo or a unit mistake, not a cluster or a job)
MAX_GPUS_PER_NODE = 64
MAX_NODES = 100_000
MAX_GPUS = MAX_GPUS_PER_NODE * MAX_NODES  # bound of every GPU count a job may ask for
MAX_BATCH_SIZE = 2**24  # samples per iteration
MAX_ITERATIONS = 10**10
MAX_TIME_S = 10**11  # about 3000 years: snapshot time, submit times

NodeState = Literal["available", "drain", "down"]


class _Strict(EdgeModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Node(_Strict):
    id: str = Field(min_length=1)
    gpu_type: str
    num_gpus: PositiveInt = Field(le=MAX_GPUS_PER_NODE)
    state: NodeState = Field(
        "available", description="available: takes new work; drain: running jobs keep running until moved, "
                                 "nothing new starts; down: offers nothing, jobs placed on it are lost (re-planned "
                                 "as waiting). The Slurm adapter maps Slurm's node states onto this")
    unavailable_gpus: list[NonNegativeInt] = Field(
        default_factory=list, description="GPU indices (0..num_gpus-1) that are broken or held back: nothing "
                                          "new is placed on them; a running job on one is lost")
    intra_link: Literal["nvlink", "pcie"] | None = Field(
        None, description="GPU-to-GPU link inside the node; None = NVLink when the GPU has it")
    rack: str | None = None
    gpu_ids: list[NonNegativeInt] | None = Field(
        None, description="device index of each of the node's GPUs, by GPU index (placement indices are "
                          "0..num_gpus-1); set where the node has more devices than it offers, e.g. a Slurm "
                          "node whose other GPUs hold jobs that are not scheduled here; None = 0..num_gpus-1")

    @field_validator("gpu_type")
    @classmethod
    def _canon(cls, v: str) -> str:
        return canonical_gpu(v)

    @model_validator(mode="after")
    def _check_ids(self) -> "Node":
        if self.gpu_ids is not None:
            if len(self.gpu_ids) != self.num_gpus:
                raise ValueError(f"gpu_ids lists {len(self.gpu_ids)} devices but num_gpus is {self.num_gpus}")
            if len(set(self.gpu_ids)) != len(self.gpu_ids):
                raise ValueError(f"gpu_ids has a repeated device: {self.gpu_ids}")
        bad = [g for g in self.unavailable_gpus if g >= self.num_gpus]
        if bad:
            raise ValueError(f"unavailable_gpus: GPU index {bad[0]} exceeds the node's {self.num_gpus} GPUs")
        if len(set(self.unavailable_gpus)) != len(self.unavailable_gpus):
            raise ValueError(f"unavailable_gpus has a repeated index: {self.unavailable_gpus}")
        return self

    def usable_gpus(self) -> list[int]:
        """GPU indices new work may be placed on: none on a drained or down node."""
        if self.state != "available":
            return []
        off = set(self.unavailable_gpus)
        return [g for g in range(self.num_gpus) if g not in off]

    def lost(self, gpus: list[int]) -> bool:
        """Whether a job holding `gpus` of this node has lost them (node down or a GPU unavailable)."""
        return self.state == "down" or any(g in self.unavailable_gpus for g in gpus)

    def device(self, gpu: int) -> int:
        """Device index of GPU index `gpu`."""
        return self.gpu_ids[gpu] if self.gpu_ids is not None else gpu


class RunningState(_Strict):
    """Where and how a running job runs now."""

    gpu_type: str
    placement: dict[str, list[NonNegativeInt]] = Field(description="node id -> GPU indices")
    plan: Plan
    since: NonNegativeFloat = 0.0

    @field_validator("gpu_type")
    @classmethod
    def _canon(cls, v: str) -> str:
        return canonical_gpu(v)

    @property
    def num_gpus(self) -> int:
        return sum(len(g) for g in self.placement.values())


class Job(_Strict):
    id: str = Field(min_length=1)
    model: str | Arch = Field(description="catalog name (or Arena's model__size) or an inline architecture")
    batch_size: PositiveInt = Field(le=MAX_BATCH_SIZE, description="global batch, samples per iteration")
    total_iterations: PositiveInt = Field(le=MAX_ITERATIONS)
    remaining_iterations: NonNegativeFloat
    submit_time: NonNegativeFloat = Field(0.0, le=MAX_TIME_S)
    deadline: PositiveFloat | None = Field(None, description="absolute time by which the job should finish")
    weight: PositiveFloat = 1.0
    allowed_gpu_types: list[str] | None = None
    min_gpus: PositiveInt = Field(1, le=MAX_GPUS)
    max_gpus: PositiveInt | None = Field(None, le=MAX_GPUS)
    requested_gpu_type: str | None = None
    requested_num_gpus: PositiveInt | None = Field(None, le=MAX_GPUS)
    running: RunningState | None = None
    attained_service_s: NonNegativeFloat = Field(0.0, description="GPU-seconds received so far")
    waited_s: NonNegativeFloat | None = Field(
        None, description="seconds spent waiting (queued or preempted) since submission, as of the snapshot; "
                          "None: a waiting job has waited since submit_time, a running one not at all")

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str | Arch) -> str | Arch:
        if not isinstance(v, str):
            return v
        name = arena_model_name(v)
        if name not in ARCHITECTURES:
            raise ValueError(f"unknown model {v!r} (see `arena-opt models` for the catalog)")
        return name

    @field_validator("allowed_gpu_types")
    @classmethod
    def _canon_list(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else [canonical_gpu(x) for x in v]

    @field_validator("requested_gpu_type")
    @classmethod
    def _canon(cls, v: str | None) -> str | None:
        return None if v is None else canonical_gpu(v)

    @model_validator(mode="after")
    def _check(self) -> "Job":
        if self.remaining_iterations > self.total_iterations:
            raise ValueError(f"remaining_iterations {self.remaining_iterations} exceeds total_iterations "
                             f"{self.total_iterations}")
        if self.max_gpus is not None and self.max_gpus < self.min_gpus:
            raise ValueError(f"max_gpus {self.max_gpus} is below min_gpus {self.min_gpus}")
        return self

    @property
    def arch(self) -> Arch:
        return self.model if isinstance(self.model, Arch) else ARCHITECTURES[self.model]


class ClusterSnapshot(_Strict):
    version: Literal[1] = SCHEMA_VERSION
    time: NonNegativeFloat = Field(0.0, le=MAX_TIME_S)
    gpu_catalog: dict[str, GpuSpec] = Field(default_factory=dict,
                                            description="entries that add to or replace the built-in catalog")
    nodes: list[Node] = Field(max_length=MAX_NODES)
    jobs: list[Job] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list,
                             description="what the snapshot's source left out and why (nodes down or drained, "
                                         "jobs without training metadata held as fixed occupants)")

    @model_validator(mode="after")
    def _check(self) -> "ClusterSnapshot":
        catalog = self.catalog
        _unique([n.id for n in self.nodes], "nodes", "id")
        _unique([j.id for j in self.jobs], "jobs", "id")
        for i, n in enumerate(self.nodes):
            if n.gpu_type not in catalog:
                raise ValueError(f"nodes[{i}].gpu_type: unknown GPU type {n.gpu_type!r}; known: "
                                 f"{', '.join(sorted(catalog))}")
        nodes = {n.id: n for n in self.nodes}
        used: dict[tuple[str, int], str] = {}
        for i, j in enumerate(self.jobs):
            for t in j.allowed_gpu_types or ():
                if t not in catalog:
                    raise ValueError(f"jobs[{i}].allowed_gpu_types: unknown GPU type {t!r}")
            if j.requested_gpu_type is not None and j.requested_gpu_type not in catalog:
                raise ValueError(f"jobs[{i}].requested_gpu_type: unknown GPU type {j.requested_gpu_type!r}")
            if j.running is None:
                continue
            r = j.running
            where = f"jobs[{i}].running"
            for nid, gpus in r.placement.items():
                if nid not in nodes:
                    raise ValueError(f"{where}.placement: unknown node {nid!r}")
                node = nodes[nid]
                if node.gpu_type != r.gpu_type:
                    raise ValueError(f"{where}.placement: node {nid!r} has {node.gpu_type}, job runs on "
                                     f"{r.gpu_type}")
                for g in gpus:
                    if g >= node.num_gpus:
                        raise ValueError(f"{where}.placement: GPU index {g} exceeds node {nid!r} "
                                         f"({node.num_gpus} GPUs)")
                    if (nid, g) in used:
                        raise ValueError(f"{where}.placement: GPU {nid}:{g} is also used by job "
                                         f"{used[(nid, g)]!r}")
                    used[(nid, g)] = j.id
            if r.plan.num_gpus != r.num_gpus:
                what = "pp*dp*tp" if r.plan.uniform else "the sum of stage dp*tp"
                raise ValueError(f"{where}.plan: {what} = {r.plan.num_gpus} but the placement holds "
                                 f"{r.num_gpus} GPUs")
            _check_plan(j, r, where)
        return self

    @property
    def catalog(self) -> dict[str, GpuSpec]:
        return {**BUILTIN_GPUS, **{canonical_gpu(k): v for k, v in self.gpu_catalog.items()}}

    def gpu_types(self) -> list[str]:
        return sorted({n.gpu_type for n in self.nodes})


def _check_plan(j: Job, r: RunningState, where: str) -> None:
    """A running job's plan must be one its model and batch can run: the stages hold exactly the model's
    layers, the batch splits into dp replicas and each replica's share into whole micro-batches, and
    every tensor-parallel group sits inside one node."""
    p = r.plan
    layers = layer_table(j.arch).num_layers
    if p.pp > layers:
        raise ValueError(f"{where}.plan: pp {p.pp} exceeds the {layers} layers of {j.arch.name}")
    if p.stages and p.stages[-1][1] != layers:
        raise ValueError(f"{where}.plan.stages: end at layer {p.stages[-1][1]} but {j.arch.name} has {layers} "
                         f"layers (stages must cover layers 0..{layers - 1} exactly)")
    bad = p.batch_error(j.batch_size)
    if bad is not None:
        raise ValueError(f"{where}.plan{'' if bad[0] == 'dp' else '.' + bad[0]}: {bad[1]}")
    for nid, gpus in r.placement.items():
        if p.uniform and len(gpus) % p.tp:
            raise ValueError(f"{where}.placement: node {nid!r} holds {len(gpus)} GPUs, not a multiple of tp "
                             f"{p.tp} (a tensor-parallel group must sit inside one node)")
    if not p.uniform:
        why = p.tp_group_error([len(g) for g in r.placement.values()])
        if why:
            raise ValueError(f"{where}.plan.stage_shapes: {why} (a tensor-parallel group must sit inside one node)")


def _unique(ids: list[str], field: str, key: str) -> None:
    if len(set(ids)) == len(ids):  # the common case, in C; the loop below names the first duplicate
        return
    seen: set[str] = set()
    for i, x in enumerate(ids):
        if x in seen:
            raise ValueError(f"{field}[{i}].{key}: duplicate id {x!r}")
        seen.add(x)
