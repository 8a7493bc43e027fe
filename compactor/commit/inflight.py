"""The run record kept beside a table: an advisory lease naming the run and the files it writes.

A run writes ``metadata/compactor-run.{0,1}.json`` under the table location before it writes
any file and deletes the record when it ends. The record names the run; the files the run's
rewrite tasks create are listed, each *before* it is created, in the tasks' own intent files
(``metadata/compactor-intent-<run id>-*``, :mod:`compactor.rewrite.intent`), and the metadata files
the driver writes for its commits in the record itself, also before they are created. Writes
alternate between the two slots with a sequence number, so a write torn by a crash only damages
one slot and the other still lists every file created so far.

A record left behind belongs to a run that was killed. The next run takes the lease, carrying
the dead run's id and files over into its own record, then deletes every file the dead run's
record and intent files list that no snapshot references, and then those intent files. While a
live run holds the record, other runs back off; the catalog's optimistic commit remains the
authority on correctness.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pyiceberg.table import Table

from compactor.errors import CommitConflictError, CompactorError, first_line
from compactor.iceberg.references import table_references
from compactor.rewrite.intent import intent_files, listed_files
from compactor.storage.deleter import delete_files

log = logging.getLogger(__name__)

RECORD_SLOTS = ("compactor-run.0.json", "compactor-run.1.json")
# Reads of the run record: attempts, and the first back-off (doubling) between them.
SMALL_READ_ATTEMPTS = 5
SMALL_READ_BACKOFF_S = 0.1


class LeaseHeldError(CompactorError):
    """Another live run holds the table's lease; this run backs off without doing anything."""


@dataclass
class RunRecord:
    """What is stored in the record file."""

    run_id: str
    host: str
    pid: int
    started_ms: int
    expires_ms: int
    files: list[str] = field(default_factory=list)
    seq: int = 0
    process: str = ""  # process_token(pid) when written: tells a reused PID from the writer
    pid_namespace: str = ""  # the writer's PID namespace (Linux); where its PID means anything
    # Abandoned runs this record took over: their intent files are this record's too.
    abandoned_runs: list[str] = field(default_factory=list)

    @property
    def runs(self) -> list[str]:
        """This run and the abandoned runs it took over: whose intent files the record covers."""
        return [self.run_id, *self.abandoned_runs]

    def is_live(self, now_ms: int) -> bool:
        """A record is live until it expires, unless its process is provably gone.

        A PID proves something only inside the PID namespace and boot it was taken in: two
        containers may share a host name (host networking, a fixed hostname) yet each see
        other processes under the same PIDs. So the record's process counts as gone only when
        the record was written in this very namespace and boot, and that PID is free or now
        belongs to a process started later. Otherwise only the expiry tells: a crashed run's
        record blocks the table for at most the lease TTL.
        """
        here, token = pid_namespace(), self.process
        if (
            self.host == socket.gethostname()
            and here
            and self.pid_namespace == here
            and token.split(":", 1)[0] == boot_id() != ""
        ):
            alive = _process_exists(self.pid)
            current = process_token(self.pid) if alive else ""
            if not alive or (current and current != token):
                return False
        return now_ms < self.expires_ms


def boot_id() -> str:
    """This boot's id (Linux); empty where ``/proc`` cannot tell."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def pid_namespace() -> str:
    """This process's PID namespace, e.g. ``pid:[4026531836]`` (Linux); empty elsewhere."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def process_token(pid: int) -> str:
    """Boot id and start time of process ``pid`` (Linux); empty where ``/proc`` cannot tell."""
    boot = boot_id()
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    fields = stat.rsplit(")", 1)[-1].split()  # after "pid (comm)": field 3 onwards
    return f"{boot}:{fields[19]}" if boot and len(fields) > 19 else ""  # field 22: starttime


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _now_ms() -> int:
    return int(time.time() * 1000)


def record_paths(table: Table) -> list[str]:
    """The two slots of the table's run record."""
    return [f"{table.metadata.location.rstrip('/')}/metadata/{name}" for name in RECORD_SLOTS]


def _read_small_file(table: Table, path: str) -> bytes | None:
    """The bytes of ``path``, or None when it does not exist; storage errors are retried.

    A small ranged read fails at once on a throttled object store (an error document larger
    than the range is not retried by pyarrow), so a few attempts are made here with back-off.
    """
    for attempt in range(SMALL_READ_ATTEMPTS):
        try:
            source = table.io.new_input(path)
            if not source.exists():
                return None
            with source.open() as stream:
                return stream.read()
        except OSError as exc:
            if attempt + 1 == SMALL_READ_ATTEMPTS:
                raise CompactorError(
                    f"run record {path}: cannot be read ({first_line(exc)})"
                ) from exc
            time.sleep(random.uniform(0.5, 1.0) * SMALL_READ_BACKOFF_S * 2**attempt)
    return None


def read_record(table: Table) -> RunRecord | None:
    """The newest intact slot of the table's run record, or None when there is none.

    A slot torn by a crash is ignored; if no slot is intact, the record counts as abandoned.
    """
    found: list[RunRecord] = []
    exists = False
    for path in record_paths(table):
        text = _read_small_file(table, path)
        if text is None:
            continue
        exists = True
        try:
            found.append(RunRecord(**json.loads(text)))
        except (ValueError, TypeError) as exc:
            log.warning("unreadable run record %s (%s): ignoring this slot", path, exc)
    if found:
        return max(found, key=lambda r: r.seq)
    return (
        RunRecord(run_id="unknown", host="", pid=0, started_ms=0, expires_ms=0) if exists else None
    )


def run_files(
    table: Table, run_ids: list[str], files: Sequence[str] = ()
) -> tuple[list[str], list[str]]:
    """``files`` plus every file the intent files of runs ``run_ids`` list; and those intent files.

    Each file was recorded before it was created, so whatever such a run left in storage is
    among them.
    """
    intents = intent_files(table.io, table.metadata.location, run_ids)
    return list(dict.fromkeys([*files, *listed_files(table.io, intents)])), intents


def recorded_files(table: Table, record: RunRecord) -> tuple[list[str], list[str]]:
    """Every file ``record`` covers (its own list and its runs' intent files), and the latter."""
    return run_files(table, record.runs, record.files)


def remove_run_files(
    table: Table, run_ids: list[str], files: list[str], keep: Callable[[], set[str]]
) -> tuple[list[str], list[str]]:
    """Delete the files of :func:`run_files` but those in ``keep()`` (asked only if there are
    any), then, once every one is gone, the intent files. Returns (deleted, not deleted).
    """
    candidates, intents = run_files(table, run_ids, files)
    kept = keep() if candidates else set()
    leftovers = [path for path in candidates if path not in kept]
    failed = delete_files(table.io, leftovers) or delete_files(table.io, intents)
    return [p for p in leftovers if p not in set(failed)], failed


def recover_abandoned_files(table: Table, record: RunRecord) -> list[str]:
    """Delete the files an abandoned run wrote that no snapshot of ``table`` references.

    Returns the files deleted; their intent files go too once they are all gone.
    """
    deleted, failed = remove_run_files(
        table, record.runs, record.files, lambda: table_references(table).all()
    )
    if failed:
        raise CompactorError(
            f"table {'.'.join(table.name())}: could not delete {len(failed)} files of abandoned "
            f"run {record.run_id}, e.g. {sorted(failed)[0]}"
        )
    return deleted


class RunLease:
    """Holds a table's run record for one run: acquire, add files, heartbeat, release."""

    def __init__(self, table: Table, run_id: str, ttl_s: float) -> None:
        self._table = table
        self._paths = record_paths(table)
        self._ttl_ms = int(ttl_s * 1000)
        self._record = RunRecord(
            run_id,
            socket.gethostname(),
            os.getpid(),
            _now_ms(),
            0,
            process=process_token(os.getpid()),
            pid_namespace=pid_namespace(),
        )
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self.lost = False
        self.recovered: list[str] = []

    def acquire(self) -> None:
        """Take the lease, then clean up after an abandoned run; raise if a live run holds it.

        The lease is claimed before anything is deleted, and the claim carries the abandoned
        run's file list: a run that only seemed abandoned (its heartbeat stalled past the TTL)
        finds the record no longer its own and refuses to commit, and a crash during the
        clean-up leaves the list to the next run.
        """
        name = ".".join(self._table.name())
        existing = read_record(self._table)
        if existing is not None:
            if existing.is_live(_now_ms()):
                raise LeaseHeldError(
                    f"table {name}: run {existing.run_id} "
                    f"(host {existing.host}, pid {existing.pid}) is compacting it; backing off"
                )
            self._record.seq = existing.seq
            self._record.files = list(existing.files)
            self._record.abandoned_runs = list(dict.fromkeys(existing.runs))
        self._write()
        current = read_record(self._table)
        if current is None or current.run_id != self._record.run_id:
            raise LeaseHeldError(f"table {name}: another run took the lease first")
        if existing is not None:
            log.info("recovering abandoned run %s", existing.run_id)
            self.recovered = recover_abandoned_files(self._table, existing)
        self._heartbeat = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
        self._heartbeat.start()

    def add_files(self, paths: list[str]) -> None:
        """Record paths (the driver's metadata files) before the files are created, so a crash
        never leaves one untracked.

        Raises :class:`CommitConflictError` once another run holds the record: the files
        must not be created, and the other run's record must not be overwritten.
        """
        with self._lock:
            self._check_held_locked()
            self._record.files.extend(paths)
            self._write_locked()

    def verify(self) -> None:
        """Raise unless the record is still this run's (checked just before each commit)."""
        with self._lock:
            self._check_held_locked()

    def release(self) -> None:
        """Stop the heartbeat and delete the record if it is still this run's."""
        self._stop_heartbeat()
        with self._lock:
            if self._holds_locked():
                delete_files(self._table.io, self._paths)

    def abandon(self) -> None:
        """Stop the heartbeat and leave the record, expired, for the next run to clean up after."""
        self._stop_heartbeat()
        with self._lock:
            if self._holds_locked():
                self._ttl_ms = -self._ttl_ms if self._ttl_ms > 0 else self._ttl_ms
                self._write_locked()

    def _stop_heartbeat(self) -> None:
        self._stopped.set()
        if self._heartbeat:
            self._heartbeat.join()

    def _beat(self) -> None:
        while not self._stopped.wait(self._ttl_ms / 3000):
            with self._lock:
                try:
                    if not self._holds_locked():
                        return
                    self._write_locked()
                except Exception as exc:  # a storage hiccup: the next beat tries again
                    log.warning("run record heartbeat failed, retrying: %s", first_line(exc))

    def _holds_locked(self) -> bool:
        """Whether the newest record is still this run's; sets ``lost`` for good when not."""
        if not self.lost:
            current = read_record(self._table)
            self.lost = current is None or current.run_id != self._record.run_id
        return not self.lost

    def _check_held_locked(self) -> None:
        if not self._holds_locked():
            raise CommitConflictError(
                f"table {'.'.join(self._table.name())}: run {self._record.run_id} lost its lease "
                "(another run took over the table); not committing"
            )

    def _write(self) -> None:
        with self._lock:
            self._write_locked()

    def _write_locked(self) -> None:
        self._record.expires_ms = _now_ms() + self._ttl_ms
        self._record.seq += 1
        fields = asdict(self._record)
        if not fields["abandoned_runs"]:  # the common case: readable by earlier versions too
            del fields["abandoned_runs"]
        payload = json.dumps(fields).encode()
        slot = self._paths[self._record.seq % len(self._paths)]
        with self._table.io.new_output(slot).create(overwrite=True) as stream:
            stream.write(payload)
