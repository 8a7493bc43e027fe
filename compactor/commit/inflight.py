"""The run record kept beside a table: an advisory lease naming the run and the files it writes.

A run writes ``metadata/compactor-run.{0,1}.json`` under the table location before it writes
any file and deletes the record when it ends. The record names the run; the files the run's
rewrite tasks create are listed, each *before* it is created, in the tasks' own intent files
(``metadata/compactor-intent-<run id>-*``, :mod:`compactor.rewrite.intent`), and the metadata files
the driver writes for its commits in the record itself, also before they are created. Writes
alternate between the two slots with a sequence number, so a write torn by a crash only damages
one slot and the other still lists every file created so far.

Before each catalog call the record also names the commit about to be tried (its snapshot id,
the branch and the head it expects: :class:`PendingCommit`). When the catalog's answer is lost
(a 5xx, a timeout, a reset, a crash or a paused machine inside the call), that request may still
be applied later, and then the table references the run's new files.

A record left behind belongs to a run that was killed or whose commit is in doubt. The next run
takes the lease, carrying the dead run's id, files and pending commits over into its own record.
While a pending commit can still land (it has not, and its branch's head is still the snapshot it
expects, so the catalog's ``AssertRefSnapshotId`` would pass), nothing of the dead runs is
deleted; once each has landed or can no longer land, every file the records and intent files list
that no snapshot references is deleted, and then those intent files. While a live run holds the
record, other runs back off; the catalog's optimistic commit remains the authority on
correctness.
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
from typing import Any

from pyiceberg.table import Table

from compactor.errors import CommitConflictError, CompactorError, first_line, not_writable_error
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


@dataclass(frozen=True)
class PendingCommit:
    """A commit sent to the catalog: snapshot ``snapshot_id`` on ``branch`` over ``parent_id``.

    Recorded before the catalog call, since its answer may be lost while the request still
    lands later (the request asserts that ``branch``'s head is ``parent_id``).
    """

    run_id: str
    snapshot_id: int
    parent_id: int | None
    branch: str

    def state(self, table: Table) -> str:
        """:data:`LANDED`, :data:`VOID` (can no longer land) or :data:`PENDING`, on ``table`` as
        loaded (refresh it first)."""
        metadata = table.metadata
        if metadata.snapshot_by_id(self.snapshot_id) is not None:
            return LANDED
        ref = metadata.refs.get(self.branch)
        head = ref.snapshot_id if ref is not None else None
        return PENDING if head == self.parent_id else VOID

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` form: ``commits_in_doubt`` of ``run``, ``rewrite-deletes``, ``inspect``."""
        return {
            "run_id": self.run_id,
            "snapshot_id": self.snapshot_id,
            "branch": self.branch,
            "parent_snapshot_id": self.parent_id,
        }

    def describe(self) -> str:
        return (
            f"snapshot {self.snapshot_id} of run {self.run_id} on branch {self.branch} "
            f"over {self.parent_id}"
        )


LANDED, VOID, PENDING = "landed", "void", "pending"


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
    # Commits sent to the catalog whose answer may have been lost (PendingCommit fields).
    pending_commits: list[dict[str, Any]] = field(default_factory=list)

    def commits(self) -> list[PendingCommit]:
        """The commits this record says were sent to the catalog."""
        return [PendingCommit(**c) for c in self.pending_commits]

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


def read_small_file(table: Table, path: str) -> bytes | None:
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
        text = read_small_file(table, path)
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


def commits_in_doubt(table: Table, record: RunRecord) -> list[PendingCommit]:
    """The commits of ``record`` that may still land, read on ``table`` refreshed now.

    A commit that landed or can no longer land is settled. Raises when the table cannot be
    refreshed: nothing can be decided then.
    """
    commits = record.commits()
    if not commits:
        return []
    table.refresh()
    return [c for c in commits if c.state(table) == PENDING]


@dataclass(frozen=True)
class CommitInDoubt:
    """A commit that may still land, and how many files the run record keeps for it."""

    commit: PendingCommit
    files_kept: int

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` form: ``commits_in_doubt`` of ``inspect``."""
        return {**self.commit.to_dict(), "files_kept": self.files_kept}


def in_doubt_report(table: Table) -> list[CommitInDoubt]:
    """The table's commits in doubt now, with how many files each run record keeps for them.

    Read from the run record (live or abandoned) and the catalog: for ``inspect``.
    """
    record = read_record(table)
    if record is None:
        return []
    pending = commits_in_doubt(table, record)
    if not pending:
        return []
    files, _ = recorded_files(table, record)
    return [CommitInDoubt(c, len(files)) for c in pending]


def recover_abandoned_files(table: Table, record: RunRecord) -> list[str]:
    """Delete the files an abandoned run wrote that no snapshot of ``table`` references.

    Returns the files deleted; their intent files go too once they are all gone. The caller
    makes sure no commit of ``record`` is still in doubt (:func:`commits_in_doubt`).
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
        self._carried: list[PendingCommit] = []  # abandoned runs' commits still in doubt

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
            self._record.pending_commits = list(existing.pending_commits)
        self._write()
        current = read_record(self._table)
        if current is None or current.run_id != self._record.run_id:
            raise LeaseHeldError(f"table {name}: another run took the lease first")
        if existing is not None:
            self._recover(existing)
        self._heartbeat = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
        self._heartbeat.start()

    @property
    def in_doubt(self) -> list[PendingCommit]:
        """Commits of abandoned runs that may still land: their runs' files are kept."""
        return list(self._carried)

    def _recover(self, abandoned: RunRecord) -> bool:
        """Delete what ``abandoned`` runs left, unless a commit of theirs may still land.

        Returns whether the clean-up ran; when it did not, the record keeps their files and
        pending commits (``in_doubt``) for a later run.
        """
        self._carried = commits_in_doubt(self._table, abandoned)
        if self._carried:
            log.warning(
                "table %s: keeping %s's files: the commit of %s may still land",
                ".".join(self._table.name()),
                ", ".join(abandoned.runs),
                "; ".join(c.describe() for c in self._carried),
            )
            return False
        log.info("recovering abandoned run %s", abandoned.run_id)
        self.recovered.extend(recover_abandoned_files(self._table, abandoned))
        with self._lock:
            self._record.pending_commits = [
                c for c in self._record.pending_commits if c["run_id"] == self._record.run_id
            ]
        return True

    def committing(self, snapshot_id: int, parent_id: int | None, branch: str) -> None:
        """Record the commit about to be sent to the catalog; raise unless the record is still
        this run's (called just before each catalog call)."""
        commit = asdict(PendingCommit(self._record.run_id, snapshot_id, parent_id, branch))
        with self._lock:
            self._check_held_locked()
            self._record.pending_commits = [
                c for c in self._record.pending_commits if c["snapshot_id"] != snapshot_id
            ] + [commit]
            self._write_locked()

    def refused(self, snapshot_id: int) -> None:
        """The catalog refused the commit of ``snapshot_id`` for certain: it cannot land."""
        with self._lock:
            self._record.pending_commits = [
                c for c in self._record.pending_commits if c["snapshot_id"] != snapshot_id
            ]

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

    def release(self) -> None:
        """Stop the heartbeat and delete the record if it is still this run's.

        While an abandoned run's commit may still land, the record stays, expired: the next
        run looks again. Once it has settled (this run's own commit may have moved the branch
        past it), the abandoned runs' files are cleaned up first.
        """
        self._stop_heartbeat()
        with self._lock:
            held = self._holds_locked()
            record = RunRecord(**asdict(self._record))
        if not held:
            return
        # This run's own files are committed or deleted by now; an abandoned run's may be left.
        if self._carried and not self._recover(record):
            self.abandon()
            return
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
        for name in ("abandoned_runs", "pending_commits"):
            if not fields[name]:  # the common case: readable by earlier versions too
                del fields[name]
        payload = json.dumps(fields).encode()
        slot = self._paths[self._record.seq % len(self._paths)]
        try:
            with self._table.io.new_output(slot).create(overwrite=True) as stream:
                stream.write(payload)
        except OSError as exc:
            refused = not_writable_error(".".join(self._table.name()), exc)
            if refused is None:
                raise
            raise refused from exc
