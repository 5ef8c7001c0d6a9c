"""A throwaway Slurm cluster on this host for the tests: munged (as user munge, own key and
socket), slurmctld and one slurmd per node (own port, spool, pid and log files), typed fake
GPUs (gres.conf `File=` on /dev/tty* device files), a rack feature per node. Everything lives
in one temporary directory; `stop()` cancels every job, then ends each daemon it started by
pid. Facts behind the configuration: ../shared/MEASURED.md (Slurm on one host).

    python tests/slurm_cluster.py        # start one by hand; prints `export SLURM_CONF=...`, Ctrl-C stops it
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from runners.launch import free_port

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "scancel")
INSTALL_HINT = "apt-get update && apt-get install -y slurm-wlm munge (as root)"

# name -> (GRES type, GPUs, rack); two types, two racks
DEFAULT_NODES = {"n1": ("a100", 4, "r1"), "n2": ("a100", 4, "r1"),
                 "n3": ("v100", 4, "r2"), "n4": ("v100", 4, "r2")}
KILL_WAIT_S = 30  # scancel's grace between SIGTERM and SIGKILL: longer than a checkpoint save


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]


def unavailable_reason() -> str | None:
    """Why no cluster can be started here (None = it can)."""
    missing = missing_binaries()
    if missing:
        return f"Slurm binaries not found ({', '.join(missing)}): {INSTALL_HINT}"
    if os.geteuid() != 0:
        return "the test cluster runs slurmd as root (jobs of any user); run the Slurm tests as root"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return f"user munge missing: {INSTALL_HINT}"
    return None


def _exe(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


@dataclass
class SlurmCluster:
    nodes: dict[str, tuple[str, int, str]] = field(default_factory=lambda: dict(DEFAULT_NODES))
    root: Path | None = None
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        assert self.root is not None
        return self.root / "etc" / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self) -> "SlurmCluster":
        # /tmp, not pytest's tmp_path: munged runs as user munge and must reach its directories
        self.root = Path(tempfile.mkdtemp(prefix="arena-slurm-"))
        self.root.chmod(0o755)
        try:
            self._write_config()
            self._start_daemons()
            self.wait_nodes_idle()
        except BaseException:
            self.stop()
            raise
        return self

    def _write_config(self) -> None:
        r = self.root
        assert r is not None
        for d in ("etc", "state", "spool", "run", "log", "munge"):
            (r / d).mkdir()
        munge = pwd.getpwnam("munge")
        mdir = r / "munge"
        (mdir / "munge.key").write_bytes(os.urandom(1024))
        (mdir / "munge.key").chmod(0o400)
        for p in (mdir, mdir / "munge.key"):
            os.chown(p, munge.pw_uid, munge.pw_gid)
        mdir.chmod(0o700)
        host = socket.gethostname().split(".")[0]
        lines = [
            "ClusterName=arenatest",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={mdir / 'munge.socket'}",
            "SlurmUser=root", "SlurmdUser=root",
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool'}/%n",
            f"SlurmctldPidFile={r / 'run'}/slurmctld.pid", f"SlurmdPidFile={r / 'run'}/slurmd-%n.pid",
            f"SlurmctldLogFile={r / 'log'}/slurmctld.log", f"SlurmdLogFile={r / 'log'}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SwitchType=switch/none",
            "MpiDefault=none", "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "GresTypes=gpu", "SlurmdParameters=config_overrides", "ReturnToService=2",
            f"KillWait={KILL_WAIT_S}", "SchedulerType=sched/backfill", "SchedulerParameters=bf_interval=1",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none", "InactiveLimit=0", "SlurmdTimeout=30", "MinJobAge=300",
            f"PlugStackConfig={r / 'etc' / 'plugstack.conf'}",
        ]
        gres = ["AutoDetect=off"]
        dev = 0
        for name, (gtype, n, rack) in self.nodes.items():
            lines.append(f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} CPUs=8 "
                         f"RealMemory=8000 Gres=gpu:{gtype}:{n} Feature=rack_{rack},pcie State=UNKNOWN")
            gres.append(f"NodeName={name} Name=gpu Type={gtype} File=/dev/tty[{dev}-{dev + n - 1}]")
            dev += n
        lines.append("PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        (r / "etc" / "slurm.conf").write_text("\n".join(lines) + "\n")
        (r / "etc" / "gres.conf").write_text("\n".join(gres) + "\n")
        (r / "etc" / "plugstack.conf").write_text("")

    def _spawn(self, key: str, argv: list[str], user: str | None = None) -> None:
        assert self.root is not None
        log = open(self.root / "log" / f"{key}.out", "ab")
        kw = {"user": user, "group": user, "extra_groups": []} if user else {}
        self.procs[key] = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True, **kw)
        log.close()

    def _start_daemons(self) -> None:
        r = self.root
        assert r is not None
        m = r / "munge"
        self._spawn("munged", [_exe("munged"), "-F", "--force",
                               f"--socket={m / 'munge.socket'}", f"--key-file={m / 'munge.key'}",
                               f"--pid-file={m / 'munged.pid'}", f"--log-file={m / 'munged.log'}",
                               f"--seed-file={m / 'munged.seed'}"], user="munge")
        _wait(lambda: (m / "munge.socket").exists(), 10, "munged socket", self)
        self.start_controller()
        for name in self.nodes:
            self._spawn(f"slurmd-{name}", [_exe("slurmd"), "-D", "-N", name, "-f", str(self.conf)])

    def start_controller(self) -> None:
        # no -c: the controller recovers its jobs from StateSaveLocation, as after a real restart
        self._spawn("slurmctld", [_exe("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        _wait(lambda: self.run("scontrol", "ping", check=False).returncode == 0, 20, "slurmctld", self)

    def stop_controller(self) -> None:
        """slurmctld ends (as for an upgrade or a crash); the slurmd keep running their job steps."""
        p = self.procs["slurmctld"]
        p.send_signal(signal.SIGTERM)
        p.wait(20)

    def run(self, *argv: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        # cwd: a job's default output file (slurm-ID.out) goes to the directory it was submitted from
        return subprocess.run([_exe(argv[0]), *argv[1:]], env=self.env, capture_output=True, text=True,
                              cwd=self.root, check=check, input=input, timeout=60)

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T").stdout.split()
        return dict(zip(out[::2], out[1::2]))

    def wait_nodes_idle(self, timeout: float = 30.0) -> None:
        _wait(lambda: set(self.node_states().values()) == {"idle"}
              and len(self.node_states()) == len(self.nodes), timeout, "nodes idle", self)

    def wait_for(self, pred, timeout: float, what: str = "condition") -> None:
        _wait(pred, timeout, what, self)

    def job_ids(self) -> list[str]:
        return self.run("squeue", "-h", "-o", "%i").stdout.split()

    def cancel_all(self, timeout: float = 60.0) -> None:
        """Cancel every job (SIGTERM, KillWait, SIGKILL) and wait until none is left."""
        if self.job_ids():
            self.run("scancel", "--full", *self.job_ids(), check=False)
        t0 = time.time()
        while time.time() - t0 < timeout:
            live = [l for l in self.run("squeue", "-h", "-o", "%T").stdout.split()
                    if l not in ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                                 "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")]
            if not live:
                return
            time.sleep(0.2)
        raise RuntimeError(f"jobs still alive {timeout:.0f} s after scancel: {self.job_ids()}")

    def reset(self) -> None:
        """Between tests: no job, every node back to idle (undrained)."""
        self.cancel_all()
        for name, state in self.node_states().items():
            if state != "idle":
                self.run("scontrol", "update", f"NodeName={name}", "State=RESUME", check=False)
        self.wait_nodes_idle()

    def stop(self) -> None:
        if self.procs.get("slurmctld") is not None and self.procs["slurmctld"].poll() is None:
            try:
                self.cancel_all(timeout=KILL_WAIT_S + 30)
            except (RuntimeError, subprocess.SubprocessError, OSError):
                pass  # the daemons go anyway; the leak check of the tests reports what is left
        # slurmd first (they end their job steps), then the controller, then munged
        order = sorted(self.procs, key=lambda k: (not k.startswith("slurmd"), k == "munged"))
        for key in order:
            p = self.procs[key]
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        self.procs.clear()
        if self.root is not None:
            # job step daemons (slurmstepd) detach from slurmd and finish their teardown on their own;
            # they are this cluster's because they hold files under its directory
            deadline = time.time() + 30
            while self.processes() and time.time() < deadline:
                time.sleep(0.2)
            for pid in self.processes():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            shutil.rmtree(self.root, ignore_errors=True)

    def processes(self) -> list[int]:
        """Processes (other than this one) with a file or command line under the cluster's directory."""
        root = str(self.root)
        out = []
        for d in os.listdir("/proc"):
            if not d.isdigit() or int(d) == os.getpid():
                continue
            try:
                if root in Path(f"/proc/{d}/cmdline").read_bytes().decode(errors="replace"):
                    out.append(int(d))
                    continue
                for fd in os.listdir(f"/proc/{d}/fd"):
                    if os.readlink(f"/proc/{d}/fd/{fd}").startswith(root):
                        out.append(int(d))
                        break
            except OSError:
                continue
        return out

    def daemon_pids(self) -> list[int]:
        return [p.pid for p in self.procs.values()]


def _wait(pred, timeout: float, what: str, cluster: SlurmCluster) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            if pred():
                return
        except (subprocess.SubprocessError, OSError):
            pass
        dead = [k for k, p in cluster.procs.items() if p.poll() is not None]
        if dead:
            break
        time.sleep(0.1)
    logs = ""
    if cluster.root is not None:
        for f in sorted((cluster.root / "log").glob("*")):
            logs += f"\n--- {f.name}\n" + f.read_text(errors="replace")[-1500:]
    raise RuntimeError(f"test Slurm cluster: {what} not reached in {timeout:.0f} s "
                       f"(exited: {[k for k, p in cluster.procs.items() if p.poll() is not None]}){logs}")


if __name__ == "__main__":
    def _term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    c = SlurmCluster().start()
    print(f"export SLURM_CONF={c.conf}  # daemons: {c.daemon_pids()}", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        c.stop()


# --- a live loop with one job, and faults made while it runs (tests/test_slurm_runner.py, bench/slurm_faults.py)

def one_job_loop(runner, out: Path, job: str, *, iterations: int, interval_s: float, duration_s: float):
    """The live loop (fcfs) over Slurm's nodes with one 1-GPU job of `iterations` steps."""
    from arena_opt.policies import make_policy
    from arena_opt.snapshot import ClusterSnapshot
    from arena_opt.trace import TraceJob
    from runners.live import LiveLoop, LiveOptions

    cluster = ClusterSnapshot(nodes=runner.cluster_nodes())
    trace = [TraceJob(id=job, submit_time=0, model="gpt-350M", batch_size=4, iterations=iterations, num_gpus=1)]
    opts = LiveOptions(interval_s=interval_s, time_scale=1, iter_scale=1, batch_divisor=1, step_delay_s=0.3,
                       duration_s=duration_s)
    return LiveLoop(cluster, trace, runner, make_policy("fcfs"), opts, out, log=lambda s: None)


class WhenRunning:
    """Calls action(observed job) once, from a thread, as soon as `job` runs at step >= `min_step` on
    known GPUs; `.result` holds what it returned (None: the job never got there). Use as a context
    manager around loop.run(): leaving it stops the watch."""

    def __init__(self, loop, job: str, min_step: int, action) -> None:
        import threading

        self.loop, self.job, self.min_step, self.action = loop, job, min_step, action
        self.result = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            o = self.loop.jobs[self.job].last_obs
            if o is not None and o.state == "running" and o.step >= self.min_step and o.placement:
                self.result = self.action(o)
                return
            time.sleep(0.2)

    def __enter__(self) -> "WhenRunning":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(60)


def controller_outage(cluster: SlurmCluster, seconds: float) -> tuple[float, float, float]:
    """slurmctld stops, stays away `seconds`, starts: (asked to stop, stopped, answering again) times."""
    t0 = time.time()
    cluster.stop_controller()
    t_down = time.time()
    time.sleep(seconds)
    cluster.start_controller()
    return t0, t_down, time.time()


def set_node_states(cluster: SlurmCluster, node: str, *states: str, reason: str = "fault") -> None:
    """`scontrol update` the node to each state in turn (DOWN then DRAIN keeps a failed node out: the
    test cluster returns a DOWN node to service once its slurmd registers again)."""
    for state in states:
        cluster.run("scontrol", "update", f"NodeName={node}", f"State={state}", f"Reason={reason} {state}")


def timed_status(runner) -> list[tuple[float, float]]:
    """Wrap runner.status: (start time, seconds) of every call."""
    calls: list[tuple[float, float]] = []
    inner = runner.status

    def status():
        t0 = time.time()
        try:
            return inner()
        finally:
            calls.append((t0, time.time() - t0))

    runner.status = status
    return calls


class LoopCommands:
    """Context manager: records (start, end, command) of every command this thread runs (the live loop's
    Slurm commands, run in the caller's thread), and, once `arm(prefix, seconds)` was called, stops
    slurmctld just before the next such command whose argv starts with `prefix` (after the ping before it
    answered: the case a ping cannot guard) and starts it again `seconds` later from another thread.
    `.window`: (asked to stop, stopped, answering again) of that outage, `.hit` the command it met."""

    def __init__(self, cluster: SlurmCluster) -> None:
        import threading

        self.cluster = cluster
        self.log: list[tuple[float, float, str]] = []
        self.window: tuple[float, float, float] | None = None
        self.hit: str | None = None
        self._thread = threading.current_thread()
        self._armed: tuple[str, float] | None = None
        self._restart = None
        self._run = subprocess.run

    def arm(self, prefix: str, seconds: float) -> None:
        self._armed = (prefix, seconds)

    def inside(self, t: float) -> str | None:
        """The loop's command running at time t (None: between commands)."""
        return next((cmd for a, b, cmd in self.log if a <= t <= b), None)

    def _wrapped(self, args, *a, **kw):
        import threading

        if threading.current_thread() is not self._thread:
            return self._run(args, *a, **kw)
        cmd = " ".join(str(x) for x in args)
        if self._armed and cmd.startswith(self._armed[0]):
            seconds, self._armed, self.hit = self._armed[1], None, cmd
            t0 = time.time()
            self.cluster.stop_controller()
            t_down = time.time()

            def back() -> None:
                time.sleep(seconds)
                self.cluster.start_controller()
                self.window = (t0, t_down, time.time())

            self._restart = threading.Thread(target=back, daemon=True)
            self._restart.start()
        t = time.time()
        try:
            return self._run(args, *a, **kw)
        finally:
            self.log.append((t, time.time(), cmd))

    def __enter__(self) -> "LoopCommands":
        subprocess.run = self._wrapped
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run = self._run
        if self._restart is not None:
            self._restart.join(120)
