"""Snapshots from Slurm's JSON: recorded 22.05 output and the documented 23.02/24.05 dialects
(tests/fixtures/slurm/README.md), GRES and host-list parsing, the GPU map, malformed output.
The same tests against a live Slurm are in tests/test_slurm_cluster.py."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from arena_opt.cli import main
from arena_opt.errors import InputError
from arena_opt.feasibility import check_decision
from arena_opt.policies import make_policy
from arena_opt.slurm.gres import GpuMap, expand_hostlist, parse_gres, parse_index_list
from arena_opt.slurm.jsonfmt import parse_jobs, parse_nodes
from arena_opt.slurm.snapshot import build_snapshot
from arena_opt.snapshot import ClusterSnapshot

FIX = Path(__file__).parent / "fixtures" / "slurm"
NOW = 1796119800.0


def _read(name: str) -> str:
    return (FIX / name).read_text()


def snapshot_of(nodes: str, jobs: str, gpu_map: GpuMap | None = None) -> ClusterSnapshot:
    return build_snapshot(parse_nodes(_read(nodes), "nodes"), parse_jobs(_read(jobs), "squeue --json"),
                          gpu_map or GpuMap({}), now=NOW).snapshot


DIALECTS = [("sinfo-22.05.json", "squeue-22.05.json"), ("scontrol-nodes-24.05.json", "squeue-24.05.json"),
            ("scontrol-nodes-24.05.json", "squeue-23.02.json")]


def test_recorded_22_05_snapshot():
    snap = snapshot_of(*DIALECTS[0])
    nodes = {n.id: n for n in snap.nodes}
    # n2 is drained: listed with state drain (nothing new starts there), named in the notes
    assert set(nodes) == {"n1", "n2", "n3", "n4"}
    assert nodes["n2"].state == "drain" and nodes["n2"].usable_gpus() == []
    assert {n.state for k, n in nodes.items() if k != "n2"} == {"available"}
    assert "node n2 drain: DRAIN (maintenance test)" in snap.notes
    # the foreign job holds devices 0-1 of n1: the node offers its devices 2 and 3 only
    assert nodes["n1"].num_gpus == 2 and nodes["n1"].gpu_ids == [2, 3]
    assert (nodes["n1"].gpu_type, nodes["n1"].rack, nodes["n1"].intra_link) == ("a100-40gb", "r1", "pcie")
    assert nodes["n3"].gpu_type == "v100-32gb" and nodes["n3"].gpu_ids is None and nodes["n3"].rack == "r2"
    jobs = {j.id: j for j in snap.jobs}
    # the cancelled job 5 and the foreign job 1 are not jobs of the snapshot
    assert set(jobs) == {"3", "4", "7"}
    assert jobs["3"].running is None and jobs["3"].remaining_iterations == 50
    # job 4 holds device 2 of n1 = GPU index 0 of the snapshot's n1
    assert jobs["4"].running.placement == {"n1": [0]} and jobs["4"].remaining_iterations == 37
    # the heterogeneous job 7 (components 7 + 8) with its plan from the comment
    r7 = jobs["7"].running
    assert r7.placement == {"n3": [0, 1, 2, 3], "n4": [0, 1, 2, 3]} and (r7.plan.pp, r7.plan.dp, r7.plan.tp) == (2, 2, 2)
    assert r7.gpu_type == "v100-32gb" and jobs["7"].remaining_iterations == 80
    # round trip of the new fields
    again = ClusterSnapshot.model_validate_json(snap.model_dump_json())
    assert again == snap and again.notes == snap.notes


@pytest.mark.parametrize("nodes,jobs", DIALECTS[1:])
def test_later_dialects_give_the_same_snapshot(nodes, jobs):
    assert snapshot_of(nodes, jobs) == snapshot_of(*DIALECTS[0])


@pytest.mark.parametrize("policy", ["arena", "fcfs", "gavel", "sia", "elasticflow", "arena-greedy"])
def test_no_policy_places_on_a_fixed_occupant(policy):
    snap = snapshot_of(*DIALECTS[0])
    decision = make_policy(policy, {"time_limit_s": 5} if policy == "arena" else None).decide(snap)
    check_decision(snap, decision)
    nodes = {n.id: n for n in snap.nodes}
    used = [(nid, nodes[nid].device(g)) for d in decision.jobs for nid, gs in d.placement.items() for g in gs]
    assert used, "something runs"
    assert not [u for u in used if u[0] == "n1" and u[1] in (0, 1)], "placed on the foreign job's GPUs"
    assert len(used) == len(set(used))


def test_hostlist_and_gres():
    assert expand_hostlist("n[1-3,07],gpu-a[01-02]x,solo") == ["n1", "n2", "n3", "n07", "gpu-a01x", "gpu-a02x", "solo"]
    assert expand_hostlist("") == []
    with pytest.raises(ValueError):
        expand_hostlist("n[1-2")
    assert parse_index_list("0-1,3") == [0, 1, 3] and parse_index_list("N/A") == []
    g = parse_gres("gpu:a100:4(S:0-1),nvme:1")
    assert [(x.name, x.type, x.count) for x in g] == [("gpu", "a100", 4), ("nvme", None, 1)]
    (u,) = parse_gres("gpu:a100:2(IDX:0,2-3)")
    assert u.indices == (0, 2, 3)
    assert parse_gres("gres/gpu:v100:4")[0].type == "v100" and parse_gres("gres:gpu:v100:4")[0].count == 4
    assert [(x.type, x.count) for x in parse_gres("gpu:2")] == [(None, 2)]
    assert parse_gres("(null)") == [] and parse_gres(None) == []


def test_gpu_map(tmp_path):
    from arena_opt.gpus import BUILTIN_GPUS

    m = GpuMap({})
    assert m.resolve("a100", BUILTIN_GPUS, "n1", "gpu:a100:4") == "a100-40gb"
    assert m.resolve("A100_80GB", BUILTIN_GPUS, "n1", "gpu:A100_80GB:4") == "a100-80gb"
    assert m.resolve("nvidia_h100_80gb_hbm3", BUILTIN_GPUS, "n1", "x") == "h100-80gb"
    with pytest.raises(InputError, match=r"node n9: GRES 'gpu:a100-sxm4:8'.*ambiguous: a100-40gb, a100-80gb"):
        m.resolve("a100-sxm4", BUILTIN_GPUS, "n9", "gpu:a100-sxm4:8")
    with pytest.raises(InputError, match=r"node n9: GRES 'gpu:mi250:8'.*unknown GPU type 'mi250'; choices: a10, "):
        m.resolve("mi250", BUILTIN_GPUS, "n9", "gpu:mi250:8")
    site = tmp_path / "map.json"
    site.write_text(json.dumps({"a100-sxm4": "a100-80gb", "rtx": "nope"}))
    sm = GpuMap.load(site)
    assert sm.resolve("a100-sxm4", BUILTIN_GPUS, "n9", "g") == "a100-80gb"
    with pytest.raises(InputError, match="maps to unknown GPU 'nope'"):
        sm.resolve("rtx", BUILTIN_GPUS, "n9", "g")
    with pytest.raises(InputError, match="file not found"):
        GpuMap.load(tmp_path / "absent.json")
    # the unknown type of a node in the snapshot names the node
    raw = json.loads(_read("sinfo-22.05.json"))
    raw["nodes"][2]["gres"] = "gpu:mi250:4"
    with pytest.raises(InputError, match="node n3: GRES 'gpu:mi250:4'"):
        build_snapshot(parse_nodes(json.dumps(raw), "sinfo --json"), [], m, now=NOW)


def test_malformed_output_names_command_and_field():
    with pytest.raises(InputError, match=r"`squeue --json`: output is not JSON"):
        parse_jobs("squeue: error: slurm_load_jobs", "squeue --json")
    with pytest.raises(InputError, match=r"`sinfo --json`: field 'nodes' missing"):
        parse_nodes('{"meta": {}}', "sinfo --json")
    raw = json.loads(_read("squeue-22.05.json"))
    raw["jobs"][1]["job_state"] = 7
    with pytest.raises(InputError, match=r"`squeue --json`: jobs\[1\] \(job 2\): field job_state"):
        parse_jobs(json.dumps(raw), "squeue --json")
    raw = json.loads(_read("sinfo-22.05.json"))
    raw["nodes"][0]["gres"] = 4
    with pytest.raises(InputError, match=r"`sinfo --json`: nodes\[0\] \(n1\): field gres"):
        parse_nodes(json.dumps(raw), "sinfo --json")
    with pytest.raises(InputError, match="Slurm reported an error: Unable to contact"):
        parse_jobs('{"errors": [{"error": "x", "description": "Unable to contact slurm controller"}], "jobs": []}',
                   "squeue --json")


def _fake_slurm(tmp_path: Path, scontrol: str | None, squeue: str) -> Path:
    """Slurm's client commands on PATH that print fixtures (22.05: scontrol has no --json)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    scripts = {
        "scontrol": (f"cat {FIX / scontrol}" if scontrol else
                     "echo \"scontrol: unrecognized option '--json'\" >&2; exit 1"),
        "sinfo": f"cat {FIX / 'sinfo-22.05.json'}",
        "squeue": squeue,
    }
    for name, body in scripts.items():
        p = bin_ / name
        p.write_text(f"#!/bin/sh\n{body}\n")
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return bin_


@pytest.mark.parametrize("scontrol,squeue", [(None, "squeue-22.05.json"), ("scontrol-nodes-24.05.json", "squeue-24.05.json")])
def test_cli_snapshot_then_solve(tmp_path, monkeypatch, capsys, scontrol, squeue):
    bin_ = _fake_slurm(tmp_path, scontrol, f"cat {FIX / squeue}")
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "snap.json"
    assert main(["slurm", "snapshot", "-o", str(out)]) == 0
    snap = ClusterSnapshot.model_validate_json(out.read_text())
    assert snap == snapshot_of(*DIALECTS[0]).model_copy(update={"time": snap.time})
    assert "node n2 drain: DRAIN" in capsys.readouterr().out
    assert main(["solve", str(out), "--time-limit", "5", "-o", str(tmp_path / "d.json")]) == 0


def test_cli_malformed_squeue_exits_2(tmp_path, monkeypatch, capsys):
    bin_ = _fake_slurm(tmp_path, None, "echo '{\"jobs\": [{\"job_id\": \"x\", \"job_state\": \"RUNNING\"}]}'")
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    assert main(["slurm", "snapshot"]) == 2
    err = capsys.readouterr().err
    assert "`squeue --json`: jobs[0]" in err and "field job_id" in err and "Traceback" not in err


def _with_node_states(states: dict[str, tuple[str, list[str], str]]) -> ClusterSnapshot:
    """The recorded 22.05 snapshot with some nodes' (state, state_flags, reason) replaced."""
    raw = json.loads(_read(DIALECTS[0][0]))
    for n in raw["nodes"]:
        if n["name"] in states:
            n["state"], n["state_flags"], n["reason"] = states[n["name"]]
    return build_snapshot(parse_nodes(json.dumps(raw), "nodes"), parse_jobs(_read(DIALECTS[0][1]), "squeue --json"),
                          GpuMap({}), now=NOW).snapshot


@pytest.mark.parametrize("policy", ["arena", "fcfs", "gavel", "sia", "elasticflow", "arena-greedy"])
def test_down_node_loses_its_job_and_drained_node_keeps_its_own(policy):
    # n3 (half of job 7's GPUs) goes down; n1 (job 4 on one of its two offered GPUs) is draining
    snap = _with_node_states({"n3": ("down", ["NOT_RESPONDING"], "Not responding"),
                              "n1": ("mixed", ["DRAIN"], "kernel update")})
    nodes = {n.id: n for n in snap.nodes}
    assert (nodes["n3"].state, nodes["n1"].state, nodes["n4"].state) == ("down", "drain", "available")
    assert "node n3 down: DOWN+NOT_RESPONDING (Not responding)" in snap.notes
    assert "node n1 drain: DRAIN (kernel update)" in snap.notes
    # job 7 still shows where Slurm had it: the policy, not the adapter, re-plans it, with the reason
    assert {j.id: j for j in snap.jobs}["7"].running.placement == {"n3": [0, 1, 2, 3], "n4": [0, 1, 2, 3]}
    decision = make_policy(policy, {"time_limit_s": 5} if policy == "arena" else None).decide(snap)
    check_decision(snap, decision)
    by_job = decision.by_job()
    j7 = by_job["7"]
    assert j7.action in ("migrate", "reshape", "preempt") and "node n3 is down" in j7.reason, j7
    assert "n3" not in j7.placement
    # nothing new anywhere on n3 or n1: only job 4 may stay on the GPU it holds
    for jd in decision.jobs:
        assert "n3" not in jd.placement, jd
        if "n1" in jd.placement:
            assert jd.job_id == "4" and jd.placement["n1"] == [0] and jd.action == "keep", jd
