"""Profile database: round trip, version and format checks, bad files rejected with file, field and
value; the `arena-opt profile` command on a tiny model."""

import json

import pytest

from arena_opt.errors import InputError
from arena_opt.perf import profile_db as pdb
from test_profiling_compose import profile  # noqa: E402 - tests/ is on sys.path under pytest


def test_round_trip_and_keys(tmp_path):
    d = pdb.ProfileDB(models=[profile().model_copy(update={"probe_s": 2.5e-3})])
    d.put_comm(pdb.CommFit(device="cpu", backend="gloo", link="loopback", collective="all_reduce", alpha_s=1e-4,
                           bandwidth_bps=1e9, mean_rel_err=0.01, points=[(2, 1024, 1e-4)]))
    path = tmp_path / "p.json"
    pdb.save(d, path)
    back = pdb.load(path)
    assert back == d and back.models[0].probe_s == 2.5e-3
    assert back.model("tiny-gpt", "cpu").layer_of()[2].kind == "block"
    assert back.comm_fits("cpu")[("loopback", "all_reduce", None)].alpha_s == 1e-4
    # replacing an entry with the same key keeps one
    back.put_model(profile())
    assert len(back.models) == 1
    raw = json.loads(path.read_text())
    assert raw["format"] == "arena-opt-profile" and raw["version"] == pdb.VERSION


@pytest.mark.parametrize("mutate, match", [
    (lambda r: r.update(version=99), r"field version: .*profile version 1 \(value 99\)"),
    (lambda r: r.update(format="something-else"),
     r"field format: expected 'arena-opt-profile' \(value 'something-else'\)"),
    (lambda r: r["models"][0]["layers"][1]["samples"][0].update(fwd_s=-1.0),
     r"field models\.0\.layers\.1\.samples\.0\.fwd_s: .*greater than 0 \(value -1\.0\)"),
    (lambda r: r["models"][0]["layers"][1].update(indices=[1]), r"cover indices 0\.\.3"),
    (lambda r: r["models"][0].update(model="other"), r"does not match arch\.name"),
    (lambda r: r["models"][0].update(probe_s=0), r"field models\.0\.probe_s: .*greater than 0 \(value 0\)"),
    (lambda r: r["models"][0]["layers"][0]["samples"].append(r["models"][0]["layers"][0]["samples"][0]),
     r"repeat a \(tp, dp, micro_batch\)"),
    (lambda r: r["comm"].append({"device": "cpu", "backend": "gloo", "link": "loopback", "collective": "broadcast",
                                 "alpha_s": 0, "bandwidth_bps": 1, "mean_rel_err": 0}), r"field comm\.0\.collective"),
])
def test_bad_files_are_rejected_with_file_field_value(tmp_path, mutate, match):
    raw = json.loads(pdb.ProfileDB(models=[profile()]).model_dump_json())
    mutate(raw)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(InputError, match=match) as e:
        pdb.load(path)
    assert str(path) in str(e.value)


def test_not_json_and_missing_file(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{not json")
    with pytest.raises(InputError, match="not a JSON profile database"):
        pdb.load(p)
    with pytest.raises(InputError, match="cannot read"):
        pdb.load(tmp_path / "absent.json")
    p.write_bytes(b"\x80\x04\x95pickle")
    with pytest.raises(InputError):
        pdb.load(p)


def test_profile_command_errors(tmp_path, capsys):
    from arena_opt.cli import main

    assert main(["profile", "--model", "no-such-model", "--out", str(tmp_path / "p.json")]) == 2
    assert "unknown model" in capsys.readouterr().err
    assert main(["profile", "--model", "gpt-350M", "--batch", "1,x", "--out", str(tmp_path / "p.json")]) == 2
    assert "--batch" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "arena-opt-profile", "version": 7}')
    assert main(["profile", "--model", "gpt-350M", "--out", str(bad)]) == 2
    assert "version" in capsys.readouterr().err


def test_profiles_without_the_runtime_fields_still_load(tmp_path):
    raw = json.loads(pdb.ProfileDB(models=[profile()]).model_dump_json())
    for lp in raw["models"][0]["layers"]:
        for s in lp["samples"]:
            del s["dp"], s["sync_s"]
    del raw["models"][0]["optim_call_s"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(raw))
    m = pdb.load(path).models[0]
    assert m.probe_s is None  # not probed
    assert m.optim_call_s == 0.0 and all(s.dp == 1 and s.sync_s == 0.0 for lp in m.layers for s in lp.samples)
    assert m.layers[0].dp_degrees(1) == []


def test_collective_fits_recover_wall_and_cpu_parameters():
    from arena_opt.perf.comm import AlphaBeta
    from arena_opt.profiling import commbench
    from arena_opt.perf.profile_costs import comm_model

    wall, cpu = AlphaBeta(alpha_s=5e-4, bandwidth_bps=1e9), AlphaBeta(alpha_s=2e-4, bandwidth_bps=2e9)
    points = [{"collective": "all_reduce", "group": g, "bytes": nb, "seconds": float(wall.time("all_reduce", nb, g)),
               "cpu_seconds": float(cpu.time("all_reduce", nb, g))} for g in (2, 4) for nb in (1024, 2 ** 20, 2 ** 24)]
    fits = commbench.fit(points, "cpu", "gloo", "loopback", cores=2)
    assert [f.group for f in fits] == [None, 2, 4]
    for f in fits:
        assert f.alpha_s == pytest.approx(5e-4) and f.bandwidth_bps == pytest.approx(1e9)
        assert f.cpu_alpha_s == pytest.approx(2e-4) and f.cpu_bandwidth_bps == pytest.approx(2e9) and f.cores == 2
    d = pdb.ProfileDB(comm=fits)
    cm = comm_model(d, "cpu")
    assert cm.cpu_fits[("loopback", "all_reduce", 4)][1] == 2
    # points without CPU times (older databases): wall fits only
    old = commbench.fit([{k: v for k, v in p.items() if k != "cpu_seconds"} for p in points], "cpu", "gloo", "loopback")
    assert all(f.cpu_alpha_s is None for f in old) and comm_model(pdb.ProfileDB(comm=old), "cpu").cpu_fits == {}
