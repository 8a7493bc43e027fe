"""A real multi-node Ray cluster on loopback for the Ray tests.

Each node is one ``ray start --block`` process started in a session of its own, so the node's
process group (its ``ray start``, GCS, raylet, agents and task workers) is known by id:

- the head node advertises 127.0.0.2, each worker node its own loopback address (127.0.0.3, ...):
  Ray rewrites 127.0.0.1 to the machine's routable address, but keeps any other loopback
  address, so every connection between nodes and drivers stays on 127.0.0.0/8;
- the GCS port is chosen by Ray (``--port 0``) and read from the address file ``ray start``
  writes into the node's temp dir; the Ray Client server port is one the OS found free;
- each node has its own short temp dir under /tmp (Unix socket paths are limited to 107 bytes)
  and a small object store (100 MB): the tests move JSON strings, not data;
- the nodes run with a scrubbed environment: no AWS or pyiceberg settings, no proxies;
- :meth:`RayNode.kill` SIGKILLs a node's whole process group (a crashed machine);
  :meth:`RayNode.stop` asks ``ray start`` to stop its node (SIGTERM), then SIGKILLs what is left
  of its group, and returns once no process of the group is left. ``ray stop`` is never used: it
  kills every Ray process of the machine by name, whoever started it.

Readiness is a bounded poll of ``ray.nodes()`` in a separate Python process (:func:`wait_for_nodes`),
so the test process itself never connects to the cluster unless a test does so on purpose.
Run as a script (``python ray_cluster.py [WORKERS]``), it starts a cluster, prints its
addresses and stops it on Enter or Ctrl-C.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

RAY = Path(sys.executable).parent / "ray"
HEAD_IP = "127.0.0.2"
OBJECT_STORE_BYTES = 100 * 10**6
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
# Settings that would point the nodes' S3 or catalog clients elsewhere, or at a proxy.
_LEAKY_PREFIXES = ("AWS_", "PYICEBERG_", "COMPACTOR_", "RAY_")
_PROXIES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def worker_ip(index: int) -> str:
    """The loopback address of worker node ``index`` (0-based): 127.0.0.3, 127.0.0.4, ..."""
    return f"127.0.0.{3 + index}"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def node_environment(home: Path) -> dict[str, str]:
    """This process's environment without AWS, pyiceberg, compactor, Ray or proxy settings."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.upper().startswith(_LEAKY_PREFIXES) and name not in _PROXIES
    }
    env.update(
        HOME=str(home),
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=str(home / "no-aws-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(home / "no-aws-credentials"),
        NO_PROXY="127.0.0.0/8,localhost",
        no_proxy="127.0.0.0/8,localhost",
        RAY_USAGE_STATS_ENABLED="0",
    )
    return env


def _process_groups() -> Iterator[tuple[int, int, int, str]]:
    """(pid, process group, session, state) of every process of this PID namespace."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # exited meanwhile
        # pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2 :].split()
        yield int(entry.name), int(fields[2]), int(fields[3]), fields[0]


def processes_mentioning(needle: str) -> list[int]:
    """Processes whose command line mentions ``needle`` (a path only this cluster uses)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if needle.encode() in cmdline and int(entry.name) != os.getpid():
            found.append(int(entry.name))
    return found


@dataclass
class RayNode:
    """One node: a ``ray start --block`` process leading its own session and process group."""

    name: str
    ip: str
    temp_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes]

    @property
    def group(self) -> int:
        """The node's process group and session id: the pid of its ``ray start``."""
        return self.process.pid

    def processes(self) -> list[int]:
        """Live (not zombie) processes of the node's process group or session."""
        return [
            pid
            for pid, group, session, state in _process_groups()
            if self.group in (group, session) and state != "Z"
        ]

    def core_processes(self) -> list[int]:
        """The node's ``ray start``, raylet and (on the head) GCS: they live as long as it."""
        core = [self.group]
        for pid, group, _, state in _process_groups():
            if group == self.group and state != "Z":
                with suppress(OSError):
                    if Path(f"/proc/{pid}/comm").read_text().strip() in ("raylet", "gcs_server"):
                        core.append(pid)
        return sorted(core)

    def kill(self) -> None:
        """SIGKILL every process of the node, as if its machine died.

        Task workers lead process groups of their own, in the node's session: each is killed.
        """
        with suppress(ProcessLookupError):
            os.killpg(self.group, signal.SIGKILL)
        for pid in self.processes():
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait(timeout=STOP_TIMEOUT_S)

    def stop(self) -> None:
        """Stop the node (SIGTERM to ``ray start``, SIGKILL for what remains); wait until gone."""
        if self.process.poll() is None:
            self.process.terminate()
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=STOP_TIMEOUT_S)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while left := self.processes():
            if time.monotonic() > deadline:
                raise RuntimeError(f"ray node {self.name}: processes {left} survived SIGKILL")
            with suppress(ProcessLookupError):
                os.killpg(self.group, signal.SIGKILL)
            for pid in left:  # a process that left the group, still in the session
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)  # poll interval of a bounded wait for the kernel to reap
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=STOP_TIMEOUT_S)

    def log(self) -> str:
        """What ``ray start`` printed."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


@dataclass
class RayCluster:
    """A head node and worker nodes; ``address`` is the GCS address drivers connect to."""

    root: Path
    env: dict[str, str]
    address: str = ""
    client_address: str = ""
    head: RayNode | None = None
    workers: list[RayNode] = field(default_factory=list)
    retired: list[RayNode] = field(default_factory=list)  # stopped after they died
    started: int = 0  # worker nodes started so far: names and addresses are never reused

    @property
    def nodes(self) -> list[RayNode]:
        return ([self.head] if self.head else []) + self.workers

    def processes(self) -> list[int]:
        """Every live process of the cluster: its nodes' groups, and any naming its temp dir."""
        every = self.nodes + self.retired
        pids = {pid for node in every for pid in node.processes()}
        return sorted(pids | set(processes_mentioning(str(self.root))))

    def add_worker(self) -> RayNode:
        """Start one more worker node (wait with :meth:`wait_until_ready`)."""
        index, self.started = self.started, self.started + 1
        return _start_node(self, f"worker{index}", worker_ip(index), ["--address", self.address])

    def wait_until_ready(self) -> None:
        """Return once exactly this cluster's nodes are alive: those that died are gone."""
        wanted = sorted(node.ip for node in self.nodes)
        nodes = wait_for_nodes(self.address, wanted, self.env)
        assert sorted(n["ip"] for n in nodes) == wanted, nodes

    def replace_dead_workers(self) -> None:
        """Start a new worker node for each one that died; return once the cluster is whole."""
        dead = [node for node in self.workers if node.process.poll() is not None]
        if not dead:
            return
        for node in dead:
            node.stop()
            self.workers.remove(node)
            self.retired.append(node)
            self.add_worker()
        self.wait_until_ready()

    def client_server_logs(self, tail: int = 40) -> str:
        """The last lines of the head's Ray client server logs (proxy and per-client servers)."""
        assert self.head is not None
        logs = sorted(self.head.temp_dir.glob("session_*/logs/ray_client_server*"))
        return "\n".join(
            f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-tail:])
            for log in logs
        )

    def stop(self) -> None:
        """Stop every node, workers first; then no process of the cluster is left."""
        errors = []
        for node in reversed(self.nodes + self.retired):
            try:
                node.stop()
            except Exception as exc:  # stop the others anyway
                errors.append(f"{node.name}: {exc}")
        if errors:
            raise RuntimeError("; ".join(errors))


def _start_node(cluster: RayCluster, name: str, ip: str, args: list[str], cpus: int = 1) -> RayNode:
    temp_dir = cluster.root / name
    temp_dir.mkdir()
    log_path = cluster.root / f"{name}.log"
    command = [
        str(RAY),
        "start",
        "--block",
        "--node-ip-address",
        ip,
        "--num-cpus",
        str(cpus),
        "--object-store-memory",
        str(OBJECT_STORE_BYTES),
        "--disable-usage-stats",
        "--temp-dir",
        str(temp_dir),
        "--log-style",
        "record",
        *args,
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=cluster.env,
            cwd=cluster.root,
            start_new_session=True,  # its own session and process group: stopped by id
        )
    node = RayNode(name, ip, temp_dir, log_path, process)
    if cluster.head is None:
        cluster.head = node
    else:
        cluster.workers.append(node)
    return node


def _gcs_address(head: RayNode) -> str:
    """The GCS address ``ray start --head`` wrote into its temp dir, once it has."""
    address_file = head.temp_dir / "ray_current_cluster"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if head.process.poll() is not None:
            raise RuntimeError(f"ray head exited with {head.process.returncode}:\n{head.log()}")
        with suppress(FileNotFoundError):
            if address := address_file.read_text().strip():
                return address
        time.sleep(0.1)  # poll interval of a bounded wait
    raise TimeoutError(f"ray head wrote no address in {START_TIMEOUT_S:.0f}s:\n{head.log()}")


WAIT_SCRIPT = """
import json, sys, time, ray
address, wanted = sys.argv[1], sorted(sys.argv[3:])
deadline = time.monotonic() + float(sys.argv[2])
ray.init(address=address, log_to_driver=False, logging_level="warning")
alive = []
while time.monotonic() < deadline:
    alive = [n for n in ray.nodes() if n["Alive"]]
    if sorted(n["NodeManagerAddress"] for n in alive) == wanted:
        break
    time.sleep(0.2)  # poll interval of a bounded wait
print("NODES " + json.dumps([{"id": n["NodeID"], "ip": n["NodeManagerAddress"]} for n in alive]))
ray.shutdown()
"""


def wait_for_nodes(address: str, ips: list[str], env: Mapping[str, str]) -> list[dict[str, str]]:
    """Poll ``ray.nodes()`` (in a fresh driver process) until the alive nodes have ``ips``.

    Returns the alive nodes (``id``, ``ip``) when they do, or when the wait timed out.
    """
    process = subprocess.run(
        [sys.executable, "-c", WAIT_SCRIPT, address, str(START_TIMEOUT_S), *ips],
        env=dict(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S + 60,
        check=False,
    )
    said = [line for line in process.stdout.splitlines() if line.startswith("NODES ")]
    if process.returncode != 0 or not said:
        raise RuntimeError(
            f"cannot list the nodes of {address} (exit {process.returncode}):\n"
            f"{process.stdout[-3000:]}\n{process.stderr[-3000:]}"
        )
    nodes: list[dict[str, str]] = json.loads(said[-1].removeprefix("NODES "))
    return nodes


@contextmanager
def ray_cluster(
    workers: int = 1, head_cpus: int = 1, auth_token: str | None = None
) -> Iterator[RayCluster]:
    """A running cluster of a head node and ``workers`` worker nodes of one CPU each.

    With ``head_cpus=0`` the head runs no task, only the GCS (and drivers). With ``auth_token``
    every node requires that token (``RAY_AUTH_MODE=token``) of drivers and of each other; the
    cluster's ``env`` carries it. Everything it started is stopped on exit, also when starting
    failed half-way.
    """
    root = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    env = node_environment(root)
    if auth_token is not None:
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=auth_token)
    cluster = RayCluster(root, env)
    try:
        client_port = free_port(HEAD_IP)
        head = _start_node(
            cluster,
            "head",
            HEAD_IP,
            [
                "--head",
                "--port",
                "0",
                "--ray-client-server-port",
                str(client_port),
                "--include-dashboard=false",
            ],
            head_cpus,
        )
        cluster.address = _gcs_address(head)
        assert cluster.address.startswith(f"{HEAD_IP}:"), cluster.address
        cluster.client_address = f"ray://{HEAD_IP}:{client_port}"
        for _ in range(workers):
            cluster.add_worker()
        cluster.wait_until_ready()
        yield cluster
    finally:
        cluster.stop()
        left = cluster.processes()
        assert not left, f"ray processes {left} outlived the cluster"
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    with ray_cluster(int(sys.argv[1]) if len(sys.argv) > 1 else 1) as running:
        print(f"address {running.address}\nclient  {running.client_address}", flush=True)
        with suppress(KeyboardInterrupt):
            input("Enter stops the cluster\n")
