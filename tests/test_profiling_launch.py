"""The multi-process launcher of the measurement benches: a failing rank is named and its waiting
peers are stopped, a launch that stops making progress is taken for hung, a good one returns."""

import time

import pytest

from arena_opt.profiling.measure import launch

RANKS = '''
import sys, time
rank, mode = int(sys.argv[2]), sys.argv[5]
if mode == "ok":
    sys.exit(0)
if mode == "fail" and rank == 1:
    print("noise before the cause", file=sys.stderr)
    sys.exit("rank 1: bad plan")
time.sleep(120)  # "hang", and rank 0 of "fail": waits on a peer that is gone
'''


@pytest.fixture
def ranks_module(tmp_path, monkeypatch):
    (tmp_path / "fake_ranks.py").write_text(RANKS)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return "fake_ranks"


def test_good_launch_returns(ranks_module):
    launch(ranks_module, 2, ["ok"], timeout_s=60)


def test_failed_rank_is_named_and_its_peers_stopped(ranks_module):
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="a rank failed: rank 1: bad plan"):
        launch(ranks_module, 2, ["fail"], timeout_s=60)
    assert time.monotonic() - t0 < 30  # not the 120 s rank 0 would wait


def test_launch_without_progress_is_hung(ranks_module, tmp_path):
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="hung: no progress in 2 s"):
        launch(ranks_module, 2, ["hang"], timeout_s=60, progress=(str(tmp_path / "results.json"), 2.0))
    assert time.monotonic() - t0 < 30
