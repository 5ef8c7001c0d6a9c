"""Multi-node backend: one agent per node launches that node's share of each
job with torchrun (c10d rendezvous: --nnodes, --node-rank, the endpoint the
scheduler chose on the job's first node); `AgentRunner` is the scheduler side.

    python -m runners.agent --node-id n0 --listen 0.0.0.0:29400 --workdir /shared/arena-runs

The agent speaks JSON over HTTP and launches nothing but `runners.train`: it
builds the torchrun command itself from the TrainSpec it is sent (the same
`runners.launch.node_launches` the other backends use). Jobs' run and
checkpoint directories must be on a file system every node shares (DCP
resharding reads every rank's shards; the scheduler reads progress there).
When the agent exits (SIGTERM, Ctrl-C, /shutdown) it stops all its launches.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from runners.launch import free_port, node_launches
from runners.managed import LaunchError, LaunchHandle, ManagedRunner, _Job
from runners.names import safe_name
from runners.process import Proc, kill_all
from runners.spec import TrainSpec, format_validation_error


class LaunchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: TrainSpec
    placement: dict[str, list[int]]
    endpoint: str
    node_id: str
    use_gpus: bool = True


class Agent:
    def __init__(self, node_id: str, workdir: str | Path, host: str = "127.0.0.1") -> None:
        self.node_id = node_id
        self.host = host
        self.workdir = Path(workdir)
        self.procs: dict[str, Proc] = {}  # "job/generation" -> torchrun of this node
        self.lock = threading.Lock()

    def launch(self, req: LaunchRequest) -> dict:
        if req.node_id != self.node_id:
            raise ValueError(f"request for node {req.node_id!r} reached agent {self.node_id!r}")
        mine = [nl for nl in node_launches(req.spec, req.placement, req.endpoint, use_gpus=req.use_gpus)
                if nl.node_id == self.node_id]
        if not mine:
            raise ValueError(f"node {self.node_id!r} is not in the placement {req.placement}")
        nl = mine[0]
        key = f"{req.spec.job_id}/{req.spec.generation}"
        log = self.workdir / "agent-logs" / self.node_id / f"{safe_name(req.spec.job_id)}-g{req.spec.generation}.log"
        with self.lock:
            if key in self.procs:
                raise ValueError(f"launch {key} already exists on {self.node_id}")
            self.procs[key] = Proc(nl.argv, nl.env, log, cwd=Path(__file__).resolve().parent.parent)
        return {"log_path": str(log), "node_rank": nl.node_rank}

    def poll(self, key: str) -> dict:
        p = self._get(key)
        rc = p.poll()
        return {"rc": rc, "workers": p.workers() if rc is None else []}

    def terminate(self, key: str, timeout: float, kill: bool = False) -> dict:
        p = self._get(key)
        if kill:
            p.kill()
            return {"rc": p.poll()}
        return {"rc": p.terminate(timeout)}

    def stop_all(self) -> None:
        with self.lock:
            procs = list(self.procs.values())
        for p in procs:
            p.terminate(10.0)

    def _get(self, key: str) -> Proc:
        with self.lock:
            if key not in self.procs:
                raise KeyError(f"no launch {key} on node {self.node_id}")
            return self.procs[key]


def _handler(agent: Agent, server_ref: list) -> type[BaseHTTPRequestHandler]:
    class H(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *args: Any) -> None:  # quiet: the scheduler logs what matters
            pass

        def _reply(self, code: int, obj: dict) -> None:
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802
            try:
                n = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(n) or b"{}")
                if self.path == "/launch":
                    self._reply(200, agent.launch(LaunchRequest.model_validate(body)))
                elif self.path == "/poll":
                    self._reply(200, agent.poll(body["key"]))
                elif self.path == "/terminate":
                    self._reply(200, agent.terminate(body["key"], float(body.get("timeout", 30)),
                                                     bool(body.get("kill", False))))
                elif self.path == "/port":
                    self._reply(200, {"port": free_port(agent.host)})
                elif self.path == "/health":
                    self._reply(200, {"node_id": agent.node_id})
                elif self.path == "/shutdown":
                    self._reply(200, {"ok": True})
                    threading.Thread(target=server_ref[0].shutdown, daemon=True).start()
                else:
                    self._reply(404, {"error": f"unknown path {self.path}"})
            except ValidationError as e:
                self._reply(400, {"error": format_validation_error(e)})
            except (KeyError, ValueError) as e:
                self._reply(400, {"error": str(e.args[0] if e.args else e)})

    return H


def serve(node_id: str, listen: str, workdir: str) -> int:
    host, port = listen.rsplit(":", 1)
    agent = Agent(node_id, workdir, host)
    ref: list = []
    server = ThreadingHTTPServer((host, int(port)), _handler(agent, ref))
    ref.append(server)

    def _stop(signum: int, frame: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"agent {node_id} listening on {host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        agent.stop_all()
        kill_all()
    return 0


# ---------------------------------------------------------------------------- scheduler side


class AgentError(LaunchError):
    """An agent refused a request or could not be reached."""


def _call(addr: str, path: str, body: dict | None = None, timeout: float = 30.0) -> dict:
    req = urllib.request.Request(f"http://{addr}{path}", data=json.dumps(body or {}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        raise AgentError(f"agent {addr}{path}: {json.loads(e.read()).get('error', e.reason)}") from None
    except (urllib.error.URLError, OSError) as e:
        raise AgentError(f"agent {addr}{path}: unreachable ({e})") from None


class RemoteLaunch(LaunchHandle):
    def __init__(self, agents: list[str], key: str, log_paths: list[str]) -> None:
        self.agents, self.key, self.log_paths = agents, key, log_paths
        self._rc: list[int | None] = [None] * len(agents)

    def poll(self) -> list[int | None]:
        for i, a in enumerate(self.agents):
            if self._rc[i] is None:
                try:
                    self._rc[i] = _call(a, "/poll", {"key": self.key})["rc"]
                except AgentError:
                    # an unreachable node counts as failed: its ranks are gone for this launch
                    self._rc[i] = -1
        return list(self._rc)

    def terminate(self, timeout: float) -> None:
        for i, a in enumerate(self.agents):
            try:
                self._rc[i] = _call(a, "/terminate", {"key": self.key, "timeout": timeout}, timeout=timeout + 30)["rc"]
            except AgentError:
                self._rc[i] = -1 if self._rc[i] is None else self._rc[i]

    def kill(self) -> None:
        for i, a in enumerate(self.agents):
            try:
                self._rc[i] = _call(a, "/terminate", {"key": self.key, "kill": True})["rc"]
            except AgentError:
                self._rc[i] = -1 if self._rc[i] is None else self._rc[i]

    def worker_pids(self) -> list[int]:
        out: list[int] = []
        for a in self.agents:
            try:
                out += _call(a, "/poll", {"key": self.key})["workers"]
            except AgentError:
                pass
        return out


class AgentRunner(ManagedRunner):
    """Runs jobs through node agents. `agents`: node id -> agent address host:port; the
    rendezvous endpoint of a job is the agent host of its first node with a port that agent picked."""

    def __init__(self, workdir: str | Path, agents: dict[str, str], **kw: Any) -> None:
        super().__init__(workdir, **kw)
        self.agents = agents

    def _start(self, job: _Job, spec: TrainSpec, placement: dict[str, list[int]]) -> LaunchHandle:
        missing = [n for n in placement if n not in self.agents]
        if missing:
            raise AgentError(f"no agent for node(s) {missing}; known: {sorted(self.agents)}")
        first = self.agents[next(iter(placement))]
        endpoint = f"{first.rsplit(':', 1)[0]}:{_call(first, '/port')['port']}"
        key = f"{spec.job_id}/{spec.generation}"
        addrs, logs = [], []
        try:
            for node in placement:
                req = LaunchRequest(spec=spec, placement=placement, endpoint=endpoint, node_id=node,
                                    use_gpus=self.device != "cpu")
                logs.append(_call(self.agents[node], "/launch", json.loads(req.model_dump_json()))["log_path"])
                addrs.append(self.agents[node])
        except AgentError:
            RemoteLaunch(addrs, key, logs).terminate(5.0)  # the nodes already started would wait forever
            raise
        return RemoteLaunch(addrs, key, logs)

    def worker_pids(self, job_id: str) -> list[int]:
        h = self.jobs[job_id].handle
        return h.worker_pids() if isinstance(h, RemoteLaunch) else []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runners.agent", description=__doc__.split("\n\n")[0])
    ap.add_argument("--node-id", required=True, help="node id as in the cluster snapshot")
    ap.add_argument("--listen", default="127.0.0.1:29400", help="HOST:PORT to serve on (port 0 = any)")
    ap.add_argument("--workdir", default="arena-runs", help="where the agent writes launch logs")
    a = ap.parse_args(argv)
    return serve(a.node_id, a.listen, a.workdir)


if __name__ == "__main__":
    sys.exit(main())
