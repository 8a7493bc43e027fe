"""Run the compactor CLI with a crash hook: ``python crash_runner.py POINT N SIGNAL -- ARGS``.

The hook wraps one function of the real code (patched by attribute, so everything else runs as
usual); on its N-th call the process sends itself SIGNAL (``SIGKILL``, or ``SIGTERM`` for a
graceful stop; ``SIGINT,SIGINT`` sends two in a row, as a user pressing Ctrl-C twice) and
reports that on stderr first, so a test can tell its hook fired. Calls are counted across
threads. ``ARGS`` are the ``compactor`` command line (e.g. ``run --table db.events``).

Points (see ``POINTS``):

- ``open``: an output data file was just created (its path recorded), nothing written to it yet.
- ``write``: a row group was just written to an output file that is not closed: what the
  writer has written so far is flushed to the file, which has no footer.
- ``close``: an output data file was just closed, complete (N counts files actually closed).
- ``manifest-list``: a commit attempt wrote its manifests; its manifest list is next.
- ``commit``: the snapshot is ready; the catalog commit is next (``SqlCatalog.commit_table``).
- ``committed``: the catalog commit returned: it landed; clean-up and record release not done.
- ``record``: the run record (``RunLease._write_locked``) is being written: half of the
  payload reaches the slot, then the signal, so that slot is left torn.
- ``intent``: a task's intent file (``IntentLog.add``, before an output file is created) is
  being written: half of it reaches the slot, then the signal.
- ``tick``: a daemon tick is about to score a table (``Daemon._request``). After a graceful
  signal the tick goes on only once the drain is shutting the scheduler down (the scheduler
  then holds its job-store lock, waiting for running ticks).

With SIGKILL the process dies on the spot. After a graceful signal the hook waits until the
signal handler has set its stop event (``run``'s, or the daemon's drain event), so what the run
does next does not depend on thread timing. A second SIGINT makes ``run``'s handler raise
KeyboardInterrupt, which (in the main thread, where commits run) comes out of the hooked
function.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

POINTS = (
    "open",
    "write",
    "close",
    "manifest-list",
    "commit",
    "committed",
    "record",
    "intent",
    "tick",
)
HOOK_MESSAGE = "crash_runner: {point} call {n}: sending {signal}"
# Longest wait for the CLI's handler to take a graceful signal (it takes milliseconds).
HANDLER_TIMEOUT_S = 120


class _Trigger:
    """Counts calls of the hooked function; ``fire`` on the N-th sends the signal."""

    def __init__(self, point: str, n: int, signals: list[signal.Signals]) -> None:
        self.point, self.n, self.signals = point, n, signals
        self._calls = 0
        self._lock = threading.Lock()
        self.stop_event: threading.Event | None = None

    def hit(self) -> bool:
        """Count one call; True for the N-th."""
        with self._lock:
            self._calls += 1
            return self._calls == self.n

    def fire(self) -> None:
        names = ",".join(s.name for s in self.signals)
        sys.stderr.write(HOOK_MESSAGE.format(point=self.point, n=self.n, signal=names) + "\n")
        sys.stderr.flush()
        for sig in self.signals:
            os.kill(os.getpid(), sig)
            if sig == signal.SIGKILL:
                threading.Event().wait()  # never returns: the process is gone
            stop = self.stop_event
            if stop is None or not stop.wait(HANDLER_TIMEOUT_S):
                raise RuntimeError(f"crash_runner: {sig.name} was not handled by the CLI")


class _TornStream:
    """Writes half of what it is given, flushes it to the file, then fires the trigger."""

    def __init__(self, stream: Any, trigger: _Trigger) -> None:
        self._stream, self._trigger = stream, trigger

    def __enter__(self) -> _TornStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stream.close()

    def write(self, data: bytes) -> int:
        self._stream.write(data[: len(data) // 2])
        self._stream.flush()
        self._trigger.fire()
        return len(data)


class _TornIO:
    """A FileIO whose next ``create`` returns a stream that tears its write."""

    def __init__(self, io: Any, trigger: _Trigger) -> None:
        self._io, self._trigger = io, trigger

    def new_output(self, location: str) -> Any:
        output, trigger = self._io.new_output(location), self._trigger

        class _Output:
            def create(self, overwrite: bool = False) -> _TornStream:
                return _TornStream(output.create(overwrite=overwrite), trigger)

        return _Output()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._io, name)


class _TornTable:
    """The lease's table, but with :class:`_TornIO` as its ``io``."""

    def __init__(self, table: Any, trigger: _Trigger) -> None:
        self._table = table
        self.io = _TornIO(table.io, trigger)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._table, name)


def _held(lock: Any) -> bool:
    """Whether another thread holds ``lock``."""
    if lock.acquire(blocking=False):
        lock.release()
        return False
    return True


def _patch(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    setattr(owner, name, make(getattr(owner, name)))


def install(point: str, n: int, signals: list[signal.Signals]) -> _Trigger:
    """Wrap the function of ``point`` so that its ``n``-th call sends ``signals``."""
    from apscheduler.schedulers.base import STATE_STOPPED
    from pyiceberg.catalog.sql import SqlCatalog

    import compactor.cli.compact_commands
    import compactor.daemon.service
    from compactor.commit.inflight import RunLease
    from compactor.commit.snapshot_writer import SnapshotWriter
    from compactor.rewrite.intent import IntentLog
    from compactor.rewrite.parquet_output import RollingParquetWriter

    trigger = _Trigger(point, n, signals)

    real_stop_on_signals = compactor.cli.compact_commands.stop_on_signals

    @contextmanager
    def stop_on_signals() -> Iterator[threading.Event]:
        with real_stop_on_signals() as stop:
            trigger.stop_event = stop
            yield stop

    compactor.cli.compact_commands.stop_on_signals = stop_on_signals

    real_daemon_init = compactor.daemon.service.Daemon.__init__

    def daemon_init(self: compactor.daemon.service.Daemon, *args: Any, **kwargs: Any) -> None:
        real_daemon_init(self, *args, **kwargs)
        trigger.stop_event = self.stopping  # the daemon drains on this event

    compactor.daemon.service.Daemon.__init__ = daemon_init  # type: ignore[method-assign]

    def after(real: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(*args: Any, **kwargs: Any) -> Any:
            result = real(*args, **kwargs)
            if trigger.hit():
                trigger.fire()
            return result

        return hooked

    def before(real: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(*args: Any, **kwargs: Any) -> Any:
            if trigger.hit():
                trigger.fire()
            return real(*args, **kwargs)

        return hooked

    def mid_write(real: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(self: RollingParquetWriter) -> None:
            if not trigger.hit():
                real(self)
                return
            # The row group is written; fire before the file would be closed, or right after
            # the flush if it leaves the file open: either way the file has no footer.
            close = self._close_file

            def fire_mid_write() -> None:
                if self._file is not None:
                    self._file.stream.flush()  # the partial file reaches the disk
                    trigger.fire()

            def close_hooked() -> None:
                fire_mid_write()
                close()

            self._close_file = close_hooked  # type: ignore[method-assign]
            try:
                real(self)
                fire_mid_write()
            finally:
                del self._close_file

        return hooked

    def closing(real: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(self: RollingParquetWriter) -> None:
            had_file = self._file is not None
            real(self)
            if had_file and trigger.hit():
                trigger.fire()

        return hooked

    def torn(real: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(self: RunLease) -> None:
            if not trigger.hit():
                real(self)
                return
            table = self._table
            self._table = _TornTable(table, trigger)  # type: ignore[assignment]
            try:
                real(self)
            finally:
                self._table = table

        return hooked

    def torn_intent(real: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(self: IntentLog, path: str) -> None:
            if not trigger.hit():
                real(self, path)
                return
            io = self._io
            self._io = _TornIO(io, trigger)  # type: ignore[assignment]
            try:
                real(self, path)
            finally:
                self._io = io

        return hooked

    def during_shutdown(real: Callable[..., Any]) -> Callable[..., Any]:
        def hooked(self: compactor.daemon.service.Daemon, *args: Any, **kwargs: Any) -> Any:
            if trigger.hit():
                trigger.fire()
                scheduler, waited = self._scheduler, threading.Event()
                for _ in range(HANDLER_TIMEOUT_S * 100):
                    if scheduler.state == STATE_STOPPED and _held(scheduler._jobstores_lock):
                        break
                    waited.wait(0.01)
                else:
                    raise RuntimeError("crash_runner: the drain did not shut the scheduler down")
            return real(self, *args, **kwargs)

        return hooked

    if point == "open":
        _patch(RollingParquetWriter, "_open_file", after)
    elif point == "write":
        _patch(RollingParquetWriter, "_flush_row_group", mid_write)
    elif point == "close":
        _patch(RollingParquetWriter, "_close_file", closing)
    elif point == "manifest-list":
        _patch(SnapshotWriter, "manifest_list", before)
    elif point == "commit":
        _patch(SqlCatalog, "commit_table", before)
    elif point == "committed":
        _patch(SqlCatalog, "commit_table", after)
    elif point == "record":
        _patch(RunLease, "_write_locked", torn)
    elif point == "intent":
        _patch(IntentLog, "add", torn_intent)
    elif point == "tick":
        _patch(compactor.daemon.service.Daemon, "_request", during_shutdown)
    else:
        raise SystemExit(f"crash_runner: unknown point {point!r}; one of {', '.join(POINTS)}")
    return trigger


def main(argv: list[str]) -> None:
    if len(argv) < 4 or argv[3] != "--":
        raise SystemExit(f"usage: {sys.argv[0]} POINT N SIGNAL -- COMPACTOR-ARGS...")
    point, n = argv[0], int(argv[1])
    signals = [signal.Signals[name] for name in argv[2].split(",")]
    if n < 1:
        raise SystemExit("crash_runner: N counts from 1")
    install(point, n, signals)
    from compactor.cli.app import main as cli_main

    sys.argv = ["compactor", *argv[4:]]
    cli_main()


if __name__ == "__main__":
    main(sys.argv[1:])
