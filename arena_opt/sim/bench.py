"""`arena-opt bench`: the same trace and cluster through several policies, one process each, then
the Markdown table and the plots."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from arena_opt.errors import Interrupted
from arena_opt.io import atomic_write, write_json
from arena_opt.policies import check_name
from arena_opt.sim.config import RunConfig, user_plan_cache, warm_plan_cache
from arena_opt.sim.plots import plot_all
from arena_opt.sim.results import markdown_table

ALL = ["fcfs", "gavel", "sia", "elasticflow", "arena-greedy", "arena"]


def parse_policies(text: str) -> list[str]:
    names = ALL if text == "all" else [p.strip() for p in text.split(",") if p.strip()]
    for p in names:
        check_name(p, "--policies: ")
    return names


def run_bench(base: RunConfig, policies: list[str], out_dir: str | Path, *, parallel: int = 1,
              show_progress: bool = True, timeout_s: float | None = None,
              policy_options: dict[str, dict] | None = None, bound=None) -> tuple[list[dict], dict]:
    """`policy_options`: per policy, overrides of its options (RunConfig.policy_options); default: base's.
    `bound`: BoundOptions of the LP lower bound on average JCT, computed after the policies of a run to
    completion and set beside each of them (`lp_bound_s`, `jct_over_lp_bound`); None: no bound."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    info: dict = {"policies": policies, "failed": {}}
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "plans.json"
        info["plan_warmup_s"] = warm_plan_cache(base, cache)
        user = user_plan_cache()
        if user is not None and cache.is_file():
            try:  # the next bench or simulate on this machine starts warm
                user.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(cache, user)
            except OSError:
                pass
        jobs = []
        for p in policies:
            opts = base.policy_options if policy_options is None else policy_options.get(p, {})
            cfg = base.model_copy(update={"policy": p, "plan_cache": str(cache), "policy_options": opts})
            cfg_path = Path(tmp) / f"{p}.json"
            cfg_path.write_text(cfg.model_dump_json())
            jobs.append((p, cfg_path, out_dir / f"{p}.json"))
        walls = _run_workers(jobs, parallel, show_progress, timeout_s, info)
    info["process_wall_s"] = walls
    results = []
    status: dict[str, str] = {}
    not_run = info.get("not_run", [])
    for p, _, out in jobs:
        if p in not_run:
            status[p] = f"not run (interrupted by {info['interrupted']['signal']})"
        elif p in info["failed"]:
            status[p] = f"failed: {info['failed'][p]}"
        elif p in walls and out.is_file():  # finished in this bench: an older file is not its result
            results.append(json.loads(out.read_text()))
            status[p] = "finished"
        else:
            status[p] = "no result"
    if bound is not None and base.rounds is None and not not_run and results:
        info["bound"] = attach_bound(base, bound, results, out_dir)
    write_json(out_dir / "status.json", status)
    lines = [markdown_table(results)] if results else []
    lines += [f"- {p}: {s}" for p, s in status.items() if s != "finished"]
    atomic_write(out_dir / "results.md", "\n\n".join(lines) + "\n")
    if results:
        info["plots"] = [str(x) for x in plot_all(results, out_dir)]
    info["status"] = status
    return results, info


def attach_bound(base: RunConfig, options, results: list[dict], out_dir: Path) -> dict:
    """The LP bound of the setup written to bound.json and set beside every result whose jobs all
    finished (the bound is on the average over every runnable job, so only those compare)."""
    from arena_opt.sim.bound import config_bound

    res, record = config_bound(base, options)
    write_json(out_dir / "bound.json", record)
    for r in results:
        complete = r["finished"] == r["jobs"] - r["rejected"] and r["finished"] == res.jobs
        r["lp_bound_s"] = res.avg_jct_bound_s
        r["jct_over_lp_bound"] = (r["avg_jct_s"] / res.avg_jct_bound_s
                                  if complete and res.avg_jct_bound_s and r["avg_jct_s"] is not None else None)
    return record


def _run_workers(jobs, parallel: int, show_progress: bool, timeout_s, info) -> dict[str, float]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    walls: dict[str, float] = {}
    state: dict[str, tuple[int, int]] = {}
    pending = list(jobs)
    running: dict[str, tuple] = {}

    def reader(p, stream):  # progress lines from one worker
        for line in stream:
            parts = line.split()
            if len(parts) == 3 and parts[0] == "progress":
                state[p] = (int(parts[1]), int(parts[2]))

    with Progress(TextColumn("{task.description:>14}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=not show_progress) as prog:
        tasks = {p: prog.add_task(p, total=None, start=False) for p, _, _ in jobs}
        try:
            while pending or running:
                while pending and len(running) < max(1, parallel):
                    p, cfg_path, out = pending.pop(0)
                    err = open(cfg_path.with_suffix(".err"), "w+")
                    proc = subprocess.Popen([sys.executable, "-m", "arena_opt.sim.worker", str(cfg_path), str(out)],
                                            stdout=subprocess.PIPE, stderr=err, text=True, env=env)
                    th = threading.Thread(target=reader, args=(p, proc.stdout), daemon=True)
                    th.start()
                    prog.start_task(tasks[p])
                    running[p] = (proc, time.perf_counter(), err, th)
                for p, (proc, t0, err, th) in list(running.items()):
                    if p in state:
                        prog.update(tasks[p], completed=state[p][0], total=state[p][1])
                    timed_out = timeout_s is not None and time.perf_counter() - t0 > timeout_s
                    if timed_out:
                        proc.kill()
                    if proc.poll() is None:
                        continue
                    walls[p] = time.perf_counter() - t0
                    th.join(timeout=5)
                    err.seek(0)
                    lines = err.read().strip().splitlines()
                    err.close()
                    if timed_out:
                        info["failed"][p] = f"timed out after {timeout_s:.0f} s"
                    elif proc.returncode != 0:
                        info["failed"][p] = lines[-1] if lines else f"exit code {proc.returncode}"
                    if p in info["failed"]:
                        prog.update(tasks[p], description=f"{p} FAILED")
                    elif p in state:
                        prog.update(tasks[p], completed=state[p][0], total=state[p][1])
                    del running[p]
                time.sleep(0.1)
        except KeyboardInterrupt as e:
            # stop what runs (their result files are written atomically: none is left half-way) and
            # say which policies did not run; the finished ones keep their results
            for proc, *_ in running.values():
                proc.kill()
                proc.wait()
            info["interrupted"] = {"signal": str(e) if isinstance(e, Interrupted) else "SIGINT",
                                   "exit_code": e.exit_code if isinstance(e, Interrupted) else 130}
            info["not_run"] = [*running, *(p for p, _, _ in pending)]
    return walls
