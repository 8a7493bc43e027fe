"""CPU seconds a rewrite task spends in named phases, for ``bench rewrite``'s breakdown.

Off unless :func:`enable` was called in the process: :func:`phase` then costs one thread-local
lookup. On, :func:`~compactor.rewrite.task_runner.run_task` records into one
:class:`PhaseTimes` per task (:func:`recording`), and the threads a task starts record into it
too (:func:`carried`). Seconds are the thread's own (``time.thread_time``: CPU, not waiting),
summed over the task's threads; a phase timed inside another is left out of the outer one, so
the phases never count a second twice and sum to at most the CPU the task's threads used.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

_enabled = False
_local = threading.local()  # .times: the recorder of this thread; .stack: its open phases
_NOTHING = contextlib.nullcontext()


def enable() -> None:
    """Record phase times in the tasks this process runs from now on."""
    global _enabled
    _enabled = True


class PhaseTimes:
    """CPU seconds per phase, summed over threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals: dict[str, float] = {}

    @classmethod
    def if_enabled(cls) -> PhaseTimes | None:
        """A new recorder if :func:`enable` was called, else None."""
        return cls() if _enabled else None

    def add(self, name: str, cpu: float) -> None:
        with self._lock:
            self._totals[name] = self._totals.get(name, 0.0) + cpu

    def to_dict(self) -> dict[str, float]:
        """``{phase: CPU seconds}``."""
        with self._lock:
            return dict(sorted(self._totals.items()))


def current() -> PhaseTimes | None:
    """The recorder this thread records into, if any."""
    return getattr(_local, "times", None)


@contextlib.contextmanager
def recording(times: PhaseTimes | None) -> Iterator[None]:
    """Record this thread's phases into ``times`` (nothing if None) until the block ends."""
    before = current()
    _local.times = times
    try:
        yield
    finally:
        _local.times = before


def carried(function: Callable[P, R]) -> Callable[P, R]:
    """``function``, recording into this thread's recorder in whichever thread it runs."""
    times = current()
    if times is None:
        return function

    @functools.wraps(function)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with recording(times):
            return function(*args, **kwargs)

    return run


def phase(name: str) -> contextlib.AbstractContextManager[Any]:
    """A block counted as phase ``name`` (less the phases timed inside it)."""
    times = current()
    return _NOTHING if times is None else _Timed(times, name)


class _Timed:
    """One timed block of phase ``name``, recorded into ``times`` when it ends."""

    def __init__(self, times: PhaseTimes, name: str) -> None:
        self._times, self._name = times, name
        stack = getattr(_local, "stack", None)
        if stack is None:
            stack = _local.stack = []
        self._stack: list[_Timed] = stack
        self.inner = 0.0  # CPU seconds of the phases timed inside this one

    def __enter__(self) -> None:
        self._stack.append(self)
        self._started = time.thread_time()

    def __exit__(self, *_: object) -> None:
        cpu = time.thread_time() - self._started
        self._stack.pop()
        self._times.add(self._name, cpu - self.inner)
        if self._stack:
            self._stack[-1].inner += cpu


def timed(name: str, items: Iterable[T]) -> Iterator[T]:
    """``items``, producing each one counted as phase ``name``."""
    iterator = iter(items)
    while True:
        with phase(name):
            try:
                item = next(iterator)
            except StopIteration:
                return
        yield item
