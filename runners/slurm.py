"""Slurm backend: the live loop's decisions carried out by Slurm.

One launch (generation) of a job = one heterogeneous `sbatch`, one component per placed node
(`--nodelist=NODE -N1 -n1 --gres=gpu:TYPE:N`), each running the torchrun command of
runners/launch.py under `srun --het-group=K`; each component's exit code goes to a file next to the
job's logs (accounting may be off on a site). Slurm picks the GPU indices: the runner reads them back
from `squeue --json` (`gres_detail` IDX) and reports them, in the snapshot's GPU indices
(Node.gpu_ids), as the job's placement.

Stopping (preempt, reshape, migrate) is the life cycle of runners/managed.py: a save-and-exit request
(every rank saves its checkpoint, torchrun exits 0); a launch that does not exit within the stop
timeout is `scancel`ed: SIGTERM, which also makes the ranks save, then SIGKILL after the cluster's
KillWait. A generation Slurm leaves pending (a foreign job took the GPUs first) is reported as
pending, so the next round re-plans it; the new decision replaces it unless it names the same
allocation. `cluster_nodes()` is the next snapshot's node list with Slurm's node states: a job on a DRAIN
node keeps running until a decision moves it; one on a DOWN node is re-planned from its last
checkpoint.

Names: a launch is the Slurm job `arena-TAG-NAME-gG`, NAME the job id's safe name (runners/names.py):
an id with spaces, newlines or `#SBATCH` in it can neither break the batch script's directives nor
look like another runner's job. Launches left running by a runner that was killed (its lock on the
work directory is gone with it) are found when the job is added again, by their working directory
(the job's directory): one with its launch record (runners/launch_record.py) is taken over as
the job's running launch, not relaunched; any other is stopped with SIGTERM, so its ranks save, and the
job resumes from that checkpoint (a record that exists but does not validate is a `launch_unrecorded`
event naming the file and the error). Either way it never runs twice.

A controller outage (slurmctld restarted or unreachable; the nodes' slurmd keep running the launches) is
ridden out: the runner keeps the last nodes, jobs and states it read, the exit codes still arrive as
files, and the outage and its end are two events. Every query with such a fallback is guarded twice: a
`scontrol ping` first, and a short timeout on the query itself (SlurmOptions.query_timeout_s), because a
query that got past the ping as the controller went waits until it is back (Slurm's client retries for
MessageTimeout, measured 9-18 s) and would leave the loop blind for the outage. While the controller is
away a launch is not submitted (LaunchDeferred: no crash counted, tried again at the next decision; an
sbatch that never reached slurmctld counts the same), and sbatch never gets the short timeout
(SlurmOptions.submit_timeout_s, 60 s). A submit cut short at that bound may have been accepted: it is
that generation's launch under its job name (unique to the runner, job and generation), adopted when
Slurm shows that name, cancelled by that name if a decision replaces it first, given up when Slurm answers
for SUBMIT_GRACE_S without it (each an `sbatch_unanswered` event). Before a submit, a Slurm job still
alive in the job's directory defers it too, and at every refresh any live Slurm job there that is not the
job's launch (a cut submit Slurm took after it was given up) is cancelled: one live Slurm job per job. A
scancel the controller did not take is owed: kept, recorded (`cancel_owed`) and sent when slurmctld
answers again (scancel is idempotent, so a cut one is sent again), before any submit; a scancel is sent
once (Slurm escalates it to SIGKILL after KillWait by itself). A pending launch a decision replaces is
cancelled with a plain scancel: slurmctld may start it before an owed cancel lands, and SIGTERM lets its
ranks save. An outage ends at the first query answered (a ping or a scancel taken does not end it: both
can answer while queries hang), so a controller that takes scancels but not queries is one outage.

The job directories (run, checkpoint, logs) must be on a file system all nodes share.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from pathlib import Path

from arena_opt.decision import Decision
from arena_opt.errors import InputError
from arena_opt.slurm.commands import (NOT_REACHED, TIMEOUT_S, SlurmCommandError, SlurmOptions, SlurmTimeout,
                                      controller_up, slurm)
from arena_opt.slurm.gres import GpuMap
from arena_opt.slurm.snapshot import SlurmJobView, SlurmView, build_snapshot
from arena_opt.snapshot import Node
from runners.base import ObservedJob, RunnerError
from runners.launch import NodeLaunch, node_launches
from runners.launch_record import LaunchFiles, LaunchRecordInvalid, read_launch_record
from runners.managed import LaunchDeferred, LaunchError, LaunchHandle, ManagedRunner, _Job
from runners.names import safe_name
from runners.progress import ProgressReader
from runners.spec import TrainSpec

TERMINAL = frozenset({"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                      "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"})
KILL_WAIT_GRACE_S = 60.0  # upper bound on the cluster's KillWait the runner waits out after scancel
# how long Slurm must answer without a cut submit before it counts as not accepted: slurmctld may still
# be working on the request when it answers a later query (Slurm's default MessageTimeout)
SUBMIT_GRACE_S = 10.0
# no `-` in a tag: the prefix arena-TAG- of one runner must never be a prefix of another's
TAG = re.compile(r"[A-Za-z0-9_]{1,32}")


def progress_steps(run_dir: str) -> float | None:
    """Steps done by a job arena-opt launched, from its progress file (None: no report yet)."""
    p = ProgressReader(run_dir, keep_events=False).poll()
    return float(p.step) if p.started else None


def read_view(gpu_map: GpuMap, partition: str | None = None, own=None, timeout: float = TIMEOUT_S) -> SlurmView:
    from arena_opt.slurm.commands import read_jobs, read_nodes

    return build_snapshot(read_nodes(timeout), read_jobs(timeout), gpu_map, partition=partition, own=own,
                          progress_of=progress_steps)


# In a launch's argv, the rendezvous port the batch script picks on the first node (see sbatch_script)
PORT_VAR = "ARENA_RDZV_PORT"
PORT_REF = "${%s}" % PORT_VAR


def _shell_word(arg: str) -> str:
    """`arg` quoted for bash, except the port reference, which bash must expand."""
    if PORT_REF not in arg:
        return shlex.quote(arg)
    return f'"${PORT_VAR}"'.join(shlex.quote(part) if part else "" for part in arg.split(PORT_REF))


def sbatch_script(launches: list[NodeLaunch], gres: dict[str, str], *, name: str, logs: list[str],
                  rc_files: list[str], batch_log: str) -> str:
    """The heterogeneous batch script of one launch: component K on node K of the placement.
    Where the launch's argv refers to PORT_REF, the script first picks that port on the node it runs on:
    Slurm runs a batch script on the first node of its first component, the node whose torchrun hosts the
    rendezvous, so the port is checked free where it is bound, not on the host that submitted the job."""
    lines = ["#!/bin/bash", f"#SBATCH --job-name={name}", f"#SBATCH --output={shlex.quote(batch_log)}"]
    for k, nl in enumerate(launches):
        if k:
            lines.append("#SBATCH hetjob")
        lines.append(f"#SBATCH --nodelist={nl.node_id} --nodes=1 --ntasks=1 --cpus-per-task=1 "
                     f"--gres=gpu:{gres[nl.node_id]}:{nl.nproc}")
    if any(PORT_REF in a for nl in launches for a in nl.argv):
        lines.append("# the rendezvous port, free on this node (the first of the launch) now")
        lines.append(f"{PORT_VAR}=$({shlex.join([sys.executable, '-m', 'runners.launch', '--free-port'])}) "
                     f"|| {{ echo 'no free rendezvous port on this node' >&2; exit 1; }}")
        lines.append(f'echo "rendezvous port ${PORT_VAR} on $(hostname)"')
    lines.append("# Slurm sets CUDA_VISIBLE_DEVICES to the GPUs it picked; the exit code of each node's torchrun")
    lines.append("# goes to its rc file (accounting may be off)")
    for k, nl in enumerate(launches):
        env = [f"{key}={val}" for key, val in sorted(nl.env.items())]
        group = [f"--het-group={k}"] if len(launches) > 1 else []  # one node: not a heterogeneous job
        cmd = " ".join(_shell_word(a) for a in ["srun", *group, f"--output={logs[k]}", "env", *env, *nl.argv])
        lines.append(f"( {cmd}; echo $? > {shlex.quote(rc_files[k])} ) &")
    lines.append("wait")
    return "\n".join(lines) + "\n"


class ControllerAway(InputError):
    """slurmctld does not answer and Slurm has said nothing yet that could stand in for its answer."""


class Controller:
    """Whether slurmctld answers, the lost/back events when that changes, the guard of every query that
    has a fallback (`ask`) and the scancels owed while it is away. A ping costs ~20 ms, while a query to a
    controller that is down waits out Slurm's MessageTimeout first (measured 63 s per status call before
    the ping); the query timeout covers a query that passed the ping as the controller went. The outage
    ends at the first query answered again (a ping alone can answer while queries still hang)."""

    def __init__(self, emit, timeout_s: float = SlurmOptions().query_timeout_s) -> None:
        self._emit = emit  # (kind, message, **details)
        self.timeout_s = timeout_s
        self.down_since: float | None = None
        self._owed: dict[tuple[str, ...], float] = {}  # scancel argv -> since when it is owed
        self._asked: set[tuple[str, ...]] = set()  # every scancel argv sent or owed

    def up(self) -> bool:
        """Whether `scontrol ping` answers now (scancels owed are sent first when it does)."""
        up = controller_up(self.timeout_s)
        if not up:
            self.lost("slurmctld does not answer `scontrol ping`")
        elif self._owed:
            self._send_owed()
        return up

    def lost(self, why: str, unanswered_s: float = 0.0) -> None:
        if self.down_since is None:
            self.down_since = time.time() - unanswered_s  # a timed-out query went unanswered since it was sent
            self._emit("controller_lost", f"{why}: launches keep running on their nodes; the runner keeps what "
                       "Slurm said last and waits", reason=why)

    def _answered(self) -> None:
        if self.down_since is not None:
            now = time.time()
            self._emit("controller_back", f"slurmctld answers again after {now - self.down_since:.0f} s",
                       outage_s=now - self.down_since)
            self.down_since = None

    def ask(self, query, last):
        """query(timeout)'s answer, or `last` (what Slurm said last) while slurmctld is away: the ping fails,
        or the query does not answer within the timeout, or it fails while the ping fails too. Another
        failure is raised; so is ControllerAway when the controller is away and `last` is None."""
        if self.up():
            try:
                out = query(self.timeout_s)
            except SlurmTimeout as e:
                self.lost(f"`{' '.join(e.argv)}` got no answer within {e.timeout:g} s", e.timeout)
            except InputError:  # a failed command, or squeue's JSON error list when slurmctld is gone
                if self.up():
                    self._answered()
                    raise
            else:
                self._answered()
                return out
        if last is None:
            raise ControllerAway("slurmctld does not answer and Slurm has said nothing yet the runner could go on "
                                 "from")
        return last

    def cancel(self, argv: list[str]) -> bool:
        """Send a scancel; while the controller is away (or when it goes during the call) it is owed instead,
        recorded and sent when slurmctld answers again. True when Slurm took it (or refused it: the job
        is gone already)."""
        # a scancel taken does not end an outage: slurmctld can take one while its queries still hang,
        # and an outage ended by each cancel and begun again by the next query is one lost/back pair
        # per round for what an operator sees as one outage
        self._asked.add(tuple(argv))
        if self.up():
            try:
                slurm(*argv, timeout=self.timeout_s)
                return True
            except SlurmTimeout as e:
                self.lost(f"`{' '.join(e.argv)}` got no answer within {e.timeout:g} s", e.timeout)
            except SlurmCommandError as e:
                if NOT_REACHED not in e.slurm_message and self.up():
                    return True  # Slurm's refusal: the job is over already
        key = tuple(argv)
        if key not in self._owed:
            self._owed[key] = time.time()
            self._emit("cancel_owed", f"`{' '.join(argv)}` not taken while slurmctld is away: sent when it "
                       "answers again", command=list(argv), sent=False)
        return False

    def owes(self, target: str) -> bool:
        """Whether a scancel of this Slurm job (an id, or `--name=NAME`) is still owed."""
        return any(k[-1] == target for k in self._owed)

    def asked(self, target: str | list[str]) -> bool:
        """Whether this scancel (an argv), or any scancel of this Slurm job (an id, `--name=NAME`), was sent
        or is owed. Slurm escalates a cancel to SIGKILL after KillWait by itself: the same one again adds
        nothing but a second SIGTERM to ranks that are saving."""
        if isinstance(target, list):
            return tuple(target) in self._asked
        return any(k[-1] == target for k in self._asked)

    def _send_owed(self) -> None:
        for key, since in list(self._owed.items()):
            try:
                slurm(*key, timeout=self.timeout_s)
            except SlurmTimeout:
                return  # away again: the next answer sends the rest
            except SlurmCommandError as e:
                if NOT_REACHED in e.slurm_message:
                    return
                # any other refusal: the job is over already
            del self._owed[key]
            self._emit("cancel_owed", f"`{' '.join(key)}` sent {time.time() - since:.0f} s late, now that "
                       "slurmctld answers", command=list(key), sent=True)


UNNAMED = "a Slurm launch without a Slurm id needs its job name and the runner's controller"


class SlurmLaunch(LaunchHandle):
    """One Slurm job (all components of the heterogeneous job) running one launch of a job. A launch whose
    sbatch got no answer has no Slurm id yet (`slurm_id` None, `cut_at` when the submit was cut): it is
    the Slurm job named `name` if Slurm accepted it, which the runner looks for (SlurmRunner._reconcile);
    until then it counts as pending and is cancelled by that name."""

    def __init__(self, slurm_id: str | None, rc_files: list[Path], log_paths: list[str],
                 controller: Controller | None = None, name: str | None = None,
                 cut_at: float | None = None) -> None:
        if slurm_id is None and (controller is None or name is None):
            # found and cancelled by its name, through the controller that owes the cancel while it is away
            raise RunnerError(UNNAMED)
        self.slurm_id = slurm_id
        self.rc_files = rc_files
        self.log_paths = log_paths
        self.devices: dict[str, list[int]] = {}
        self.controller = controller
        self.name = name
        self.cut_at = cut_at
        self._last: set[str] | None = None  # what Slurm said last: the answer while the controller is down

    def states(self) -> set[str]:
        """Slurm states of the components; empty once Slurm forgot the job. With a controller: what Slurm
        said last while it is away (ControllerAway if it said nothing yet)."""
        if self.slurm_id is None:
            return {"PENDING"}  # not known to have started: what a decision may replace
        if self.controller is None:
            return self._query(TIMEOUT_S)
        self._last = self.controller.ask(self._query, self._last)
        return self._last

    def _query(self, timeout: float) -> set[str]:
        try:
            out = slurm("squeue", "-h", "-j", self.slurm_id, "-o", "%T", timeout=timeout)
        except SlurmCommandError as e:
            if "Invalid job id" in e.slurm_message:
                return set()
            raise
        return set(out.split())

    def pending(self) -> bool:
        try:
            return self.states() == {"PENDING"}
        except ControllerAway:
            return False  # not known to be pending

    def poll(self) -> list[int | None]:
        rcs = [_read_rc(p) for p in self.rc_files]
        if all(rc is not None for rc in rcs):
            return rcs
        try:
            st = self.states()
        except ControllerAway:
            return rcs  # nothing known of it yet: not over
        if st and not st <= TERMINAL:
            return rcs
        # the job is over but a component wrote no exit code: it was killed (node failure, scancel)
        time.sleep(0.2)  # an rc file written as the job ended
        return [rc if rc is not None else (_read_rc(p) if _read_rc(p) is not None else -1)
                for rc, p in zip(rcs, self.rc_files)]

    def _cancel_and_wait(self, args: list[str], timeout: float) -> None:
        c = self.controller
        if self.slurm_id is None:
            # by its name: Slurm may hold it under an id the runner never heard (or take it later, which
            # the runner's reconciling of its jobs' directories catches)
            if c is None or self.name is None:
                raise RunnerError(UNNAMED)  # refused by __init__ already: only a handle changed since gets here
            if not c.asked(argv := ["scancel", *args, f"--name={self.name}"]):
                c.cancel(argv)
            return
        argv = ["scancel", *args, self.slurm_id]
        if c is None:
            try:
                slurm(*argv)
            except SlurmCommandError:
                pass  # already gone
        elif c.owes(self.slurm_id) or (not c.asked(argv) and not c.cancel(argv)):
            return  # owed: Slurm's states stand still until the controller is back
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                st = self.states()
            except ControllerAway:
                return
            if not st or st <= TERMINAL or (c is not None and c.down_since is not None):
                return
            time.sleep(0.2)

    def terminate(self, timeout: float) -> None:
        # SIGTERM to every step (the ranks save), SIGKILL after KillWait
        self._cancel_and_wait([], timeout + KILL_WAIT_GRACE_S)

    def kill(self) -> None:
        self._cancel_and_wait(["--signal=KILL", "--full"], 10.0)
        self._cancel_and_wait([], KILL_WAIT_GRACE_S)


def _generation_of(j: _Job, v: SlurmJobView) -> int | None:
    """G of a Slurm job named arena-TAG-NAME-gG, a launch of j by any runner; None for any other name."""
    m = re.fullmatch(rf"arena-{TAG.pattern}-{re.escape(safe_name(j.spec.job_id))}-g(\d+)", v.name)
    return int(m.group(1)) if m else None


def _read_rc(p: Path) -> int | None:
    try:
        return int(p.read_text().strip())
    except (OSError, ValueError):
        return None


class SlurmRunner(ManagedRunner):
    def __init__(self, workdir: str | Path, *, gpu_map: GpuMap | None = None, partition: str | None = None,
                 tag: str | None = None, options: SlurmOptions | None = None, **kw) -> None:
        # the runner's own Slurm jobs are named arena-TAG-...: neither occupants nor snapshot jobs
        self.tag = tag or f"{os.getpid()}"
        if not TAG.fullmatch(self.tag):
            raise ValueError(f"runner tag {self.tag!r}: letters, digits and _ only, at most 32")
        super().__init__(workdir, **kw)
        self.gpu_map = gpu_map or GpuMap.load()
        self.partition = partition
        self._view: SlurmView | None = None
        self._view_t = 0.0
        self._first_view: SlurmView | None = None
        self._held: set[str] = set()  # Slurm ids of this runner's launches
        self._taken: set[str] = set()  # those of them an earlier runner submitted
        self._cut = False  # whether a submit ever went unanswered (Slurm may take it late)
        self.options = options or SlurmOptions()
        self.controller = Controller(lambda kind, msg, **kw: self._emit(kind, None, msg, **kw),
                                     self.options.query_timeout_s)

    # ------------------------------------------------------------------ what Slurm shows

    def _own(self, v: SlurmJobView) -> bool:
        return v.name.startswith(f"arena-{self.tag}-") or str(v.slurm_id) in self._taken

    def view(self, max_age_s: float = 0.5) -> SlurmView:
        if self._view is None or time.time() - self._view_t > max_age_s:
            v = self.controller.ask(self._read_view, self._view)
            if v is not self._view:  # a new answer, not what Slurm said last
                self._view, self._view_t = v, time.time()
        return self._view

    def _read_view(self, timeout: float) -> SlurmView:
        return read_view(self.gpu_map, self.partition, own=self._own, timeout=timeout)

    def cluster_nodes(self) -> list[Node]:
        return list(self.view(max_age_s=0).snapshot.nodes)

    # ------------------------------------------------------------------ launches of an earlier runner

    def add_job(self, job) -> None:
        super().add_job(job)
        self._stop_leftovers(self.jobs[job.job_id])

    def _stop_leftovers(self, j: _Job) -> None:
        """What an earlier runner of this work directory left running for this job (the job is not running
        here yet, so every live Slurm job working in its directory is such a launch): one launch with its
        launch record is taken over as the job's current launch, not relaunched; any other is stopped
        (saving) and the job resumes from its newest checkpoint."""
        if self._first_view is None:
            # one read for every job added: the workdir lock means no runner of this directory has
            # launched anything since this one started, so a leftover is already in the first view
            self._first_view = self.view(max_age_s=0)
        root = str(j.root.resolve())
        left = [v for v in self._first_view.jobs.values()
                if v.components[0].current_working_directory == root
                and not {c.state for c in v.components} <= TERMINAL]
        if len(left) == 1 and self._take_over(j, left[0]):
            return
        for v in left:
            h = SlurmLaunch(str(v.slurm_id), [], [])
            if not (st := h.states()) or st <= TERMINAL:
                continue  # ended on its own since the first view
            if (g := _generation_of(j, v)) is not None:
                j.generation = max(j.generation, g + 1)  # its logs, exit codes and record stay as they are
            h.terminate(self.stop_timeout_s)
            st = h.states()
            gone = not st or st <= TERMINAL
            self._emit("exit", j, f"Slurm job {v.slurm_id} ({v.name}), a launch an earlier runner left running, "
                       + ("stopped: its ranks saved; the job resumes from its newest checkpoint" if gone
                          else "did not stop within the stop timeout"),
                       leftover=True, slurm_id=v.slurm_id, stopped=gone)
            if not gone:
                raise RunnerError(f"job {j.spec.job_id}: Slurm job {v.slurm_id} of an earlier runner still runs "
                                  "in its directory; cancel it (`scancel`) before starting the job again")
        if left:
            self._view = None

    def _take_over(self, j: _Job, v: SlurmJobView) -> bool:
        """An earlier runner's launch of j, named arena-TAG-NAME-gG with the record of launch G, becomes j's
        current launch (it goes on with its ranks and GPUs; the next decision keeps or moves it). False
        when it cannot be read as one (no record, or one that is not this launch's: it is stopped instead,
        and a record that exists but does not fit is a `launch_unrecorded` event saying why)."""
        g = _generation_of(j, v)
        if g is None:
            return False
        try:
            rec = read_launch_record(j.root, g)
            if rec is not None and len(rec.placement) != len(v.components):
                raise LaunchRecordInvalid(LaunchFiles(j.root, g).record, f"{len(rec.placement)} node(s) in its "
                                          f"placement, {len(v.components)} in Slurm job {v.slurm_id}")
        except LaunchRecordInvalid as e:
            self._emit("launch_unrecorded", j, f"Slurm job {v.slurm_id} ({v.name}), a launch an earlier runner left "
                       f"running, is stopped, not taken over: its record {e}", slurm_id=v.slurm_id,
                       record=str(e.path), error=e.error)
            return False
        if rec is None:
            return False
        files = LaunchFiles(j.root, g)
        rc_files = [files.exit_code(k) for k in range(len(rec.placement))]
        logs = [str(files.node_log(n)) for n in rec.placement]
        sid = str(v.slurm_id)
        self._held.add(sid)
        self._taken.add(sid)  # the runner's own from now on: not an occupant of the snapshot
        self._view_t = 0.0
        self._running(j, SlurmLaunch(sid, rc_files, logs, self.controller), g, rec.gpu_type, rec.placement, rec.plan,
                      f", Slurm job {sid} ({v.name}) an earlier runner left running: taken over, not relaunched",
                      relaunch=False, taken_over=True, slurm_id=v.slurm_id)
        return True

    # ------------------------------------------------------------------ ManagedRunner hooks

    def _start(self, job: _Job, spec: TrainSpec, placement: dict[str, list[int]]) -> LaunchHandle:
        if not self.controller.up():  # owed scancels are sent first once it answers
            raise LaunchDeferred("slurmctld does not answer: not submitted")
        view = self.view(max_age_s=0)
        if self.controller.down_since is not None:
            raise LaunchDeferred("slurmctld went away while its nodes and jobs were read: not submitted")
        root = str(job.root.resolve())
        alive = [v for v in view.jobs.values() if v.components[0].current_working_directory == root
                 and not {c.state for c in v.components} <= TERMINAL]
        if alive:
            # one launch of a job at a time: a cancel still owed or taking effect, or a submit whose
            # answer was lost
            for v in alive:
                self._cancel_once(v)
            raise LaunchDeferred(f"Slurm job(s) {', '.join(str(v.slurm_id) for v in alive)} of this job still "
                                 "alive in its directory: cancelled, not submitted until they are gone")
        missing = [n for n in placement if n not in view.gres_type]
        if missing:
            raise LaunchError(f"node(s) {', '.join(missing)} not offered by Slurm now "
                              f"({'; '.join(view.left_out.get(n, 'unknown node') for n in missing)})")
        first = view.nodes[next(iter(placement))]
        endpoint = f"{first.address or first.name}:{PORT_REF}"  # picked on that node by the batch script
        launches = node_launches(spec, placement, endpoint, use_gpus=False)
        g = spec.generation
        files = LaunchFiles(job.root, g)
        logs = [str(files.node_log(n)) for n in placement]
        rc_files = [files.exit_code(k) for k in range(len(launches))]
        for p in rc_files:
            p.parent.mkdir(parents=True, exist_ok=True)
            p.unlink(missing_ok=True)
        name = f"arena-{self.tag}-{safe_name(spec.job_id)}-g{g}"
        script = sbatch_script(launches, view.gres_type, name=name, logs=logs,
                               rc_files=[str(p) for p in rc_files], batch_log=str(files.batch_log))
        path = files.batch_script
        path.write_text(script)
        try:
            # Slurm's own bound, not the query timeout: a submit cut short may have been accepted
            out = slurm("sbatch", "--parsable", f"--chdir={job.root}", str(path), timeout=self.options.submit_timeout_s)
        except SlurmTimeout as e:
            # Slurm may have taken it: this is launch g under its name (the name of no other submit), found
            # and adopted, or cancelled if a decision replaces it first, or given up once Slurm answers
            # without it; never submitted again under another generation while it may exist
            self._cut = True
            self.controller.lost(f"`sbatch` got no answer within {e.timeout:g} s", e.timeout)
            self._emit("sbatch_unanswered", job, f"launch {g}: sbatch got no answer within {e.timeout:g} s; Slurm "
                       f"may have accepted it: it is looked for as {name}", outcome="unknown", generation=g, name=name)
            return SlurmLaunch(None, rc_files, logs, self.controller, name=name, cut_at=time.time())
        except SlurmCommandError as e:
            if NOT_REACHED in e.slurm_message:
                self.controller.up()  # records the outage
                raise LaunchDeferred(f"sbatch did not reach slurmctld ({e.slurm_message}): not submitted") from None
            raise LaunchError(f"sbatch refused the launch: {e.slurm_message}") from None
        slurm_id = out.strip().split(";")[0]
        self._held.add(slurm_id)
        self._view_t = 0.0  # Slurm's job list changed: the next view is read again (the last one stays the fallback)
        return SlurmLaunch(slurm_id, rc_files, logs, self.controller)

    # ------------------------------------------------------------------ pending generations, real GPUs

    def apply(self, decision: Decision) -> None:
        self._reconcile()
        by_job = decision.by_job()
        for jid, j in self.jobs.items():
            h = j.handle
            jd = by_job.get(jid)
            if not isinstance(h, SlurmLaunch) or j.state != "running" or jd is None or not h.pending():
                continue
            if jd.runs and (jd.gpu_type, jd.placement, jd.plan) == (j.gpu_type, j.placement, j.plan):
                continue  # still waiting for the same GPUs
            # the new decision replaces it. A plain scancel, not SIGKILL: one owed while slurmctld is away
            # lands when it is back, and slurmctld may have started the launch first; SIGTERM lets its
            # ranks save (a pending job is cancelled at once either way)
            h.terminate(self.stop_timeout_s)
            self._drop(j, f"launch {j.generation - 1} left pending by Slurm")
        super().apply(decision)

    def _cancel_once(self, v: SlurmJobView) -> bool:
        """scancel (SIGTERM: its ranks save) of a Slurm job found alive in a job's directory, once: sent or
        owed, or the job already ending (COMPLETING: cancelled by its name, say), it is not sent again each
        round while its ranks save. False when nothing was sent."""
        if {c.state for c in v.components} <= TERMINAL | {"COMPLETING"} or self.controller.asked(str(v.slurm_id)):
            return False
        self.controller.cancel(["scancel", str(v.slurm_id)])
        return True

    def _drop(self, j: _Job, why: str) -> None:
        """The current launch never ran here: the job waits for the next decision."""
        j.handle, j.state, j.message = None, "pending", why
        j.timeline.append(("exited", time.time()))

    def _refresh(self) -> None:
        self._reconcile()
        super()._refresh()

    def _reconcile(self) -> None:
        """One live Slurm job per job, the one the runner holds: a launch whose sbatch got no answer is
        adopted when Slurm shows it under its name, or given up when Slurm, answering after the cut for
        SUBMIT_GRACE_S, does not; any other live Slurm job in a job's directory (a cut submit Slurm took
        after it was given up or replaced) is cancelled, SIGTERM first so its ranks save."""
        if not self._cut:
            return  # every submit was answered: the guard before each submit keeps one launch per job
        try:
            view = self.view()
        except ControllerAway:
            return  # nothing to go on yet
        answered = self.controller.down_since is None
        unresolved = [(j, h) for j in self.jobs.values() if isinstance(h := j.handle, SlurmLaunch)
                      and h.slurm_id is None and h.cut_at is not None]
        for j, h in unresolved:
            found = [v for v in view.jobs.values() if v.name == h.name]
            if found:
                h.slurm_id = str(found[0].slurm_id)
                self._held.add(h.slurm_id)
                self._emit("sbatch_unanswered", j, f"launch {j.generation - 1}: Slurm accepted the submit whose "
                           f"answer was lost, as job {h.slurm_id}: adopted", outcome="adopted",
                           generation=j.generation - 1, slurm_id=h.slurm_id)
            elif answered and self._view_t - h.cut_at >= SUBMIT_GRACE_S and not any(_read_rc(p) is not None
                                                                                   for p in h.rc_files):
                h.terminate(0.0)  # by name: a submit Slurm takes from here on is not run
                self._drop(j, f"launch {j.generation - 1} not accepted by Slurm (its sbatch got no answer)")
                self._emit("sbatch_unanswered", j, f"launch {j.generation - 1}: not in Slurm's jobs "
                           f"{self._view_t - h.cut_at:.0f} s after the cut: not accepted; the next decision "
                           "launches the job again", outcome="not_accepted", generation=j.generation - 1)
        by_root = {str(j.root.resolve()): j for j in self.jobs.values()}
        for v in view.jobs.values():
            j = by_root.get(v.components[0].current_working_directory or "")
            # a launch the runner held is cancelled through its handle (and waited for, or owed)
            if j is None or str(v.slurm_id) in self._held or {c.state for c in v.components} <= TERMINAL:
                continue
            if isinstance(j.handle, SlurmLaunch) and j.handle.slurm_id is None:
                continue  # it may be that launch, under a name not yet seen
            if self._cancel_once(v):
                self._emit("exit", j, f"Slurm job {v.slurm_id} ({v.name}) is not the job's launch: cancelled, so "
                           "one Slurm job runs the job", stray=True, slurm_id=v.slurm_id)

    def status(self) -> list[ObservedJob]:
        out = super().status()
        view = self.view()
        for i, o in enumerate(out):
            j = self.jobs[o.job_id]
            h = j.handle
            if o.state != "running" or not isinstance(h, SlurmLaunch):
                continue
            v = view.jobs.get(int(h.slurm_id)) if h.slurm_id is not None else None
            if v is None or v.state == "PENDING":
                # waiting for GPUs: not running, so the next round re-plans it
                out[i] = o.model_copy(update={"state": "pending", "placement": {}, "num_gpus": 0, "plan": None,
                                              "message": f"Slurm job {h.slurm_id or h.name} pending"})
                continue
            placement = self._placement(v.devices)
            if placement is not None:
                j.placement = placement
                h.devices = v.devices
                out[i] = o.model_copy(update={"placement": placement})
        return out

    def _placement(self, devices: dict[str, list[int]]) -> dict[str, list[int]] | None:
        """Slurm's device indices as snapshot GPU indices (None if a node is not offered now, or Slurm lists
        no devices, as for a job that is completing: its placement stays what it was)."""
        if not devices:
            return None
        nodes = {n.id: n for n in self.view().snapshot.nodes}
        out = {}
        for node, idx in devices.items():
            n = nodes.get(node)
            if n is None:
                return None
            ids = n.gpu_ids or list(range(n.num_gpus))
            if any(d not in ids for d in idx):
                return None
            out[node] = sorted(ids.index(d) for d in idx)
        return out

    def slurm_id(self, job_id: str) -> str | None:
        h = self.jobs[job_id].handle
        return h.slurm_id if isinstance(h, SlurmLaunch) else None
