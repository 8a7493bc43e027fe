"""The Ray executor on a real two-node Ray cluster, with tables on S3 (moto over HTTP).

The cluster (``ray_cluster`` in conftest.py, see ray_cluster.py) has a head and a worker node of
one CPU each, on loopback. Tasks need one CPU, so two tasks running at once run on two nodes.

No sleeps: a gate in front of the S3 server (:class:`S3Gate`) holds the reads of each group's
last input file, so tasks stay in flight until a test has done what it must (seen two tasks
start, killed a node, cancelled); tasks are known to have started when their intent files are
written, and the gate sees those requests as they arrive.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pytest

pytest.importorskip("ray")

from pyiceberg.catalog import Catalog  # noqa: E402
from pyiceberg.table import Table  # noqa: E402

from compactor.errors import CompactorError, UsageError  # noqa: E402
from compactor.execute import ray_executor  # noqa: E402
from compactor.execute.ray_executor import (  # noqa: E402
    DECODE_FACTOR,
    MEMORY_BASE,
    MEMORY_FLOOR,
    ROW_GROUP_FACTOR,
    MiB,
    RayExecutor,
    _init_failure,
    task_memory,
)
from compactor.options import resolve_options  # noqa: E402
from compactor.planning.planner import plan_rewrite  # noqa: E402
from compactor.planning.tasks import TaskResult, plan_tasks  # noqa: E402
from compactor.rewrite.task_runner import EventToken, TaskCancelled  # noqa: E402

from support.ray_cluster import free_port, processes_mentioning  # noqa: E402
from support.ray_cluster import ray_cluster as start_cluster  # noqa: E402
from support.rows import assert_same_rows, scan_rows  # noqa: E402
from support.s3_tables import referenced_keys  # noqa: E402
from support.tables import events_table, live_data_files, live_entries  # noqa: E402

if TYPE_CHECKING:
    from support.ray_cluster import RayCluster
    from support.s3_server import MotoS3, S3Bucket

# Slow (left out by `make test-quick`); one pytest-xdist worker runs them all, on one cluster.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("ray")]
pytest_plugins = ("support.s3_server",)

COMPACTOR = Path(sys.executable).parent / "compactor"
TABLE, TWIN = "db.events", "db.twin"
# 2 days x 4 regions = 8 partitions (groups), each with 6 input files of ~750 rows (~15 KB);
# at a 32 KiB target each group writes 2 output files, the first before its last input is read.
COMMITS, ROWS_PER_COMMIT, DAYS = 6, 6000, 2
GROUPS = DAYS * 4
TARGET = ("--target-file-size", "32KiB", "--allow-small-target", "--min-input-files", "2")
# Reads held by the gate must not time out in the S3 client (pyarrow's default is 3 s).
HELD_READ_TIMEOUT_S = 300
WAIT_S = 240.0
# More tasks in flight than the cluster has CPUs: Ray, not the cap, runs two at once.
# The gate holds reads of each group's last input so that tasks stay in flight after writing a
# file; bulk reading checks every input's footer before writing anything, so it is off here
# (it runs inside the task the same way on any executor: tests/integration/test_bulk_read.py).
SAME_AS_RAY = ("--parallelism", "4", "--no-bulk-read")
ON_RAY = (*SAME_AS_RAY, "--executor", "ray", "--ray-address")
INTENT = re.compile(r"/compactor-intent-([0-9a-f]+)-t(\d+)-([0-9a-f]+)\.\d\.json$")
OUTPUT = re.compile(r"/compactor-[0-9a-f]+-g(\d+)-\d+-[0-9a-f]+\.parquet$")
RAN_ON = re.compile(r"ray: group (\d+) ran on node ([0-9a-f]+) \(([\d.]+)\)")


# --- the S3 gate --------------------------------------------------------------------------------


@dataclass
class S3Gate:
    """WSGI middleware in front of moto: holds GETs of ``held`` keys until :meth:`release`.

    It also records, once the server has answered them, the intent files tasks write
    (``intents``: task id -> the random ids of its attempts) and the data files completed
    (``outputs``), and wakes :meth:`wait_for` on each.
    """

    app: Callable[..., Any]
    held: set[str] = field(default_factory=set)
    intents: dict[int, set[str]] = field(default_factory=dict)
    runs: set[str] = field(default_factory=set)
    outputs: list[str] = field(default_factory=list)
    holding: int = 0
    released: threading.Event = field(default_factory=threading.Event)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        method, query = environ["REQUEST_METHOD"], environ.get("QUERY_STRING", "")
        key = unquote(environ.get("PATH_INFO", "")).lstrip("/").partition("/")[2]
        if method == "GET" and key in self.held and not self.released.is_set():
            with self.changed:
                self.holding += 1
                self.changed.notify_all()
            self.released.wait(HELD_READ_TIMEOUT_S)
        response = self.app(environ, start_response)
        with self.changed:
            if method == "PUT" and (match := INTENT.search(key)):
                self.runs.add(match.group(1))
                self.intents.setdefault(int(match.group(2)), set()).add(match.group(3))
            elif "/data/" in key and (
                (method == "PUT" and "partNumber" not in query)
                or (method == "POST" and "uploadId" in query)
            ):
                self.outputs.append(key)
            self.changed.notify_all()
        return response

    def release(self) -> None:
        self.released.set()

    def wait_for(self, what: str, condition: Callable[[], bool]) -> None:
        """Return once ``condition()`` holds (checked on every request); fail after WAIT_S."""
        with self.changed:
            if not self.changed.wait_for(condition, WAIT_S):
                raise AssertionError(f"timed out waiting for {what}")

    def output_groups(self) -> set[int]:
        """Groups with a completed output file."""
        with self.changed:
            return {int(g) for key in self.outputs for g in OUTPUT.findall(key)}

    def started(self) -> set[int]:
        """Ids of the tasks that have written an intent file."""
        with self.changed:
            return set(self.intents)


def run_of(gate: S3Gate) -> str:
    """The id of the one run whose tasks wrote intent files."""
    (run_id,) = gate.runs
    return run_id


@pytest.fixture
def gate(moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Gate]:
    """The gate, in front of moto for this test only; held reads are released at the end."""
    gate = S3Gate(moto_s3.log._app)
    monkeypatch.setattr(moto_s3.log, "_app", gate)
    try:
        yield gate
    finally:
        gate.release()


@pytest.fixture
def cluster(ray_cluster: RayCluster) -> RayCluster:
    """The session's cluster, whole again if an earlier test killed a node."""
    ray_cluster.replace_dead_workers()
    return ray_cluster


# --- tables and runs ----------------------------------------------------------------------------


def catalog_properties(s3: S3Bucket) -> dict[str, str]:
    return {**s3.properties(), "s3.request-timeout": str(HELD_READ_TIMEOUT_S)}


def make_table(
    s3: S3Bucket, identifier: str = TABLE, commits: int = COMMITS
) -> tuple[Catalog, Table]:
    """``identifier`` with GROUPS partitions of ``commits`` small files each."""
    catalog = s3.catalog(catalog_properties(s3))
    table = events_table(
        catalog, identifier, commits=commits, rows_per_commit=ROWS_PER_COMMIT, days=DAYS
    )
    assert len(live_data_files(table)) == commits * GROUPS
    return catalog, table


def last_inputs(s3: S3Bucket, table: Table) -> set[str]:
    """Keys of the files the last commit wrote: the last input of every group, as planned."""
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return {
        s3.key(e.data_file.file_path)
        for e in live_entries(table)
        if e.snapshot_id == snapshot.snapshot_id
    }


def cli_env(s3: S3Bucket) -> dict[str, str]:
    """The environment the s3 fixture isolated, with catalog ``lake`` in PYICEBERG_CATALOG__*."""
    properties = {
        "type": "sql",
        "uri": s3.catalog_uri,
        "warehouse": s3.warehouse,
        **catalog_properties(s3),
    }
    prefix = f"PYICEBERG_CATALOG__{s3.catalog_name.upper()}__"
    env = dict(os.environ)
    for key, value in properties.items():
        env[prefix + key.upper().replace(".", "__").replace("-", "_")] = value
    return env


def start_cli(
    s3: S3Bucket, *args: str, table: str = TABLE, env: Mapping[str, str] | None = None
) -> subprocess.Popen[str]:
    """``compactor --verbose run --catalog lake --table TABLE ARGS --json``, in the background,
    with ``env`` added to its environment."""
    return subprocess.Popen(
        [str(COMPACTOR), "--verbose", "run", "--catalog", s3.catalog_name, "--table", table]
        + [*TARGET, *args, "--json"],
        cwd=s3.home,
        env={**cli_env(s3), **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@dataclass
class Finished:
    code: int
    document: dict[str, Any]
    stderr: str


def finish(process: subprocess.Popen[str]) -> Finished:
    """Wait for a CLI run; its exit code, its JSON document and its stderr."""
    try:
        stdout, stderr = process.communicate(timeout=WAIT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    if process.returncode != 0 and not stdout.strip():
        return Finished(process.returncode, {}, stderr)
    try:  # stdout is the JSON document and nothing else, whatever Ray says meanwhile
        document = json.loads(stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"stdout is not JSON:\n{stdout}\n{stderr[-5000:]}") from None
    return Finished(process.returncode, document, stderr)


def assert_ran_everything(run: Finished) -> None:
    assert run.code == 0, run.stderr[-5000:]
    assert run.document["failed_groups"] == [], run.document["failed_groups"]
    assert run.document["committed_groups"] == run.document["groups"] == GROUPS


def output_layout(table: Table) -> list[tuple[str, int]]:
    """(partition, records) of every live data file: how the rewrite cut the rows."""
    spec = table.spec()
    return sorted(
        (spec.partition_to_path(d.partition, table.schema()), d.record_count)
        for d in live_data_files(table).values()
    )


def unreferenced_keys(s3: S3Bucket, table: Table) -> list[str]:
    """Keys under the table's location that no snapshot references (metadata JSON aside)."""
    referenced = referenced_keys(s3, table)
    return sorted(
        key
        for key in s3.objects(table.location())
        if not key.endswith(".metadata.json") and key not in referenced
    )


def worker_logs(cluster: RayCluster) -> str:
    """Everything the Ray workers of every node wrote to stderr so far."""
    return "".join(p.read_text(errors="replace") for p in cluster.root.rglob("worker-*.err"))


def cancelled_in_workers(cluster: RayCluster, run_id: str) -> set[int]:
    """Groups of run ``run_id`` whose worker has logged that it was asked to cancel."""
    said = re.findall(
        rf"compactor: run {run_id} group (\d+): cancel requested", worker_logs(cluster)
    )
    return {int(group) for group in said}


def poll_until(what: str, condition: Callable[[], bool]) -> None:
    """A bounded poll of a condition nothing announces (a log line): fail after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)  # poll interval


# --- (a) the same rows as the thread executor, on both nodes -----------------------------------


@pytest.mark.usefixtures("file_kind")
def test_ray_run_matches_threads_and_uses_both_nodes(
    s3: S3Bucket, gate: S3Gate, cluster: RayCluster
) -> None:
    catalog, table = make_table(s3)
    _, twin = make_table(s3, TWIN)
    rows = scan_rows(table)
    assert_same_rows(rows, scan_rows(twin))
    gate.held = last_inputs(s3, table)

    process = start_cli(s3, *ON_RAY, cluster.address)
    # Two tasks in flight at once, each holding one of the two nodes' single CPU.
    gate.wait_for("two tasks to start", lambda: len(gate.intents) >= 2)
    gate.release()
    ray_run = finish(process)
    # The same settings but the executor: budgets (hence row groups) follow the parallelism.
    threads_run = finish(start_cli(s3, *SAME_AS_RAY, "--executor", "threads", table=TWIN))

    assert_ran_everything(ray_run)
    assert_ran_everything(threads_run)
    table, twin = catalog.load_table(TABLE), catalog.load_table(TWIN)
    assert_same_rows(rows, scan_rows(table))
    assert_same_rows(scan_rows(twin), scan_rows(table))
    assert output_layout(table) == output_layout(twin)
    assert ray_run.document["added_files"] == threads_run.document["added_files"]
    placed = {int(m[0]): (m[1], m[2]) for m in RAN_ON.findall(ray_run.stderr)}
    assert sorted(placed) == list(range(GROUPS)), ray_run.stderr[-3000:]
    assert {ip for _, ip in placed.values()} == {node.ip for node in cluster.nodes}
    assert len({node for node, _ in placed.values()}) == 2


# --- (b) a node dies mid-run -------------------------------------------------------------------


def test_worker_node_killed_mid_run(s3: S3Bucket, gate: S3Gate, cluster: RayCluster) -> None:
    # Enough input per group for a task to complete an output file before its last input.
    catalog, table = make_table(s3, commits=10)
    rows = scan_rows(table)
    gate.held = last_inputs(s3, table)

    process = start_cli(s3, *ON_RAY, cluster.address)
    # Two tasks that cannot finish have each completed a file: one runs on each node.
    gate.wait_for("two tasks to complete a file", lambda: len(gate.output_groups()) >= 2)
    running = gate.started()
    assert running == gate.output_groups()
    cluster.workers[0].kill()  # SIGKILL: raylet, workers and all, mid-task
    gate.release()
    run = finish(process)

    assert_ran_everything(run)
    # The task that died was run again, as a new attempt with an intent file of its own.
    retried = {task for task, attempts in gate.intents.items() if len(attempts) > 1}
    assert len(retried) == 1 and retried <= running, gate.intents
    table = catalog.load_table(TABLE)
    assert_same_rows(rows, scan_rows(table))
    assert len(live_data_files(table)) == run.document["added_files"]
    # The attempt that died had completed output files: the run removed them.
    outputs = {key for key in gate.outputs if f"/compactor-{run_of(gate)}-" in key}
    assert len(outputs) > run.document["added_files"]
    assert unreferenced_keys(s3, table) == []

    following = finish(start_cli(s3, *ON_RAY, cluster.address))
    assert following.code == 0, following.stderr[-5000:]
    table = catalog.load_table(TABLE)
    assert_same_rows(rows, scan_rows(table))
    assert unreferenced_keys(s3, table) == []


# --- (c) cancelled through the token -----------------------------------------------------------


def test_cancelled_task_removes_its_files(s3: S3Bucket, gate: S3Gate, cluster: RayCluster) -> None:
    catalog, table = make_table(s3)
    rows = scan_rows(table)
    options = resolve_options(
        TABLE,
        table.metadata.properties,
        target_file_size="32KiB",
        allow_small_target=True,
        min_input_files=2,
        parallelism=1,
        bulk_read=False,  # see ON_RAY
    )
    run_id = uuid.uuid4().hex[:12]
    plan, _ = plan_rewrite(table, TABLE, options.plan)
    tasks = plan_tasks(plan, run_id, table.io.properties, options.execution)
    assert len(tasks) == GROUPS
    first = tasks[0]
    gate.held = {s3.key(first.inputs[-1].path)}
    prefix = f"/{first.file_prefix}-"
    stop = threading.Event()

    with RayExecutor(cluster.address, parallelism=1) as executor, ThreadPoolExecutor(1) as pool:
        outcomes = pool.submit(lambda: list(executor.run(tasks, EventToken(stop))))
        gate.wait_for(
            "the first task to complete an output file",
            lambda: any(prefix in key for key in gate.outputs),
        )
        written = [key for key in gate.outputs if prefix in key]
        stop.set()
        # The worker notices at once; the task itself stops after the read the gate holds.
        poll_until(
            "the worker to see the cancellation",
            lambda: cancelled_in_workers(cluster, run_id) == {first.task_id},
        )
        gate.release()
        results = dict((task.task_id, outcome) for task, outcome in outcomes.result(WAIT_S))

    assert sorted(results) == sorted(t.task_id for t in tasks)
    assert all(isinstance(outcome, TaskCancelled) for outcome in results.values()), results
    assert str(results.pop(first.task_id)).endswith(f"group {first.task_id} finished")
    assert all(str(outcome).endswith("started") for outcome in results.values())
    assert set(gate.intents) == {first.task_id}
    assert written and not any(s3.exists(key) for key in written)
    left = [key for key in s3.objects(table.location()) if f"/{first.file_prefix}" in key]
    assert left == []
    assert_same_rows(rows, scan_rows(catalog.load_table(TABLE)))


def test_sigterm_stops_a_ray_run_cleanly(s3: S3Bucket, gate: S3Gate, cluster: RayCluster) -> None:
    catalog, table = make_table(s3)
    rows = scan_rows(table)
    before = set(s3.objects(table.location()))
    gate.held = last_inputs(s3, table)

    process = start_cli(s3, *ON_RAY, cluster.address)
    gate.wait_for("two tasks to start", lambda: len(gate.intents) >= 2)
    running = gate.started()
    run_id = run_of(gate)
    process.send_signal(signal.SIGTERM)  # the CLI's handler stops the run: Ray's must not
    poll_until(
        "the workers to see the cancellation",
        lambda: cancelled_in_workers(cluster, run_id) == running,
    )
    gate.release()
    run = finish(process)

    assert run.code == 0, run.stderr[-5000:]
    assert run.document["stopped"] is True and run.document["snapshot_id"] is None
    kinds = {f["kind"] for f in run.document["failed_groups"]}
    assert kinds == {"cancelled"} and len(run.document["failed_groups"]) == GROUPS
    table = catalog.load_table(TABLE)
    assert_same_rows(rows, scan_rows(table))
    assert set(s3.objects(table.location())) == before


def test_tasks_run_through_the_ray_client(s3: S3Bucket, cluster: RayCluster) -> None:
    _, table = make_table(s3)
    options = resolve_options(
        TABLE, {}, target_file_size="32KiB", allow_small_target=True, min_input_files=2
    )
    plan, _ = plan_rewrite(table, TABLE, options.plan)
    tasks = plan_tasks(plan, uuid.uuid4().hex[:12], table.io.properties, options.execution)
    try:
        executor = RayExecutor(cluster.client_address)
    except CompactorError as exc:
        pytest.fail(f"{exc}\n{cluster.client_server_logs()}")
    with executor:
        outcomes = [outcome for _, outcome in executor.run(tasks, EventToken())]
        nodes = dict(executor.nodes)
    results = [outcome for outcome in outcomes if isinstance(outcome, TaskResult)]
    assert len(results) == len(tasks), outcomes
    assert sum(r.records_read for r in results) == table.scan().to_arrow().num_rows
    assert sorted(nodes) == sorted(task.task_id for task in tasks)


# --- (e) a cluster with token authentication ---------------------------------------------------

TOKEN = "compactor-test-token-0123456789abcdef"


@pytest.fixture(scope="module")
def secured_cluster() -> Iterator[RayCluster]:
    """A head and a worker node that require :data:`TOKEN` of every driver and of each other."""
    with start_cluster(workers=1, auth_token=TOKEN) as running:
        yield running


def test_runs_on_a_cluster_with_token_authentication_and_refuses_without_it(
    s3: S3Bucket, secured_cluster: RayCluster, tmp_path: Path
) -> None:
    catalog, table = make_table(s3)
    rows = scan_rows(table)
    token_file = tmp_path / "auth_token"
    token_file.write_text(TOKEN)
    address = ("--ray-address", secured_cluster.address)

    # Both refused runs at once: each waits for Ray to give up on the cluster.
    refused = [
        start_cli(s3, "--executor", "ray", *address),
        start_cli(
            s3,
            "--executor",
            "ray",
            *address,
            env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "x" * 32},
        ),
    ]
    none, wrong = (finish(process) for process in refused)
    assert none.code == 1 and wrong.code == 1
    assert f"error: ray: {secured_cluster.address} requires a token; none was sent" in none.stderr
    assert (
        f"error: ray: {secured_cluster.address} refused the token this process sent" in wrong.stderr
    )
    assert len(catalog.load_table(TABLE).metadata.snapshots) == COMMITS

    # The token from a file, as Ray's own tools keep it.
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_file)}
    run = finish(start_cli(s3, *ON_RAY, secured_cluster.address, env=env))
    assert_ran_everything(run)
    assert_same_rows(rows, scan_rows(catalog.load_table(TABLE)))
    placed = {m[2] for m in RAN_ON.findall(run.stderr)}
    assert placed == {node.ip for node in secured_cluster.nodes}, run.stderr[-3000:]
    assert TOKEN not in run.stderr + json.dumps(run.document)


# --- connecting ---------------------------------------------------------------------------------


def test_a_failed_client_connection_names_the_servers_cause_in_one_line() -> None:
    traceback = (
        "Initialization failure from server:\nTraceback (most recent call last):\n"
        '  File "proxier.py", line 770, in Datapath\n'
        "RuntimeError: Proxy failed to Connect to backend!\n"
    )
    assert _init_failure(ConnectionAbortedError(traceback)) == (
        "Initialization failure from server: RuntimeError: Proxy failed to Connect to backend!"
    )
    assert _init_failure(ConnectionError("refused\nmore")) == "refused"


def test_a_client_server_that_fails_to_start_is_asked_for_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The head's client proxy can fail to start a client's server (it exits at once under
    load): a new connection gets a new server, and a cause that persists is still reported."""
    calls = {"init": 0, "shutdown": 0}
    failures: list[Exception] = []

    def init(**_: Any) -> None:
        calls["init"] += 1
        if failures:
            raise failures.pop()

    def shutdown() -> None:
        calls["shutdown"] += 1

    def refused() -> ConnectionAbortedError:
        return ConnectionAbortedError("Initialization failure from server:\nRuntimeError: gone")

    monkeypatch.setattr(ray_executor.ray, "init", init)
    monkeypatch.setattr(ray_executor.ray, "shutdown", shutdown)
    failures.append(refused())
    ray_executor._init("ray://127.0.0.1:10001", None)
    assert calls == {"init": 2, "shutdown": 1}

    attempts = ray_executor.CLIENT_INIT_ATTEMPTS
    failures.extend(refused() for _ in range(attempts))
    with pytest.raises(CompactorError, match="from server: RuntimeError: gone$"):
        ray_executor._init("ray://127.0.0.1:10001", None)
    assert calls == {"init": 2 + attempts, "shutdown": 1 + (attempts - 1)}


def test_unreachable_address_fails_fast_with_one_line(s3: S3Bucket, unused_port: int) -> None:
    make_table(s3)
    address = f"127.0.0.1:{unused_port}"
    run = finish(start_cli(s3, "--executor", "ray", "--ray-address", address))
    assert run.code == 1
    assert f"error: ray: cannot connect to {address}: " in run.stderr
    bad = finish(start_cli(s3, "--executor", "ray", "--ray-address", "nowhere"))
    assert bad.code == 2
    assert "--ray-address 'nowhere': expected auto, HOST:PORT or ray://HOST:PORT" in bad.stderr


@pytest.fixture
def unused_port() -> int:
    return free_port()


CONNECT_SCRIPT = """
import json, os, signal, sys
import ray
from compactor.execute.ray_executor import RayExecutor

def mine(signum, frame):
    pass

signal.signal(signal.SIGTERM, mine)
report = {}
executor = RayExecutor(parallelism=1)  # RAY_ADDRESS if set, else a local Ray
report["nodes"] = sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"])
report["handler_kept"] = signal.getsignal(signal.SIGTERM) is mine
second = RayExecutor()  # shares the connection
executor.close()
report["open_after_first_close"] = ray.is_initialized()
second.close()
report["open_after_last_close"] = ray.is_initialized()
ray.init(address=os.environ.get("RAY_ADDRESS") or "local", include_dashboard=False)
RayExecutor().close()
report["callers_connection_kept"] = ray.is_initialized()
ray.shutdown()
print(json.dumps(report))
"""


@pytest.mark.parametrize("where", ["cluster", "local"])
def test_connection_is_shared_and_closed_by_its_owner(
    where: str, cluster: RayCluster, tmp_path: Path
) -> None:
    env = {k: v for k, v in cluster.env.items()}
    env["HOME"] = str(tmp_path)
    if where == "cluster":
        env["RAY_ADDRESS"] = cluster.address
        expected = sorted(node.ip for node in cluster.nodes)
    else:
        # Ray on Linux advertises the machine's routable address for a local Ray, unless
        # multi-node clusters are off: keep this one on loopback, in a temp dir of its own.
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="ray", dir="/tmp")
        expected = ["127.0.0.1"]
    try:
        process = subprocess.run(
            [sys.executable, "-c", CONNECT_SCRIPT],
            env=env,
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            check=False,
        )
        if "RAY_TMPDIR" in env:  # the local Ray stopped with the executor's close
            assert processes_mentioning(env["RAY_TMPDIR"]) == []
    finally:
        if "RAY_TMPDIR" in env:
            shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    assert process.returncode == 0, process.stderr[-5000:]
    report = json.loads(process.stdout.strip().splitlines()[-1])
    assert report == {
        "nodes": expected,
        "handler_kept": True,
        "open_after_first_close": True,
        "open_after_last_close": False,
        "callers_connection_kept": True,
    }


def test_stopping_a_cluster_leaves_other_ray_processes_alone(ray_cluster: RayCluster) -> None:
    ours = {pid for node in ray_cluster.nodes for pid in node.core_processes()}
    assert len(ours) == 2 * 2 + 1  # ray start and raylet of each node, the head's GCS
    with start_cluster(workers=0) as other:
        theirs = set(other.processes())
        assert theirs and not theirs & ours
    # Leaving the block stopped ``other`` and checked that none of its processes is left.
    assert not theirs & set(processes_mentioning(str(other.root)))
    assert ours == {pid for node in ray_cluster.nodes for pid in node.core_processes()}


# --- resources ----------------------------------------------------------------------------------


def test_task_memory_follows_the_group_size(s3: S3Bucket) -> None:
    _, table = make_table(s3)
    options = resolve_options(
        TABLE, {}, target_file_size="32KiB", allow_small_target=True, min_input_files=2
    )
    plan, _ = plan_rewrite(table, TABLE, options.plan)
    task = plan_tasks(plan, "0123456789ab", {}, options.execution)[0]
    assert task_memory(task) == MEMORY_FLOOR  # a few small files
    big = replace(task, inputs=task.inputs * 20_000)  # ~1.8 GB of inputs
    assert big.input_bytes > 1024 * MiB
    expected = MEMORY_BASE + DECODE_FACTOR * big.read_ahead + ROW_GROUP_FACTOR * big.row_group_size
    assert expected > MEMORY_FLOOR  # from the budgets --memory-limit gives each task
    assert task_memory(big) == expected
    assert task_memory(big, ceiling=MEMORY_FLOOR + 1) == MEMORY_FLOOR + 1


def test_executor_refuses_bad_settings() -> None:
    with pytest.raises(UsageError, match="parallelism: must be at least 1"):
        RayExecutor("127.0.0.1:1", parallelism=0)
    with pytest.raises(UsageError, match="expected auto, HOST:PORT"):
        RayExecutor("nowhere")
    with pytest.raises(CompactorError, match=r"ray: cannot connect to 127\.0\.0\.1:1: "):
        RayExecutor("127.0.0.1:1")
