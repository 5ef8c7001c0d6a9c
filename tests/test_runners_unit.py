"""Runner pieces that need no training process: dry-run commands (multi-node),
the `run` command's input errors, progress files, specs, stage splits and
decision checks."""

from __future__ import annotations

import io
import json
import os
import shlex
import subprocess
import sys

import pytest

from arena_opt.decision import Decision, JobDecision
from arena_opt.plan import Plan
from models.catalog import get_arch
from models.layers import layer_table
from models.torch_layers import scaled_arch
from runners.base import JobSpec, RunnerError
from runners.dry_run import DryRunRunner
from runners.launch_record import LaunchFiles
from runners.local import LocalRunner
from runners.names import safe_name
from runners.progress import ProgressReader, ProgressWriter, request_stop, stop_requested
from runners.spec import SpecError, TrainSpec, parse_spec
from arena_opt.stages import PlanError, check_plan, default_stages, scale_plan
from runners.train import parse_args

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _commands(text: str) -> list[tuple[dict[str, str], list[str]]]:
    """(environment, argv) of every torchrun line printed (not those of the sbatch scripts)."""
    out = []
    for line in text.splitlines():
        if "runners.train" not in line or line.startswith(("#", "( srun")):
            continue
        words = shlex.split(line)
        env = dict(w.split("=", 1) for w in words if "=" in w and not w.startswith("-") and w.split("=")[0].isupper())
        argv = [w for w in words if w not in {f"{k}={v}" for k, v in env.items()}]
        out.append((env, argv))
    return out


def _opt(argv: list[str], name: str) -> str:
    return next(a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}="))


def test_dry_run_prints_each_nodes_torchrun_for_a_multi_node_decision(tmp_path):
    out = io.StringIO()
    r = DryRunRunner(tmp_path / "runs", out=out, node_addrs={"gpu-a": "10.0.0.7"}, base_port=29600)
    r.add_job(JobSpec(job_id="big", model="llama-7B", global_batch=64, total_steps=100, scale=None))
    plan = Plan(pp=2, dp=2, tp=2, num_microbatches=8, stages=[(0, 17), (17, 34)])
    placement = {"gpu-a": [0, 1, 2, 3], "gpu-b": [4, 5, 6, 7]}
    r.apply(Decision(policy="t", jobs=[JobDecision(job_id="big", action="start", gpu_type="h100-80gb", num_gpus=8,
                                                   placement=placement, plan=plan)]))
    cmds = _commands(out.getvalue())
    assert len(cmds) == 2
    # the same launch as the Slurm backend submits it: one heterogeneous component per node
    text = out.getvalue()
    assert "#SBATCH --nodelist=gpu-a --nodes=1 --ntasks=1 --cpus-per-task=1 --gres=gpu:h100:4" in text
    assert "#SBATCH hetjob\n#SBATCH --nodelist=gpu-b " in text
    assert text.count("( srun --het-group=") == 2 and "CUDA_VISIBLE_DEVICES=" not in text.split("<<'SBATCH'")[1]
    # the files the Slurm backend's launch writes, by the names it gives them (a node's log carries the
    # node's safe name, hash included)
    files = LaunchFiles((tmp_path / "runs" / "jobs" / safe_name("big")).resolve(), 0)
    for path in ([files.node_log(n) for n in placement] + [files.exit_code(k) for k in range(2)]
                 + [files.batch_log, files.batch_script]):
        assert str(path) in text, path
    for rank, ((env, argv), (node, gpus)) in enumerate(zip(cmds, placement.items())):
        assert argv[0].endswith("torchrun")
        assert _opt(argv, "nnodes") == "2" and _opt(argv, "node-rank") == str(rank)
        assert _opt(argv, "nproc-per-node") == "4"
        assert _opt(argv, "rdzv-backend") == "c10d"
        assert _opt(argv, "rdzv-endpoint") == "10.0.0.7:29600"  # the first node's address
        assert _opt(argv, "rdzv-id") == f"{safe_name('big')}-g0"
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, gpus))
        assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
        assert argv[argv.index("-m") + 1] == "runners.train"
        spec = parse_spec(json.loads(argv[argv.index("--spec-json") + 1]), "printed spec")
        assert spec.plan == plan and spec.scale is None and spec.world_size == 8
        assert spec.run_dir == str((tmp_path / "runs" / "jobs" / safe_name("big") / "run").resolve())
    # reshape: a stop request for the running launch, then the new launch as generation 1
    out.seek(0)
    out.truncate()
    small = Plan(dp=4, num_microbatches=2)
    r.apply(Decision(policy="t", jobs=[JobDecision(job_id="big", action="reshape", gpu_type="h100-80gb",
                                                   num_gpus=4, placement={"gpu-b": [4, 5, 6, 7]}, plan=small)]))
    text = out.getvalue()
    assert "touch " in text and "control/stop" in text
    (env, argv), = _commands(text)
    assert _opt(argv, "nnodes") == "1" and _opt(argv, "rdzv-id") == f"{safe_name('big')}-g1"
    assert _opt(argv, "rdzv-endpoint") == "gpu-b:29600"  # no address given: the node id
    # preempt: only the stop request
    out.seek(0)
    out.truncate()
    r.apply(Decision(policy="t", jobs=[JobDecision(job_id="big", action="preempt", reason="higher-value jobs")]))
    assert not _commands(out.getvalue()) and "control/stop" in out.getvalue()
    assert r.status()[0].state == "stopped"


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    code = "import sys; from arena_opt.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, "run", *args], capture_output=True, text=True, timeout=120)


def test_cli_dry_run_on_a_snapshot(tmp_path):
    snap = {"nodes": [{"id": "a", "gpu_type": "a100", "num_gpus": 4}, {"id": "b", "gpu_type": "a100", "num_gpus": 4}],
            "jobs": [{"id": "j1", "model": "gpt-1.3B", "batch_size": 64, "total_iterations": 500,
                      "remaining_iterations": 500}]}
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(snap))
    p = _run_cli("--backend", "dry-run", "--snapshot", str(path), "--workdir", str(tmp_path / "w"))
    assert p.returncode == 0, p.stderr
    cmds = _commands(p.stdout)
    assert cmds, p.stdout
    argv = cmds[0][1]
    spec = parse_spec(json.loads(argv[argv.index("--spec-json") + 1]), "printed")
    assert spec.model == "gpt-1.3B" and spec.global_batch == 64 and spec.total_steps == 500
    assert sum(int(_opt(a, "nproc-per-node")) for _, a in cmds) == spec.world_size


@pytest.mark.parametrize("args,message", [
    (["--backend", "dry-run"], "needs --snapshot"),
    (["--backend", "dry-run", "--snapshot", "/nonexistent.json"], "/nonexistent.json: file not found"),
    (["--trace", "t.csv"], "needs --trace and --cluster"),
    (["--trace", "t.csv", "--cluster", "a10:1x2", "--remove-node", "x@3"], "unknown node 'x'"),
    (["--trace", "t.csv", "--cluster", "a10:1x2", "--interval", "0"], "--interval must be > 0"),
    (["--trace", "t.csv", "--cluster", "a10:1x2", "--step-delay", "-0.5"], "--step-delay must be >= 0"),
])
def test_cli_user_mistakes_exit_2_without_traceback(tmp_path, args, message):
    (tmp_path / "t.csv").write_text("job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,"
                                    "gpu_type\nj,0,10,gpt__350M,100,8,1,a10\n")
    p = subprocess.run([sys.executable, "-c", "import sys; from arena_opt.cli import main; sys.exit(main(sys.argv[1:]))",
                        "run", *args], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": REPO})  # this checkout's code, not the installed one
    assert p.returncode == 2
    assert message in p.stderr and "Traceback" not in p.stderr


def test_progress_reader_is_incremental_and_ignores_partial_lines(tmp_path):
    w = ProgressWriter(tmp_path, generation=3)
    r = ProgressReader(tmp_path)
    assert r.poll().step == 0 and not r.state.started
    w.emit("start", step=0, world_size=2, plan={"dp": 2})
    w.emit("step", step=1, loss=2.5, iter_time_s=0.1, samples_per_s=80.0, peak_mem_bytes=10)
    with open(tmp_path / "progress.jsonl", "a") as f:
        f.write('{"event": "step", "step": 2')  # a writer caught mid-record
    s = r.poll()
    assert s.started and s.generation == 3 and s.step == 1 and s.losses == {1: 2.5} and s.world_size == 2
    with open(tmp_path / "progress.jsonl", "a") as f:
        f.write(', "loss": 2.0, "iter_time_s": 0.2, "peak_mem_bytes": 30, "generation": 3}\n')
    w.emit("checkpoint", step=2, path="x", save_s=0.1)
    w.emit("exit", reason="stopped", step=2)
    s = r.poll()
    assert s.step == 2 and s.losses == {1: 2.5, 2: 2.0} and s.peak_mem_bytes == 30
    assert s.last_checkpoint_step == 2 and s.exit_reason == "stopped" and s.iter_times == [0.1, 0.2]
    assert not stop_requested(tmp_path)
    request_stop(tmp_path)
    assert stop_requested(tmp_path)


def test_spec_errors_name_field_and_value(tmp_path):
    base = {"job_id": "j", "model": "gpt-350M", "plan": {"dp": 3}, "global_batch": 8, "total_steps": 2,
            "run_dir": "r", "ckpt_dir": "c"}
    with pytest.raises(SpecError, match=r"not divisible by dp x num_microbatches = 3 x 1"):
        parse_spec(base, "spec.json")
    with pytest.raises(SpecError, match=r"spec.json: model.*unknown model 'gpt-9T'"):
        parse_spec({**base, "plan": {}, "model": "gpt-9T"}, "spec.json")
    bad = tmp_path / "s.json"
    bad.write_text("{not json")
    with pytest.raises(SpecError, match="s.json: not JSON"):
        parse_args(["--spec", str(bad)])
    ok = parse_args(["--spec-json", json.dumps({**base, "plan": {"dp": 2}, "model": "bert__760M"})])
    assert isinstance(ok, TrainSpec) and ok.model == "bert-760M"


def test_stage_splits():
    arch = scaled_arch(get_arch("gpt-1.3B"))
    n = layer_table(arch).num_layers
    for pp in range(1, n + 1):
        st = default_stages(arch, pp)
        assert st[0][0] == 0 and st[-1][1] == n and all(b > a for a, b in st)
        assert all(st[k][1] == st[k + 1][0] for k in range(pp - 1))
    with pytest.raises(PlanError, match="exceeds"):
        default_stages(arch, n + 1)
    full = get_arch("gpt-1.3B")  # 26 layers -> 6
    p = scale_plan(Plan(pp=3, stages=[(0, 2), (2, 24), (24, 26)]), full, arch)
    assert p.stages == [(0, 1), (1, 5), (5, 6)]
    with pytest.raises(PlanError, match="tp = 3 does not divide"):
        check_plan(arch, Plan(tp=3))
    with pytest.raises(PlanError, match="convolution"):
        check_plan(scaled_arch(get_arch("wide_resnet-1B")), Plan(tp=2))
    with pytest.raises(PlanError, match="must end at layer 6"):
        check_plan(arch, Plan(pp=2, stages=[(0, 2), (2, 5)]))


def test_decisions_the_runner_cannot_apply(tmp_path):
    r = LocalRunner(tmp_path)
    r.add_job(JobSpec(job_id="a", model="gpt-350M", global_batch=8, total_steps=3))
    with pytest.raises(RunnerError, match="already added"):
        r.add_job(JobSpec(job_id="a", model="gpt-350M", global_batch=8, total_steps=3))
    with pytest.raises(RunnerError, match="does not know"):
        r.apply(Decision(policy="t", jobs=[JobDecision(job_id="zz", action="wait")]))
    # a decision to run without a GPU type: refused before anything starts (it was an assert after the launch)
    for runner in (r, DryRunRunner(tmp_path / "dry", out=io.StringIO())):
        if runner is not r:
            runner.add_job(JobSpec(job_id="a", model="gpt-350M", global_batch=8, total_steps=3))
        with pytest.raises(RunnerError, match=r"job 'a' \(start\) has no gpu_type"):
            runner.apply(Decision(policy="t", jobs=[JobDecision(job_id="a", action="start", num_gpus=1,
                                                                placement={"n": [0]}, plan=Plan())]))
    assert r.jobs["a"].handle is None and not (tmp_path / "jobs").exists()
    with pytest.raises(RunnerError, match="placement holds 1 GPUs, plan pp1xdp2xtp1 mb1 needs 2"):
        r.apply(Decision(policy="t", jobs=[JobDecision(job_id="a", action="start", gpu_type="x", num_gpus=1,
                                                       placement={"n": [0]}, plan=Plan(dp=2))]))
    # a plan whose split does not divide the batch is refused before anything starts
    r.apply(Decision(policy="t", jobs=[JobDecision(job_id="a", action="start", gpu_type="x", num_gpus=3,
                                                   placement={"n": [0, 1, 2]}, plan=Plan(dp=3))]))
    st = r.status()[0]
    assert st.state == "pending" and "not divisible" in st.message and r.jobs["a"].handle is None


def test_pipeline_stages_get_example_tensors_instead_of_shape_inference():
    # the pipelining library's shape inference runs a stage on uninitialised buffers; on MoE under
    # tp the routing of that garbage differs between tp ranks and their collectives mismatch, so
    # transformer stages are built from examples (tokens in, hidden states between, logits out)
    import torch

    from runners.parallelize import _stage_examples

    arch = scaled_arch(get_arch("moe-690M"), max_hidden=64, max_layers=4, seq_len=16, max_vocab=256)
    n = layer_table(arch).num_layers
    x = torch.zeros((8, arch.seq_len), dtype=torch.long)  # this rank's batch, 2 micro-batches of 4
    first = _stage_examples(arch, (0, 2), x, 2, torch.device("cpu"))
    last = _stage_examples(arch, (2, n), x, 2, torch.device("cpu"))
    assert first["input_args"].shape == (4, arch.seq_len) and first["input_args"].dtype == torch.long
    assert not first["input_args"].requires_grad
    assert first["output_args"].shape == (4, arch.seq_len, arch.hidden) and first["output_args"].requires_grad
    assert last["input_args"].shape == (4, arch.seq_len, arch.hidden) and last["input_args"].requires_grad
    assert last["output_args"].shape == (4, arch.seq_len, arch.vocab)
    assert _stage_examples(scaled_arch(get_arch("wide_resnet-1B")), (0, 2), x, 2, torch.device("cpu")) is None


def test_pipeline_examples_carry_the_steps_precision(monkeypatch):
    """The schedule checks each stage's outputs against its examples: under autocast (bf16 on GPUs; CPU's bf16
    autocast stands in here) the last stage's logits are bf16, while hidden states between stages stay fp32."""
    import torch

    import runners.parallelize as par

    monkeypatch.setattr(par, "training_precision", lambda device: torch.bfloat16)
    arch = scaled_arch(get_arch("gpt-350M"), max_hidden=64, max_layers=4, seq_len=16, max_vocab=256)
    n = layer_table(arch).num_layers
    x = torch.zeros((8, arch.seq_len), dtype=torch.long)
    assert par._stage_examples(arch, (2, n), x, 2, torch.device("cpu"))["output_args"].dtype == torch.bfloat16
    assert par._stage_examples(arch, (0, 2), x, 2, torch.device("cpu"))["output_args"].dtype == torch.float32
    # and that is what the stages produce under that autocast
    from models.torch_layers import LayerStack

    with torch.autocast("cpu", dtype=torch.bfloat16):
        hidden = LayerStack(arch, 0, 2, seed=0)(x[:4])
        logits = LayerStack(arch, 2, n, seed=0)(hidden)
    assert hidden.dtype == torch.float32 and logits.dtype == torch.bfloat16


def test_live_snapshots_carry_the_wait_a_job_earned(tmp_path):
    # aging must survive a start in the live loop as in the simulator: waiting from submission to the
    # start, nothing while running, and again from the round that finds it preempted
    from arena_opt.policies import make_policy
    from arena_opt.cluster import load_cluster
    from arena_opt.trace import TraceJob
    from runners.base import ObservedJob
    from runners.live import LiveLoop, LiveOptions

    trace = [TraceJob(id="A", submit_time=0, model="gpt-350M", batch_size=64, iterations=200, num_gpus=1,
                      gpu_type="a10")]
    loop = LiveLoop(load_cluster("a10:2x1"), trace, DryRunRunner(tmp_path / "runs"), make_policy("fcfs"),
                    LiveOptions(), tmp_path / "out")
    loop.jobs["A"].added = True
    loop.recorder.submit(0.0, loop.jobs["A"].rec)
    pending = {"A": ObservedJob(job_id="A", state="pending", total_steps=20)}
    running = {"A": ObservedJob(job_id="A", state="running", step=5, total_steps=20, gpu_type="a10",
                                placement={"a10-000": [0]}, plan=Plan())}

    def waited(t, obs):
        return loop._snapshot(t, obs).jobs[0].waited_s

    def decide(t, action, obs):
        runs = action == "start"
        loop._account_decision(t, Decision(time=t, policy="test", jobs=[JobDecision(
            job_id="A", action=action, gpu_type="a10" if runs else None, num_gpus=int(runs), num_nodes=int(runs),
            placement={"a10-000": [0]} if runs else {}, plan=Plan() if runs else None)]), obs)

    assert waited(30.0, pending) == 30.0
    decide(40.0, "start", pending)
    assert waited(40.0, running) == 40.0  # started here: the wait stops growing
    assert waited(100.0, running) == 40.0
    decide(110.0, "preempt", running)
    assert waited(110.0, pending) == 40.0  # preempted: a new spell from the round that preempted it
    assert waited(150.0, pending) == 80.0


def test_rendezvous_ports_are_distinct_bindable_and_outside_the_ephemeral_range(monkeypatch):
    """Launches started together get different ports, none from the range the kernel hands to outgoing
    connections (a port from bind(0) can be taken by one before torchrun binds it), and a taken port
    is skipped."""
    import socket

    from runners import launch

    lo, _ = launch._ephemeral_range()
    ports = [launch.free_port() for _ in range(100)]
    assert len(set(ports)) == 100
    assert all(launch._LOW_PORT <= p < lo for p in ports)
    # a port in use is never handed out: hold one and force the draw onto it, then onto a free one
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        draws = iter([taken, taken, taken + 1 if taken + 1 not in launch._HANDED else taken + 2])

        class Fixed:
            def randint(self, a, b):
                return next(draws)

        monkeypatch.setattr(launch.random, "Random", Fixed)
        got = launch.free_port()
    assert got != taken and got in (taken + 1, taken + 2)


def test_sbatch_script_picks_the_rendezvous_port_on_the_node_it_runs_on(tmp_path):
    """The Slurm backend's batch script chooses the rendezvous port itself (Slurm runs it on the launch's
    first node, where torchrun binds it) and hands the same port to every node's torchrun. Run here with
    a stand-in `srun` that records its argv: every component gets one endpoint whose port is a number
    free on this host, drawn below the ephemeral range."""
    from runners import launch
    from runners.launch import node_launches
    from runners.slurm import PORT_REF, sbatch_script

    spec = TrainSpec(job_id="big job's", model="llama-7B", global_batch=8, total_steps=1, plan=Plan(pp=1, dp=2),
                     run_dir=str(tmp_path / "run"), ckpt_dir=str(tmp_path / "ckpt"), scale=None)
    placement = {"n0": [0], "n1": [0]}
    launches = node_launches(spec, placement, f"10.0.0.7:{PORT_REF}", use_gpus=False)
    logs = [str(tmp_path / f"log{k}") for k in range(2)]
    rcs = [str(tmp_path / f"rc{k}") for k in range(2)]
    script = sbatch_script(launches, {"n0": "a100", "n1": "a100"}, name="t", logs=logs, rc_files=rcs,
                           batch_log=str(tmp_path / "batch.log"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "srun"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"open({str(tmp_path / 'argv')!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    fake.chmod(0o755)
    (tmp_path / "s.sh").write_text(script)
    import os
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    r = subprocess.run(["bash", str(tmp_path / "s.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    calls = [json.loads(ln) for ln in (tmp_path / "argv").read_text().splitlines()]
    assert len(calls) == 2 and all(open(p).read().strip() == "0" for p in rcs)
    endpoints = {_opt(c, "rdzv-endpoint") for c in calls}
    assert len(endpoints) == 1
    host, port = next(iter(endpoints)).rsplit(":", 1)
    lo, _ = launch._ephemeral_range()
    assert host == "10.0.0.7" and launch._LOW_PORT <= int(port) < lo
    assert f"rendezvous port {port} on " in r.stdout
    # the spec (quotes in the job id included) reaches torchrun intact
    got = parse_spec(json.loads(calls[0][calls[0].index("--spec-json") + 1]), "batch script")
    assert got == spec


def test_next_generation_follows_every_launch_file_in_the_job_directory(tmp_path):
    from runners.launch_record import next_generation

    assert next_generation(tmp_path / "missing") == 0
    logs = tmp_path / "logs"
    logs.mkdir()
    assert next_generation(tmp_path) == 0
    # torchrun's own folder and files of no launch do not count; a launch's node log, exit code, batch script
    # and record each do, whichever of them an interrupted launch left behind
    (logs / "torchrun").mkdir()
    (logs / "notes.txt").write_text("x")
    (logs / "g0.launch.json").write_text("{}")
    (logs / "g0-n0.log").write_text("")
    assert next_generation(tmp_path) == 1
    (logs / "g3-1.rc").write_text("0")
    assert next_generation(tmp_path) == 4
    (logs / "g11.sbatch").write_text("")
    assert next_generation(tmp_path) == 12
    # every name LaunchFiles makes is one next_generation counts, whichever a launch left alone
    files = LaunchFiles(tmp_path / "alone", 5)
    for path in [files.record, files.node_log("gpu/a b"), files.exit_code(3), files.batch_log, files.batch_script]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
        assert next_generation(files.root) == 6, path.name
        path.unlink()
