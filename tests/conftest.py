import os

import pytest

# hermetic: no plan cache from the user's home, for this process and the CLIs it starts
os.environ["ARENA_OPT_CACHE"] = ""

from arena_opt.perf.table import default_data_dir


@pytest.fixture(scope="session")
def arena_data():
    """Arena's artifact data folder; tests that need it skip cleanly when it is absent."""
    d = default_data_dir()
    if d is None or not (d / "prof_records.csv").is_file():
        pytest.skip("Arena artifact data not found (set ARENA_OPT_DATA or place it at ../shared/data/arena)")
    return d


@pytest.fixture(scope="session")
def slurm_session():
    """One throwaway Slurm cluster for the session (tests/slurm_cluster.py); every daemon it started
    is stopped by pid at the end, also when tests fail."""
    from slurm_cluster import SlurmCluster, unavailable_reason

    why = unavailable_reason()
    if why:
        pytest.skip(why)
    cluster = SlurmCluster().start()
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        cluster.stop()
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old


@pytest.fixture
def slurm(slurm_session):
    """The session's cluster with no job and every node idle, before and after the test."""
    slurm_session.reset()
    yield slurm_session
    slurm_session.reset()
