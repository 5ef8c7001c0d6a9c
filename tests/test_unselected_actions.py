"""build_decision writes an unselected job's action with action_without_grid, not through action_for (a big
round's hot path): the two must say the same for every job."""
from pathlib import Path

from arena_opt.decision import SolverStats
from arena_opt.policies.base import action_for, build_decision
from arena_opt.snapshot import ClusterSnapshot

ROOT = Path(__file__).resolve().parents[1]


def test_unselected_jobs_get_action_fors_answer():
    snap = ClusterSnapshot.model_validate_json((ROOT / "instances" / "medium.json").read_text())
    assert any(j.running for j in snap.jobs) and any(not j.running for j in snap.jobs)  # both branches
    d = build_decision(snap, "test", {}, {}, {}, SolverStats())
    assert [x.action for x in d.jobs] == [action_for(j, None, None) for j in snap.jobs]
    assert {x.action for x in d.jobs} == {"preempt", "wait"}
    assert all(x.reason for x in d.jobs)
