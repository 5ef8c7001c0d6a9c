"""Direct measurement of plans end to end: the runners' real multi-process training step
(`runners.parallelize`: DDP / FSDP2, DTensor tensor parallelism, 1F1B pipelining) on gloo (CPU) or
NCCL (CUDA), one process per rank, all configurations of one world size in one launch.

Each step is timed between two barriers on every rank (forward + backward of all micro-batches,
gradient synchronisation, optimizer step); a step's time is the slowest rank's, and a plan's time
is the median over the timed steps after warm-up. Over the timed steps the host's CPU time used by
processes other than the ranks is recorded too (`ambient_cores`: cores busy with other work on
average), the co-located load a load-aware estimate accounts for, and the run queue of other tasks
(`ambient_runnable`), sampled by the launching process, not by a rank: a sampling thread inside a
rank would take CPU time and the GIL from the step it measures. Before every timed step (outside
its timed window) each rank times the speed probe (`arena_opt.profiling.speed`); `probe_s` is the
ranks' mean of their medians, the host speed a profile-based estimate can be scaled to. Around every
timed step each rank reads the kernel's scheduler accounting (`sched_times`): the CPU time of all its
threads (`step_cpu_s`, summed over the ranks: the CPU work of the step alone, without the probes) and its
compute thread's on-CPU time and run-queue delay (`step_main_cpu_s`, `step_wait_s`), whose ratio is the
share of a core a runnable rank got: where other tenants took cores, measured rather than guessed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from arena_opt.plan import Plan
from runners.launch import free_port
from models.catalog import Arch


def host_busy_core_seconds() -> float | None:
    """CPU time all processes of the host have used since boot (Linux /proc/stat), core-seconds."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def sched_times() -> tuple[float, float, float] | None:
    """(CPU seconds of all threads of this process, CPU seconds and run-queue delay of the calling
    thread) so far,
    from the kernel's scheduler accounting (Linux /proc/.../schedstat). The delay is time the thread
    was runnable but a core was busy, with another of our ranks or another tenant's task; time
    blocked on a collective or a barrier is not in it. Only the calling thread's: it does all the
    compute (one intra-op thread; autograd runs the CPU backward on the caller), while the process's
    helper threads (gloo's) wake and wait in ways that say nothing about the step's critical path."""
    # one read per thread, the caller's among them: read apart, the caller's line and its term in the sum
    # were taken milliseconds apart on a loaded host, and the sum's delta came out 3 ms below the caller's
    # own (CI, session 9)
    me = str(threading.get_native_id())
    run, own, wait = 0, None, 0
    try:
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    fields = f.read().split()
                ran, waited = int(fields[0]), int(fields[1])
            except (OSError, ValueError, IndexError):
                if tid == me:
                    return None
                continue  # a thread that ended between the listing and the read
            run += ran
            if tid == me:
                own, wait = ran, waited
    except OSError:
        return None
    if own is None:
        return None
    return run / 1e9, own / 1e9, wait / 1e9


def _running_tasks(pids: list[int]) -> int:
    n = 0
    for pid in pids:
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    n += f.read().rsplit(")", 1)[1].split()[0] == "R"
        except OSError:
            continue
    return n


class RunQueueSampler:
    """Average number of runnable tasks on the host that are not ours (/proc/stat procs_running
    minus our processes' runnable threads and the sampler itself), sampled every `period_s`:
    the demand of co-located work, which CPU time used cannot show once the host is saturated.
    `stamped` keeps (wall clock, value) pairs to average over a window afterwards."""

    def __init__(self, pids: list[int], period_s: float = 0.02):
        import threading

        self.pids, self.period_s = pids, period_s
        self.samples: list[int] = []
        self.stamped: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                with open("/proc/stat") as f:
                    running = next(int(ln.split()[1]) for ln in f if ln.startswith("procs_running"))
            except (OSError, StopIteration):
                return
            v = max(0, running - 1 - _running_tasks(self.pids))
            self.samples.append(v)
            self.stamped.append((time.time(), v))

    def __enter__(self) -> "RunQueueSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None

    def mean_between(self, t0: float, t1: float) -> float | None:
        vals = [v for t, v in self.stamped if t0 <= t <= t1]
        return sum(vals) / len(vals) if vals else None


@dataclass(frozen=True)
class Case:
    arch: Arch
    plan: Plan
    batch: int


def _worker(rank: int, world: int, port: int, cases_json: str, steps: int, warmup: int, threads: int,
            out_path: str, device: str, coll_timeout_s: float = 180.0, pin: bool = False) -> None:
    """One rank: every case in order, the same on all ranks. Rank 0 rewrites `out_path` after every
    case, so a launch that fails keeps what it measured; a collective that waits longer than
    `coll_timeout_s` (a plan the runtime cannot run, stuck in mismatched collectives) fails the rank."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from arena_opt.profiling.speed import SpeedProbe
    from models.torch_layers import synthetic_batch
    from runners.parallelize import parallelize

    torch.set_num_threads(threads)
    if pin:  # rank r on core r mod cores: no migrations between the ranks' cores mid-step
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    # on GPUs the step's collectives take NCCL and the harness's own reductions (times, CPU seconds: CPU
    # tensors, which NCCL refuses) take gloo, one process group with both
    dist.init_process_group("cpu:gloo,cuda:nccl" if dev.type == "cuda" else "gloo",
                            init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=coll_timeout_s))
    probe = SpeedProbe(str(dev))
    results = []
    for case in json.loads(cases_json):
        arch, plan, batch = Arch.model_validate(case["arch"]), Plan.model_validate(case["plan"]), case["batch"]
        pm = parallelize(arch, plan, dev, "ddp", seed=0)
        opt = torch.optim.AdamW(pm.module.parameters(), lr=1e-4)
        times, probes, step_cpu, step_main, step_wait = [], [], [], [], []
        busy0 = cpu0 = wall0 = stamp0 = None
        if dev.type == "cuda":  # the case's own peak: what the planner's memory model predicts
            torch.cuda.reset_peak_memory_stats(dev)
        for step in range(warmup + steps):
            x, y = synthetic_batch(arch, step, batch)
            if step >= warmup:  # the host's speed beside this step, outside the timed window
                probes.append(probe.probe())
            dist.barrier()
            if step == warmup:  # other tenants' CPU use over the timed steps: host busy time minus ours
                busy0, cpu0, wall0, stamp0 = (host_busy_core_seconds(), time.process_time(), time.perf_counter(),
                                              time.time())
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            s0 = sched_times()
            t0 = time.perf_counter()
            pm.train_step(x, y)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            s1 = sched_times()
            # this step's CPU (all threads) and compute thread's run-queue delay, summed over the ranks (the
            # probe and the barriers are outside it): the CPU work an estimate predicts, and the share of
            # a core a runnable rank got
            sw = torch.tensor([b - a for a, b in zip(s0, s1)] if s0 and s1 else [float("nan")] * 3,
                              dtype=torch.float64)
            dist.all_reduce(dt, op=dist.ReduceOp.MAX)
            dist.all_reduce(sw)
            if step >= warmup:
                times.append(float(dt))
                step_cpu.append(float(sw[0]))
                step_main.append(float(sw[1]))
                step_wait.append(float(sw[2]))
        stamp1 = time.time()
        ours = torch.tensor([time.process_time() - cpu0], dtype=torch.float64)
        dist.all_reduce(ours)
        speed = torch.tensor([statistics.median(probes)], dtype=torch.float64)
        dist.all_reduce(speed)
        busy1, wall = host_busy_core_seconds(), time.perf_counter() - wall0
        peak = None
        if dev.type == "cuda":  # the largest rank's (CPU ranks share one process-wide heap: not per plan)
            peak_t = torch.tensor([torch.cuda.max_memory_allocated(dev)], dtype=torch.float64)
            dist.all_reduce(peak_t, op=dist.ReduceOp.MAX)
            peak = int(peak_t.item())
        ambient = None if busy0 is None or busy1 is None else max(0.0, (busy1 - busy0 - float(ours)) / wall)
        results.append({"plan": plan.model_dump(), "model": arch.name, "batch": batch, "times": times,
                        "iter_s": statistics.median(times), "own_cpu_s": float(ours),
                        "step_cpu_s": step_cpu, "step_main_cpu_s": step_main,
                        "step_wait_s": step_wait, "wall_s": wall,
                        "ambient_cores": ambient, "probe_s": float(speed) / world, "window": [stamp0, stamp1],
                        "peak_mem_bytes": peak,
                        "rank0_cores": sorted(os.sched_getaffinity(0))})
        del pm, opt
        dist.barrier()
        if rank == 0:
            tmp = out_path + ".tmp"
            Path(tmp).write_text(json.dumps(results))
            os.replace(tmp, out_path)
    dist.destroy_process_group()


def launch(module: str, world: int, args: list[str], timeout_s: float,
           sampler: RunQueueSampler | None = None, progress: tuple[str, float] | None = None) -> None:
    """Start `python -m module --rank r --world world ARGS` for every rank and wait for all; on a
    failure or timeout the ranks still running are terminated (only the processes started here).
    A `sampler` runs here while the ranks do, over their pids. `progress` = (path, seconds): the
    ranks rewrite `path` after every unit of work; when it stays unchanged that long they are taken
    for hung (a collective that never completes can outlast the process group's own timeout)."""
    import tempfile

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    # stderr to files: a rank that writes much (warnings) can never block on a full pipe while the
    # launcher polls the others
    logs = [tempfile.TemporaryFile("w+") for _ in range(world)]
    procs = [subprocess.Popen([sys.executable, "-m", module, "--rank", str(r), "--world", str(world), *args],
                              env=env, stdout=subprocess.DEVNULL, stderr=logs[r], text=True)
             for r in range(world)]
    if sampler is not None:
        sampler.pids = [p.pid for p in procs]
        sampler.__enter__()
    try:
        t0 = last = time.monotonic()
        seen = None
        while True:
            codes = [p.poll() for p in procs]  # every rank polled: a failed one is seen at once
            if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                break  # all done, or a failed rank leaves its peers waiting on it
            now = time.monotonic()
            if now - t0 > timeout_s:
                raise subprocess.TimeoutExpired(module, timeout_s)
            if progress is not None:
                try:
                    stamp = os.stat(progress[0]).st_mtime_ns
                except OSError:
                    stamp = None
                if stamp != seen:
                    seen, last = stamp, now
                elif now - last > progress[1]:
                    raise RuntimeError(f"{module}: hung: no progress in {progress[1]:.0f} s")
            time.sleep(0.2)
        grace = time.monotonic() + 5.0  # the failed rank's peers fail on its closed connection: let the
        for p in procs:                 # one that failed first be among those read
            try:
                p.wait(timeout=max(0.0, grace - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        errs = []
        for p, log in zip(procs, logs):
            if p.poll() is not None and p.returncode != 0:
                log.seek(0)
                err = log.read().strip()
                errs.append(err.splitlines()[-1] if err else f"exit {p.returncode}")
        if errs:
            # the rank that failed first names the cause; its peers only report the closed connection
            cause = next((e for e in errs if "closed by peer" not in e and "Connection reset" not in e), errs[0])
            raise RuntimeError(f"{module}: a rank failed: {cause}")
    finally:
        if sampler is not None:
            sampler.__exit__()
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
        for log in logs:
            log.close()


class LaunchFailed(RuntimeError):
    """A launch failed after measuring `done` (the results of the first cases, in order)."""

    def __init__(self, message: str, done: list[dict]):
        super().__init__(message)
        self.done = done


def measure_each(cases: list[Case], **kw) -> list[dict]:
    """`measure` in one launch; when a case fails, the cases measured before it are kept, the failing
    case gets {"error": message} instead of times and the cases after it run in a new launch."""
    out: list[dict] = []
    rest = list(cases)
    while rest:
        try:
            out += measure(rest, **kw)
            break
        except LaunchFailed as e:
            out += e.done
            bad = rest[len(e.done)]
            out.append({"plan": bad.plan.model_dump(), "model": bad.arch.name, "batch": bad.batch, "error": str(e)})
            rest = rest[len(e.done) + 1:]
    return out


def measure(cases: list[Case], *, steps: int = 5, warmup: int = 2, threads: int = 1, device: str = "cpu",
            timeout_s: float = 1800, coll_timeout_s: float = 180, case_timeout_s: float = 600,
            pin: bool = False) -> list[dict]:
    """Run every case (all of one world size) in one launch; returns one result dict per case. Raises
    `LaunchFailed` (with the results of the cases measured before the failure) if a rank fails, or
    if no case finishes within `case_timeout_s` (a hung plan)."""
    worlds = {c.plan.num_gpus for c in cases}
    if len(worlds) != 1:
        raise ValueError(f"cases of one launch must share a world size, got {sorted(worlds)}")
    world = worlds.pop()
    payload = json.dumps([{"arch": c.arch.model_dump(), "plan": c.plan.model_dump(), "batch": c.batch}
                          for c in cases])
    with tempfile.TemporaryDirectory() as d:
        cases_path, out = os.path.join(d, "cases.json"), os.path.join(d, "results.json")
        Path(cases_path).write_text(payload)
        sampler = RunQueueSampler([], period_s=0.05)
        failure = None
        try:
            launch("arena_opt.profiling.measure", world,
                   ["--port", str(free_port()), "--cases", cases_path, "--steps", str(steps), "--warmup",
                    str(warmup), "--threads", str(threads), "--out", out, "--device", device, "--coll-timeout",
                    str(coll_timeout_s), *(["--pin"] if pin else [])], timeout_s, sampler,
                   progress=(out, case_timeout_s))
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            failure = e
        results = json.loads(Path(out).read_text()) if Path(out).is_file() else []
    for r in results:
        r["ambient_runnable"] = sampler.mean_between(*r.pop("window"))
    if failure is not None or len(results) < len(cases):
        raise LaunchFailed(str(failure or "a rank exited before measuring every case"), results)
    return results


def _main() -> None:
    ap = argparse.ArgumentParser()
    for name, typ in (("--rank", int), ("--world", int), ("--port", int), ("--cases", str), ("--steps", int),
                      ("--warmup", int), ("--threads", int), ("--out", str), ("--device", str)):
        ap.add_argument(name, type=typ, required=True)
    ap.add_argument("--coll-timeout", type=float, default=180.0)
    ap.add_argument("--pin", action="store_true")
    a = ap.parse_args()
    _worker(a.rank, a.world, a.port, Path(a.cases).read_text(), a.steps, a.warmup, a.threads, a.out, a.device,
            a.coll_timeout, a.pin)


if __name__ == "__main__":
    _main()
