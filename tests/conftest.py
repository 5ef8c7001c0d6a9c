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
