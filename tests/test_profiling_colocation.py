"""Co-location slowdown model: processor sharing of cores and links, solved to a fixed point."""

import pytest

from arena_opt.perf.sharing import JobLoads, Load, alone_time, cpu_job, iteration_times, slowdowns


def test_two_always_busy_jobs_on_one_core_each_take_twice_as_long():
    a, b = cpu_job("a", 1.0, 1.0, 1), cpu_job("b", 2.0, 2.0, 1)
    assert slowdowns([a, b], {"cpu": 1.0}) == pytest.approx([2.0, 2.0])
    # with one core each there is nothing to share
    assert slowdowns([a, b], {"cpu": 2.0}) == pytest.approx([1.0, 1.0])


def test_no_shared_resource_no_slowdown():
    a = JobLoads("a", 1.0, {"uplink:n1": Load(0.5, 1.0)})
    b = JobLoads("b", 1.0, {"uplink:n2": Load(0.5, 1.0)})
    assert slowdowns([a, b], {"uplink:n1": 1.0, "uplink:n2": 1.0}) == [1.0, 1.0]


def test_shared_link_fixed_point():
    # each job sends for half its iteration alone; together a sender meets the other with probability
    # p, its sending stretches to 0.5 (1 + p) and T = 1 + 0.5 p, with p = 0.5 (1 + p) / T:
    # p^2 + p - 1 = 0
    a = JobLoads("a", 1.0, {"uplink": Load(0.5, 1.0)})
    b = JobLoads("b", 1.0, {"uplink": Load(0.5, 1.0)})
    t = iteration_times([a, b], {"uplink": 1.0})
    p = (5 ** 0.5 - 1) / 2
    assert t == pytest.approx([1 + 0.5 * p, 1 + 0.5 * p], rel=1e-6)


def test_background_load_and_own_oversubscription():
    job = cpu_job("j", 2.0, 2.0, 4)  # 4 processes on 2 cores: its alone time already includes 4/2
    assert alone_time(job, {"cpu": 2.0}, {}) == pytest.approx(2.0)
    # two more runnable tasks of other tenants: 6 runnable on 2 cores instead of 4
    assert alone_time(job, {"cpu": 2.0}, {"cpu": 2.0}) == pytest.approx(2.0 * 6 / 4)
