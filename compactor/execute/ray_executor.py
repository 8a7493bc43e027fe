"""Rewrite tasks as Ray tasks: ``compactor run --executor ray`` (needs ``compactor[ray]``).

The driver sends each :class:`~compactor.planning.tasks.RewriteTask` as its JSON and gets the
:class:`~compactor.planning.tasks.TaskResult` back as JSON: nothing relies on pickling pyiceberg objects,
and every node needs the same compactor version (the JSON carries a version that is checked).
Each Ray task runs :func:`compactor.rewrite.task_runner.run_task` on a worker, which reads the inputs and
writes the outputs straight to the table's storage, recording its intent first.

Connection (:class:`RayExecutor`): an explicit ``address`` (``auto``, ``HOST:PORT`` of the GCS,
or ``ray://HOST:PORT`` of a Ray Client server) is connected to; without one, ``RAY_ADDRESS`` is,
and without that a local single-node Ray is started in this process. A ``HOST:PORT`` that does
not accept TCP connections fails at once (Ray itself would wait for minutes). A connection
already made in this process (by the caller, or another executor) is reused; one this module
made is shut down when the last executor using it is closed.

Resources: every task asks for 1 CPU and the memory :func:`task_memory` estimates from its
size. Retries: a task whose worker or node dies is retried up to ``max_retries`` times; the
attempt that died leaves its files listed in its own intent file, which the driver cleans up.
Exceptions are never retried (``retry_exceptions=False``): a failure of the task itself is
deterministic. Cancellation: ``ray.cancel`` interrupts the worker's main thread, which sets the
task's cancel token, so :func:`~compactor.rewrite.task_runner.run_task` stops at its next input file,
deletes what it wrote and fails with :class:`~compactor.rewrite.task_runner.TaskCancelled`.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any

import ray
from ray.exceptions import RayError, RayTaskError, TaskCancelledError

from compactor.errors import CompactorError, UsageError, first_line
from compactor.execute.executors import Outcome
from compactor.planning.tasks import RewriteTask, TaskResult
from compactor.rewrite.task_runner import CancelToken, EventToken, TaskCancelled, run_task
from compactor.sizes import GiB, MiB

log = logging.getLogger(__name__)

# Memory one task asks Ray for: see task_memory.
MEMORY_BASE = 256 * MiB  # a Ray worker with compactor imported: 159 MB RSS measured
DECODE_FACTOR = 4  # Arrow bytes per Parquet byte of input read ahead, decompressed and decoded
ROW_GROUP_FACTOR = 5  # the buffered row group, the table built from it, encoded pages, slack
MEMORY_FLOOR = 512 * MiB
MEMORY_CEILING = 16 * GiB
# Attempts after the first when a task's worker or node dies (Ray's own default).
DEFAULT_MAX_RETRIES = 3
# How long a HOST:PORT address may take to accept a TCP connection.
CONNECT_TIMEOUT_S = 10.0
# Connections tried when a Ray client proxy fails to start its per-client server.
CLIENT_INIT_ATTEMPTS = 3
# How often the driver checks the cancel token while it waits for tasks.
POLL_INTERVAL_S = 0.5
# How often a worker's main thread wakes up to notice a cancellation.
SUPERVISE_INTERVAL_S = 0.2
INSTALL_HINT = (
    "the cluster's nodes need compactor installed: an image with it, or a runtime_env that "
    "installs it (deploy/ray/README.md)"
)


def task_memory(task: RewriteTask, ceiling: int = MEMORY_CEILING) -> int:
    """Bytes of memory a task asks Ray for: what a rewrite holds at its peak, estimated.

    ``MEMORY_BASE`` for the worker process, plus ``DECODE_FACTOR`` x the input read ahead of
    the writer (``min(input bytes, read_ahead)``), plus ``ROW_GROUP_FACTOR`` x the row group the
    writer buffers (``min(DECODE_FACTOR x input bytes, row_group_size)``); clamped to
    [MEMORY_FLOOR, ceiling]. With the defaults (read-ahead 64 MiB, row groups 128 MiB) a large
    group asks for 256 + 256 + 640 = 1152 MiB: a one-group rewrite of 1 GB measured 926 MB of
    peak RSS above its process's baseline (docs/benchmarks.md), this allows 940 MB.
    """
    read = min(task.input_bytes, task.read_ahead) * DECODE_FACTOR
    buffered = min(task.input_bytes * DECODE_FACTOR, task.row_group_size)
    estimate = MEMORY_BASE + read + ROW_GROUP_FACTOR * buffered
    return int(max(MEMORY_FLOOR, min(ceiling, estimate)))


# --- the worker's side ----------------------------------------------------------------------


def _error_json(exc: BaseException) -> str:
    args = [a for a in exc.args if isinstance(a, str)]
    return json.dumps(
        {
            "module": type(exc).__module__,
            "type": type(exc).__qualname__,
            "message": first_line(exc),
            # What rebuilds a compactor error as it was (an UnreadableFileError's path and reason).
            "args": args if args and len(args) == len(exc.args) else [first_line(exc)],
            "traceback": "".join(traceback.format_exception(exc))[-8000:],
        }
    )


def _supervised(
    task: RewriteTask, work: Callable[[threading.Event], tuple[str, str]]
) -> tuple[str, str]:
    """Run ``work`` in a thread while this (main) thread turns SIGINT into its cancel event.

    ``ray.cancel`` interrupts the main thread as SIGINT would; a main thread blocked in a read
    would notice that only when the read returns, so the rewrite runs in a thread and the main
    thread waits in short steps: the event is set at once and the rewrite stops at its next
    input file, cleaning up after itself.
    """
    cancel = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        return work(cancel)

    def on_interrupt(_signum: int, _frame: FrameType | None) -> None:
        if not cancel.is_set():
            cancel.set()
            said = f"compactor: run {task.run_id} group {task.task_id}: cancel requested"
            print(said, file=sys.stderr, flush=True)

    outcome: list[tuple[str, str]] = []
    thread = threading.Thread(
        target=lambda: outcome.append(work(cancel)), name=f"compactor-g{task.task_id}", daemon=True
    )
    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        thread.start()
        while thread.is_alive():
            thread.join(SUPERVISE_INTERVAL_S)
    finally:
        signal.signal(signal.SIGINT, previous)
    return outcome[0]


WorkerReply = tuple[str, str, str, str]
"""What :func:`run_on_worker` returns: node id, node ip, ``"result"`` or ``"error"``, JSON."""


def run_on_worker(task_json: str) -> WorkerReply:
    """The Ray task: ``(node id, node ip, "result" | "error", JSON)`` for one task's JSON."""
    context = ray.get_runtime_context()
    node_id, node_ip = context.get_node_id(), ray.util.get_node_ip_address()
    task = RewriteTask.from_json(task_json)

    def work(cancel: threading.Event) -> tuple[str, str]:
        try:
            return "result", run_task(task, EventToken(cancel)).to_json()
        except BaseException as exc:  # returned as a value: Ray never pickles it
            return "error", _error_json(exc)

    kind, payload = _supervised(task, work)
    return node_id, node_ip, kind, payload


# --- the driver's side ----------------------------------------------------------------------


def _error_from(task: RewriteTask, payload: str) -> BaseException:
    """The exception a task reported: its compactor class again (from its arguments), else a
    CompactorError."""
    data = json.loads(payload)
    log.debug("ray: group %d failed on the cluster:\n%s", task.task_id, data.get("traceback"))
    module, name, message = data["module"], data["type"], data["message"]
    if module == "compactor" or module.startswith("compactor."):
        try:
            cls = getattr(importlib.import_module(module), name)
            if isinstance(cls, type) and issubclass(cls, CompactorError):
                return cls(*data.get("args", [message]))
        except (ImportError, AttributeError, TypeError):
            pass
    return CompactorError(f"ray: group {task.task_id}: {name}: {message}")


def _ray_error(task: RewriteTask, exc: RayError) -> BaseException:
    """A Ray failure of ``task`` as one line."""
    if isinstance(exc, TaskCancelledError):
        return TaskCancelled(f"table {task.table}: stopped before group {task.task_id} finished")
    cause = exc.cause if isinstance(exc, RayTaskError) else None
    text = f"{type(cause).__name__}: {first_line(cause)}" if cause else first_line(exc)
    if "No module named 'compactor" in str(exc):
        text += f" ({INSTALL_HINT})"
    return CompactorError(f"ray: group {task.task_id} failed: {text}")


def _not_started(task: RewriteTask) -> TaskCancelled:
    return TaskCancelled(f"table {task.table}: stopped before group {task.task_id} started")


def _target(address: str | None) -> str:
    """The address to connect to: the given one, else RAY_ADDRESS, else ``local`` (start one)."""
    return address or os.environ.get("RAY_ADDRESS") or "local"


def _probe(target: str) -> None:
    """Fail at once when a ``[ray://]HOST:PORT`` address does not accept TCP connections."""
    if target in ("auto", "local"):
        return
    rest = target.split("://", 1)[1] if "://" in target else target
    host, sep, port = rest.rstrip("/").rpartition(":")
    if not sep or not host or not port.isdigit():
        raise UsageError(
            f"ray_address {target!r}: expected auto, HOST:PORT or ray://HOST:PORT", "ray_address"
        )
    try:
        with socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise CompactorError(f"ray: cannot connect to {target}: {first_line(exc)}") from None


def _init_failure(exc: BaseException) -> str:
    """One line for a failed ``ray.init``: the first line and, when it only introduces what
    follows (the Ray client's "Initialization failure from server:" and the server's
    traceback), also the last line, which names the cause."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} {lines[-1]}"
    return first_line(exc)


def _token_refused(exc: BaseException | None) -> bool:
    """Whether ``exc`` or one of its causes says the cluster wants a token it did not get."""
    while exc is not None:
        if type(exc).__name__ == "AuthenticationError" or "InvalidAuthToken" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _token_refusal(target: str) -> str:
    """One line for a cluster with token authentication that refused this process."""
    sent = os.environ.get("RAY_AUTH_MODE") == "token"
    why = "refused the token this process sent" if sent else "requires a token; none was sent"
    return (
        f"ray: {target} {why}: set RAY_AUTH_MODE=token and the cluster's token in "
        "RAY_AUTH_TOKEN, a file named by RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token"
    )


class _Connection:
    """This process's connection to Ray, shared by every executor; shut down by its last user.

    Only a connection this module made is ever shut down: one the caller made stays.
    """

    lock = threading.Lock()
    users = 0
    owned = False
    target: str | None = None

    @classmethod
    def acquire(cls, address: str | None, parallelism: int | None) -> None:
        target = _target(address)
        with cls.lock:
            if ray.is_initialized():
                if cls.users and cls.target != target and address is not None:
                    raise UsageError(
                        f"ray: this process is connected to {cls.target}; "
                        f"cannot also connect to {target}",
                        "ray_address",
                    )
                cls.users += 1
                return
            _probe(target)
            _init(target, parallelism)
            cls.users, cls.owned, cls.target = 1, True, target

    @classmethod
    def release(cls) -> None:
        with cls.lock:
            cls.users = max(0, cls.users - 1)
            if cls.users == 0 and cls.owned:
                cls.owned, cls.target = False, None
                ray.shutdown()


def _raylet_messages_to_log() -> None:
    """Send the raylet's messages to the driver (a task retried after its node died) to ``log``.

    Ray prints them to stdout, where ``--json`` output goes. The one patch of a private Ray
    function in compactor; without the function (another Ray version) messages stay on stdout.
    """
    module = getattr(getattr(ray, "_private", None), "worker", None)
    original = getattr(module, "print_to_stdstream", None)
    if original is None or getattr(original, "compactor_patched", False):
        return

    def to_log(data: dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") == "raylet":
            for line in data.get("lines", []):
                log.warning("ray: %s", str(line).strip())
        else:
            original(data, ignore_prefix)

    to_log.compactor_patched = True  # type: ignore[attr-defined]
    module.print_to_stdstream = to_log  # type: ignore[union-attr]


def _init(target: str, parallelism: int | None) -> None:
    """``ray.init`` with quiet logs; keeps this process's SIGTERM and SIGINT handlers."""
    options: dict[str, Any] = {
        "address": target,
        "ignore_reinit_error": True,
        "log_to_driver": False,
        "logging_level": logging.WARNING,
    }
    if target == "local":
        options.update(include_dashboard=False, num_cpus=parallelism)
    main = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
    _raylet_messages_to_log()
    try:
        for attempt in range(1, CLIENT_INIT_ATTEMPTS + 1):
            try:
                ray.init(**options)
                break
            except ConnectionAbortedError as exc:
                # The head's client proxy failed to start the server it runs for each client
                # connection; a fresh connection gets a fresh server.
                if attempt == CLIENT_INIT_ATTEMPTS:
                    raise
                log.warning("ray: %s: %s; connecting again", target, _init_failure(exc))
                ray.shutdown()
    except ValueError as exc:
        raise UsageError(f"ray_address {target!r}: {first_line(exc)}", "ray_address") from None
    except Exception as exc:
        if _token_refused(exc):
            raise CompactorError(_token_refusal(target)) from None
        raise CompactorError(f"ray: cannot connect to {target}: {_init_failure(exc)}") from None
    finally:
        # ray.init makes SIGTERM exit the process; the caller's handler stops a run cleanly.
        for sig, handler in handlers.items():
            if handler is not None:
                signal.signal(sig, handler)


class RayExecutor:
    """Runs rewrite tasks as Ray tasks (see the module docstring).

    ``parallelism`` caps the tasks in flight at once; None leaves it to Ray, which runs as
    many as the cluster's CPUs and memory allow. ``nodes`` maps each finished task's id to the
    Ray node id it ran on.
    """

    def __init__(
        self,
        address: str | None = None,
        parallelism: int | None = None,
        *,
        max_retries: int = DEFAULT_MAX_RETRIES,
    ) -> None:
        if parallelism is not None and parallelism < 1:
            raise UsageError(f"parallelism: must be at least 1, got {parallelism}", "parallelism")
        if max_retries < 0:
            raise UsageError(f"max_retries: must be 0 or more, got {max_retries}")
        self.address, self.parallelism, self.max_retries = address, parallelism, max_retries
        self.nodes: dict[int, str] = {}
        _Connection.acquire(address, parallelism)
        self._closed = False
        self._remote = ray.remote(run_on_worker)

    def _submit(self, task: RewriteTask, memory_ceiling: int) -> ray.ObjectRef[WorkerReply]:
        return self._remote.options(
            name=f"compactor {task.table} g{task.task_id}",
            num_cpus=1,
            memory=task_memory(task, memory_ceiling),
            max_retries=self.max_retries,
            retry_exceptions=False,
        ).remote(task.to_json())

    def _outcome(self, task: RewriteTask, ref: ray.ObjectRef[WorkerReply]) -> Outcome:
        try:
            node_id, node_ip, kind, payload = ray.get(ref)
        except RayError as exc:
            return _ray_error(task, exc)
        self.nodes[task.task_id] = node_id
        log.debug("ray: group %d ran on node %s (%s)", task.task_id, node_id, node_ip)
        try:
            return TaskResult.from_json(payload) if kind == "result" else _error_from(task, payload)
        except Exception as exc:  # an unreadable result is this task's failure
            return CompactorError(f"ray: group {task.task_id}: bad result: {first_line(exc)}")

    def run(
        self, tasks: Sequence[RewriteTask], cancel: CancelToken
    ) -> Iterator[tuple[RewriteTask, Outcome]]:
        """Yield every task with its result or exception as it finishes (see ``Executor``)."""
        if self._closed:
            raise CompactorError("ray: executor is closed")
        ceiling = min(_largest_node_memory() or MEMORY_CEILING, MEMORY_CEILING)
        queue = deque(tasks)
        pending: dict[ray.ObjectRef[WorkerReply], RewriteTask] = {}
        cancelled = False
        try:
            while queue or pending:
                if not cancelled and cancel.is_cancelled():
                    cancelled = True
                    for ref in pending:
                        ray.cancel(ref)
                    while queue:
                        task = queue.popleft()
                        yield task, _not_started(task)
                    continue
                while queue and (self.parallelism is None or len(pending) < self.parallelism):
                    task = queue.popleft()
                    pending[self._submit(task, ceiling)] = task
                done, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_INTERVAL_S)
                for ref in done:
                    task = pending.pop(ref)
                    yield task, self._outcome(task, ref)
        finally:
            _stop(pending)

    def close(self) -> None:
        """Disconnect from Ray if this executor's connection was the last one this module made."""
        if not self._closed:
            self._closed = True
            _Connection.release()

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _largest_node_memory() -> int:
    """The most memory (Ray's ``memory`` resource) any alive node has; 0 when none says."""
    try:
        nodes = ray.nodes()
    except Exception:  # informative only: Ray schedules anyway
        return 0
    return int(max((n["Resources"].get("memory", 0) for n in nodes if n.get("Alive")), default=0))


def _stop(pending: dict[ray.ObjectRef[WorkerReply], RewriteTask]) -> None:
    """Cancel the tasks still pending and wait until every one has ended (and cleaned up)."""
    if not pending:
        return
    for ref in pending:
        ray.cancel(ref)
    waiting = list(pending)
    while waiting:
        _, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=POLL_INTERVAL_S)
