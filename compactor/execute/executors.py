"""Executors run rewrite tasks: in threads of this process (the default), or on a Ray cluster.

An executor receives :class:`~compactor.planning.tasks.RewriteTask` objects and yields each with its
:class:`~compactor.planning.tasks.TaskResult` — or the exception it failed with, as a value — as tasks
finish, in any order. It never commits: the driver does. Tasks record their own intent before
writing, so an executor needs no cleanup of its own beyond stopping its tasks.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from typing import TYPE_CHECKING, Protocol

from compactor.errors import UsageError
from compactor.planning.tasks import RewriteTask, TaskResult
from compactor.rewrite.task_runner import CancelToken, EventToken, run_task

if TYPE_CHECKING:
    pass

Outcome = TaskResult | BaseException


class Executor(Protocol):
    """Runs rewrite tasks somewhere; see the module docstring."""

    def run(
        self, tasks: Sequence[RewriteTask], cancel: CancelToken
    ) -> Iterator[tuple[RewriteTask, Outcome]]:
        """Yield every task with its result or exception as it finishes, in any order.

        Once ``cancel`` is cancelled, tasks not started fail with
        :class:`~compactor.rewrite.task_runner.TaskCancelled` and running ones stop at their next input file.
        When the iterator is closed early, tasks not started are dropped, and it returns only
        once no task it started is still running.
        """
        ...

    def close(self) -> None:
        """Release what the executor holds (threads, a cluster connection)."""
        ...


class _CancelToken:
    """Cancelled when the caller's token is, or when the iterator was closed early."""

    def __init__(self, outer: CancelToken, closed: threading.Event) -> None:
        self._outer, self._closed = outer, EventToken(closed)

    def is_cancelled(self) -> bool:
        return self._closed.is_cancelled() or self._outer.is_cancelled()


class ThreadExecutor:
    """Runs up to ``parallelism`` tasks at once in threads of this process, in task order.

    Beyond the :class:`Executor` protocol, :meth:`run` takes ``on_read``: told (task id, files,
    bytes) as each task reads its inputs, so that progress moves within a long group.
    """

    def __init__(self, parallelism: int) -> None:
        if parallelism < 1:
            raise UsageError(f"parallelism: must be at least 1, got {parallelism}", "parallelism")
        self.parallelism = parallelism

    def run(
        self,
        tasks: Sequence[RewriteTask],
        cancel: CancelToken,
        on_read: Callable[[int, int, int], None] | None = None,
    ) -> Iterator[tuple[RewriteTask, Outcome]]:
        closed = threading.Event()
        token = _CancelToken(cancel, closed)
        with ThreadPoolExecutor(self.parallelism, thread_name_prefix="rewrite") as pool:
            futures: dict[Future[TaskResult], RewriteTask] = {
                pool.submit(
                    run_task, task, token, on_read and functools.partial(on_read, task.task_id)
                ): task
                for task in tasks
            }
            try:
                for future in as_completed(futures):
                    error = future.exception()
                    yield futures[future], future.result() if error is None else error
            finally:
                closed.set()
                for future in futures:
                    future.cancel()

    def close(self) -> None:
        """Nothing to release: each :meth:`run` has its own threads."""
