"""Result files are written atomically: a full disk (a real small tmpfs where this
machine lets us mount one, else a simulated ENOSPC) leaves the previous file
intact and no temporary file behind."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import uuid

import pytest

from arena_opt import io as aio
from arena_opt.sim.results import write_result


def _try_tmpfs(path, size: str = "64k") -> bool:
    path.mkdir()
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                           capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    """(directory, real): a 64 KiB tmpfs, or a directory where writes of over 64 KiB fail with ENOSPC."""
    d = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    if _try_tmpfs(d):
        try:
            yield d, True
        finally:
            subprocess.run(["umount", "-l", str(d)], capture_output=True, timeout=10)
        return
    d.mkdir(exist_ok=True)
    real_fsync = os.fsync

    def fsync(fd):  # as a network file system reports a full disk: at fsync, for files over 64 KiB
        if os.fstat(fd).st_size > 65536:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    monkeypatch.setattr(aio.os, "fsync", fsync)
    yield d, False


def test_full_disk_keeps_the_previous_result_file(small_disk):
    d, real = small_disk
    path = d / "arena.json"
    write_result(path, {"policy": "arena", "jobs": 3})
    before = path.read_bytes()
    big = {"policy": "arena", "series": ["x" * 1000] * 200}  # ~200 KB: does not fit
    with pytest.raises(OSError) as e:
        write_result(path, big)
    assert e.value.errno == errno.ENOSPC, e.value
    assert path.read_bytes() == before and json.loads(before)["jobs"] == 3
    assert sorted(p.name for p in d.iterdir()) == ["arena.json"], "a temporary file was left behind"
    # and once there is room again the write goes through
    write_result(path, {"policy": "arena", "jobs": 4})
    assert json.loads(path.read_text())["jobs"] == 4


def test_a_failing_writer_leaves_nothing(tmp_path):
    path = tmp_path / "plot.png"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with aio.atomic_path(path) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("interrupted")
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["plot.png"]
