"""Which run starts next: priorities, the concurrency limit, cool-downs and back-off.

Pure bookkeeping over an injected clock, so every rule is testable without waiting. The daemon
offers requests (a table that crossed a threshold, a table whose expiry is due) and takes the
ones that may start now; it reports each run's outcome back.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SUCCEEDED = "succeeded"  # committed, nothing failed
NOOP = "noop"  # nothing worth doing was found
PARTIAL = "partial"  # committed some groups, others failed
CONFLICT = "conflict"  # nothing committed: commit conflicts with concurrent writers
FAILED = "failed"  # an error
CANCELLED = "cancelled"  # stopped by a drain before it finished
SKIPPED = "skipped"  # another process held the table's lease
INTERRUPTED = "interrupted"  # the daemon died while it ran (found open at the next start)
OUTCOMES = (SUCCEEDED, NOOP, PARTIAL, CONFLICT, FAILED, CANCELLED, SKIPPED, INTERRUPTED)

_FAILURES = {FAILED, INTERRUPTED}
_CONFLICTS = {CONFLICT}
_CLEAN = {SUCCEEDED, NOOP}
_NOT_RUNS = {CANCELLED, SKIPPED}  # outcomes that neither rest a table nor count against it


@dataclass(frozen=True)
class Request:
    """A run to start: ``action`` on ``table`` for ``job``; higher ``priority`` goes first."""

    table: str
    action: str
    job: str
    priority: float = 0.0
    cooldown_s: float = 0.0
    payload: Any = field(default=None, compare=False)

    @property
    def key(self) -> tuple[str, str]:
        return self.table, self.action


@dataclass
class KeyState:
    """What is known of one (table, action): its last finished run and the streaks before it."""

    last_end: float | None = None
    failures: int = 0
    conflicts: int = 0

    def record(self, outcome: str, partial_conflicts: bool, now: float) -> None:
        if outcome in _NOT_RUNS:
            return
        self.last_end = now
        if outcome in _FAILURES:
            self.failures += 1
        elif outcome in _CONFLICTS or (outcome == PARTIAL and partial_conflicts):
            self.conflicts += 1
        elif outcome in _CLEAN or outcome == PARTIAL:
            self.failures = self.conflicts = 0


class RunPolicy:
    """The queue of requested runs and the rules for starting them.

    - at most ``max_concurrent`` runs at once, and one run per table whatever the action;
    - highest priority first (for compaction: the most fragmented table), then oldest request;
    - after a run of an action on a table, none before ``cooldown_s`` of the next request;
    - after ``n`` failed runs since the last clean one, none for ``backoff_initial_s *
      2**(n-1)`` (capped at ``backoff_max_s``); the same after ``conflicts_before_backoff`` or
      more runs refused by commit conflicts since the last clean one (counting from that
      threshold). A clean run (succeeded, nothing to do, or partial without conflicts) resets
      both counts.
    """

    def __init__(
        self,
        max_concurrent: int,
        backoff_initial_s: float,
        backoff_max_s: float,
        conflicts_before_backoff: int,
        clock: Callable[[], float],
    ) -> None:
        self.max_concurrent = max_concurrent
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.conflicts_before_backoff = conflicts_before_backoff
        self.clock = clock
        self.closed = False
        self._queue: dict[tuple[str, str], tuple[Request, int]] = {}
        self._order = itertools.count()
        self._running: dict[tuple[str, str], Request] = {}
        self._states: dict[tuple[str, str], KeyState] = {}

    # --- state ---------------------------------------------------------------------------------

    def state(self, table: str, action: str) -> KeyState:
        return self._states.setdefault((table, action), KeyState())

    def restore(self, recent: dict[tuple[str, str], list[tuple[str, float, int]]]) -> None:
        """Rebuild streaks from history: per key, (outcome, ended_at, conflicts), newest first."""
        for key, runs in recent.items():
            state = self.state(*key)
            for outcome, ended_at, conflicts in reversed(runs):
                state.record(outcome, conflicts > 0, ended_at)

    def backoff_s(self, state: KeyState) -> float:
        """How long a key rests after its last run because of failures or conflicts."""
        if state.failures:
            exponent = state.failures - 1
        elif state.conflicts >= self.conflicts_before_backoff:
            exponent = state.conflicts - self.conflicts_before_backoff
        else:
            return 0.0
        return min(self.backoff_initial_s * 2 ** min(exponent, 62), self.backoff_max_s)

    def not_before(self, request: Request) -> float:
        """The earliest time ``request`` may start (0 when never run)."""
        state = self._states.get(request.key)
        if state is None or state.last_end is None:
            return 0.0
        return state.last_end + max(request.cooldown_s, self.backoff_s(state))

    # --- queue ---------------------------------------------------------------------------------

    def offer(self, request: Request) -> str | None:
        """Queue ``request``; returns why it was not queued, or None.

        A request for a key already queued replaces it (keeping its place in line).
        """
        if self.closed:
            return "draining"
        if request.key in self._running:
            return "running"
        wait = self.not_before(request) - self.clock()
        if wait > 0:
            state = self._states[request.key]
            why = "backing off" if self.backoff_s(state) > request.cooldown_s else "cooling down"
            return f"{why} for {wait:.0f}s"
        order = self._queue[request.key][1] if request.key in self._queue else next(self._order)
        self._queue[request.key] = (request, order)
        return None

    def take(self) -> list[Request]:
        """Requests that may start now, best first; they count as running until :meth:`finish`."""
        if self.closed:
            return []
        started = []
        busy_tables = {table for table, _ in self._running}
        for request, _ in sorted(self._queue.values(), key=lambda q: (-q[0].priority, q[1])):
            if len(self._running) >= self.max_concurrent:
                break
            if request.table in busy_tables:
                continue
            del self._queue[request.key]
            self._running[request.key] = request
            busy_tables.add(request.table)
            started.append(request)
        return started

    def finish(self, request: Request, outcome: str, conflicts: int = 0) -> None:
        """Record the outcome of a run :meth:`take` returned."""
        self._running.pop(request.key, None)
        self.state(*request.key).record(outcome, conflicts > 0, self.clock())

    def close(self) -> None:
        """Drain: start nothing more; the queue is dropped."""
        self.closed = True
        self._queue.clear()

    @property
    def queued(self) -> list[Request]:
        return [request for request, _ in sorted(self._queue.values(), key=lambda q: q[1])]

    @property
    def running(self) -> list[Request]:
        return list(self._running.values())
