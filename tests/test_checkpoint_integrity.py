"""Checkpoint integrity in one process (a world of one gloo rank, no torchrun):
atomic commit, manifest, keep-last-K, and loading that falls back past deleted,
truncated, zeroed or unloadable checkpoints to the newest intact one."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist
from torch import nn

from runners import checkpoint as ck


@pytest.fixture
def group(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _model(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return m, torch.optim.AdamW(m.parameters(), lr=1e-2)


def _train(m: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    g = torch.Generator().manual_seed(step)
    loss = m(torch.randn(4, 8, generator=g)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()


def _weights(m: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in m.parameters()]


def _saved(tmp_path, keep: int = 3, steps=(2, 4, 6)) -> tuple[dict[int, list[torch.Tensor]], "os.PathLike"]:
    m, opt = _model()
    d = tmp_path / "ckpt"
    weights = {}
    for s in range(1, max(steps) + 1):
        _train(m, opt, s)
        if s in steps:
            ck.save(m, opt, s, d, {"samples": s * 4}, keep=keep)
            weights[s] = _weights(m)
    return weights, d


def _load(d):
    m, opt = _model(seed=1)
    skipped = []
    step, path, _, skips, touched = ck.load_newest_intact(m, opt, d, skipped.append)
    assert skips == skipped
    return step, m, opt, skips, touched


def test_save_commits_a_manifest_and_keeps_the_last_k(group, tmp_path):
    weights, d = _saved(tmp_path, keep=2)
    assert [s for s, _ in ck.committed(d)] == [6, 4]  # step 2 pruned
    assert not list(d.glob(ck.TMP_PREFIX + "*"))
    assert (d / ck.LATEST).read_text() == "step_000000006"
    man = ck.read_manifest(d / "step_000000006")
    assert man["step"] == 6 and man["samples"] == 24
    assert man["files"] and all(set(v) == {"size", "sha256"} for v in man["files"].values())
    for name, v in man["files"].items():
        assert (d / "step_000000006" / name).stat().st_size == v["size"]
    assert ck.verify(d / "step_000000006") is None
    step, m, opt, skips, _ = _load(d)
    assert step == 6 and not skips
    assert all(torch.equal(a, b) for a, b in zip(_weights(m), weights[6]))
    assert opt.state  # the Adam moments came back too


def test_newest_deleted_loads_the_older_intact_one(group, tmp_path):
    weights, d = _saved(tmp_path)
    import shutil

    shutil.rmtree(d / "step_000000006")  # `latest` now names a checkpoint that is gone
    step, m, _, skips, _ = _load(d)
    assert step == 4 and not skips
    assert all(torch.equal(a, b) for a, b in zip(_weights(m), weights[4]))


@pytest.mark.parametrize("damage", ["truncate", "zero"])
def test_corrupted_newest_is_skipped_with_its_reason(group, tmp_path, damage):
    weights, d = _saved(tmp_path)
    newest = d / "step_000000006"
    shard = max((p for p in newest.iterdir() if p.suffix == ".distcp"), key=lambda p: p.stat().st_size)
    size = shard.stat().st_size
    if damage == "truncate":
        with open(shard, "r+b") as f:
            f.truncate(size // 2)
    else:
        shard.write_bytes(b"\0" * size)
    step, m, _, skips, touched = _load(d)
    assert step == 4 and [s.step for s in skips] == [6] and not touched
    assert ("bytes" if damage == "truncate" else "checksum") in skips[0].reason and shard.name in skips[0].reason
    assert all(torch.equal(a, b) for a, b in zip(_weights(m), weights[4]))


def test_no_intact_checkpoint_means_scratch_and_unloadable_ones_are_skipped(group, tmp_path):
    _, d = _saved(tmp_path, steps=(2, 4))
    # step 4: files match a manifest rewritten for them, but the content is not a checkpoint -> DCP fails
    p4 = d / "step_000000004"
    man = ck.read_manifest(p4)
    for name in man["files"]:
        f = p4 / name
        f.write_bytes(b"\x80garbage" * 16)
        man["files"][name] = {"size": f.stat().st_size, "sha256": ck._sha256(f)}
    (p4 / ck.MANIFEST).write_text(json.dumps(man))
    # step 2: the manifest is gone (an interrupted commit by an older version, or deleted by hand)
    (d / "step_000000002" / ck.MANIFEST).unlink()
    # a save a crash interrupted is never a candidate
    (d / (ck.TMP_PREFIX + "step_000000009")).mkdir()
    step, m, _, skips, touched = _load(d)
    assert step is None and [s.step for s in skips] == [4, 2]
    assert "DCP load failed" in skips[0].reason and skips[1].reason == "no manifest"
    assert touched  # the caller rebuilds its model before starting from scratch
    assert ck.newest_complete(d) == (4, p4)  # sizes alone cannot see content damage


def test_a_step_saved_again_replaces_the_old_copy(group, tmp_path):
    _, d = _saved(tmp_path, steps=(2,))
    m, opt = _model(seed=3)
    ck.save(m, opt, 2, d, {"samples": 8})
    assert [s for s, _ in ck.committed(d)] == [2] and ck.verify(d / "step_000000002") is None
    step, m2, _, _, _ = _load(d)
    assert step == 2 and all(torch.equal(a, b) for a, b in zip(_weights(m2), _weights(m)))


def test_full_disk_during_a_save_keeps_the_committed_checkpoint_and_frees_the_partial_one(group, tmp_path):
    """A save that hits ENOSPC (a real 200 KiB tmpfs; skipped where none can be mounted) fails, removes its
    partial shards at once, and leaves the previous checkpoint committed, intact, `latest` and loadable."""
    import subprocess

    d = tmp_path / "disk"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(d)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.decode().strip()}")
    try:
        torch.manual_seed(0)
        m = nn.Linear(96, 96)  # ~37 KiB of weights, ~124 KiB a checkpoint with AdamW state: one fits, two do not
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        ckdir = d / "ckpt"
        m(torch.randn(2, 96)).sum().backward()
        opt.step()
        ck.save(m, opt, 1, ckdir, {"samples": 4}, keep=2)
        saved = [p.detach().clone() for p in m.parameters()]
        m(torch.randn(2, 96)).sum().backward()
        opt.step()
        with pytest.raises(ck.SaveError, match=r"save of step 2 to .* failed \(0\.\d MiB free there\).*unchanged"):
            ck.save(m, opt, 2, ckdir, {"samples": 8}, keep=2)
        assert sorted(p.name for p in ckdir.iterdir()) == [ck.LATEST, ck.step_name(1)]  # nothing partial left
        assert (ckdir / ck.LATEST).read_text().strip() == ck.step_name(1)
        assert ck.verify(ckdir / ck.step_name(1)) is None
        m2 = nn.Linear(96, 96)
        step, _, _, skips, _ = ck.load_newest_intact(m2, torch.optim.AdamW(m2.parameters(), lr=1e-2), ckdir)
        assert step == 1 and not skips
        assert all(torch.equal(a, b) for a, b in zip(saved, m2.parameters()))
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)
