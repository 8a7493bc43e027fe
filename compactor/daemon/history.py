"""The daemon's memory, a SQLite file: its runs, each table's last score, the next ticks.

``compactor status`` reads it while the daemon writes it (WAL mode), and a restarted daemon
reads it to carry on: cool-downs and back-offs survive restarts, and runs a dead daemon left
open are closed as ``interrupted``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from compactor.daemon.scheduling import INTERRUPTED
from compactor.durations import epoch_ms
from compactor.errors import ConfigError
from compactor.redaction import redact

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    table_name TEXT NOT NULL,
    action TEXT NOT NULL,
    job TEXT NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL,
    outcome TEXT,
    input_files INTEGER NOT NULL DEFAULT 0,
    input_bytes INTEGER NOT NULL DEFAULT 0,
    output_files INTEGER NOT NULL DEFAULT 0,
    output_bytes INTEGER NOT NULL DEFAULT 0,
    snapshot_ids TEXT NOT NULL DEFAULT '[]',
    conflicts INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    skipped_files TEXT NOT NULL DEFAULT '[]',
    commits_in_doubt TEXT NOT NULL DEFAULT '[]',
    quarantined_files TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX IF NOT EXISTS runs_by_table ON runs (table_name, action, id);
CREATE TABLE IF NOT EXISTS tables (
    table_name TEXT PRIMARY KEY,
    job TEXT NOT NULL,
    scanned_at REAL NOT NULL,
    fragmentation TEXT NOT NULL,
    due INTEGER NOT NULL,
    settings TEXT NOT NULL DEFAULT '[]'
);
CREATE TABLE IF NOT EXISTS schedules (
    job TEXT NOT NULL,
    action TEXT NOT NULL,
    next_run_at REAL,
    PRIMARY KEY (job, action)
);
CREATE TABLE IF NOT EXISTS grown_groups (
    job TEXT NOT NULL,
    table_name TEXT NOT NULL,
    settings TEXT NOT NULL,
    inputs TEXT NOT NULL,
    PRIMARY KEY (job, table_name)
);
CREATE TABLE IF NOT EXISTS ticks (
    job TEXT NOT NULL,
    action TEXT NOT NULL,
    ticked_at REAL NOT NULL,
    consecutive_failures INTEGER NOT NULL,
    last_success_at REAL,
    last_error TEXT,
    PRIMARY KEY (job, action)
);
CREATE TABLE IF NOT EXISTS manifests (
    table_name TEXT PRIMARY KEY,
    checked_at REAL NOT NULL,
    stats TEXT NOT NULL
);
"""


@dataclass
class RunRow:
    """One run of one action on one table."""

    table_name: str
    action: str
    job: str
    started_at: float
    ended_at: float | None = None
    outcome: str | None = None
    input_files: int = 0
    input_bytes: int = 0
    output_files: int = 0
    output_bytes: int = 0
    snapshot_ids: list[int] = field(default_factory=list)
    conflicts: int = 0
    error: str | None = None
    # Unreadable files a compaction found (and quarantined): {"group_id", "path", "reason"} each.
    skipped_files: list[dict[str, Any]] = field(default_factory=list)
    # The table's quarantine after a compaction: {"path", "reason", "first_seen_ms"} each.
    quarantined_files: list[dict[str, Any]] = field(default_factory=list)
    # Commits of earlier runs that may still land, whose files the run kept (PendingCommit).
    commits_in_doubt: list[dict[str, Any]] = field(default_factory=list)
    id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The run as ``status --json``, the daemon's log and its dashboard show it: ``table``,
        and times as epoch milliseconds (``started_at_ms``, ``ended_at_ms``)."""
        data = asdict(self)
        started_at, ended_at = data.pop("started_at"), data.pop("ended_at")
        return {
            "table": data.pop("table_name"),
            **data,
            "started_at_ms": epoch_ms(started_at),
            "ended_at_ms": epoch_ms(ended_at),
        }


class History:
    """Read and write the state file; safe to share between threads."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA busy_timeout=10000")
            self._db.executescript(SCHEMA)
            added_columns = {
                "runs": ("skipped_files", "commits_in_doubt", "quarantined_files"),
                "tables": ("settings",),
            }
            for name, added in added_columns.items():
                columns = {row["name"] for row in self._db.execute(f"PRAGMA table_info({name})")}
                for column in added:
                    if column not in columns:  # a state file written by an earlier version
                        self._db.execute(
                            f"ALTER TABLE {name} ADD COLUMN {column} TEXT NOT NULL DEFAULT '[]'"
                        )
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError(f"state file {path}: {exc}") from None
        self._lock = threading.Lock()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def close_interrupted(self, now: float) -> int:
        """Mark runs left open by a daemon that died as interrupted; returns how many."""
        with self._tx() as db:
            cursor = db.execute(
                "UPDATE runs SET ended_at = ?, outcome = ? WHERE outcome IS NULL",
                (now, INTERRUPTED),
            )
            return cursor.rowcount

    def start_run(self, table_name: str, action: str, job: str, now: float) -> RunRow:
        row = RunRow(table_name, action, job, now)
        with self._tx() as db:
            cursor = db.execute(
                "INSERT INTO runs (table_name, action, job, started_at) VALUES (?, ?, ?, ?)",
                (table_name, action, job, now),
            )
        row.id = cursor.lastrowid
        return row

    def finish_run(self, row: RunRow) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE runs SET ended_at = ?, outcome = ?, input_files = ?, input_bytes = ?, "
                "output_files = ?, output_bytes = ?, snapshot_ids = ?, conflicts = ?, error = ?, "
                "skipped_files = ?, commits_in_doubt = ?, quarantined_files = ? WHERE id = ?",
                (
                    row.ended_at,
                    row.outcome,
                    row.input_files,
                    row.input_bytes,
                    row.output_files,
                    row.output_bytes,
                    json.dumps(row.snapshot_ids),
                    row.conflicts,
                    redact(row.error) if row.error else row.error,
                    redact(json.dumps(row.skipped_files)),
                    json.dumps(row.commits_in_doubt),
                    redact(json.dumps(row.quarantined_files)),
                    row.id,
                ),
            )

    def runs(self, table_name: str | None = None, limit: int = 100) -> list[RunRow]:
        """Most recent runs first."""
        where, args = ("WHERE table_name = ?", [table_name]) if table_name else ("", [])
        with self._lock:
            rows = self._db.execute(
                f"SELECT * FROM runs {where} ORDER BY id DESC LIMIT ?", (*args, limit)
            ).fetchall()
        return [_run(row) for row in rows]

    def totals(self, since: float) -> dict[str, dict[str, int]]:
        """Per action, the runs finished since ``since`` and the sums of their files and bytes
        in and out."""
        with self._lock:
            rows = self._db.execute(
                "SELECT action, COUNT(*) AS runs, SUM(input_files) AS input_files, "
                "SUM(input_bytes) AS input_bytes, SUM(output_files) AS output_files, "
                "SUM(output_bytes) AS output_bytes FROM runs "
                "WHERE ended_at >= ? AND outcome IS NOT NULL GROUP BY action",
                (since,),
            ).fetchall()
        found = [dict(row) for row in rows]
        return {row.pop("action"): row for row in found}

    def recent_runs(self, per_key: int) -> dict[tuple[str, str], list[RunRow]]:
        """The last ``per_key`` finished runs of each (table, action), most recent first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY table_name, action "
                "ORDER BY id DESC) AS n FROM runs WHERE outcome IS NOT NULL) WHERE n <= ? "
                "ORDER BY id DESC",
                (per_key,),
            ).fetchall()
        found: dict[tuple[str, str], list[RunRow]] = {}
        for row in rows:
            found.setdefault((row["table_name"], row["action"]), []).append(_run(row))
        return found

    def record_scan(
        self,
        table_name: str,
        job: str,
        now: float,
        fragmentation: dict[str, Any],
        due: bool,
        settings: list[dict[str, Any]],
    ) -> None:
        """A table's last scan: its fragmentation, whether it is due, and the settings it was
        scored under (``option``, ``value``, ``source`` each)."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO tables (table_name, job, scanned_at, fragmentation, due, "
                "settings) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    table_name,
                    job,
                    now,
                    json.dumps(fragmentation),
                    int(due),
                    redact(json.dumps(settings)),
                ),
            )

    def scans(self) -> list[dict[str, Any]]:
        """Each table's last scan, by table (``settings``: none from an earlier version)."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM tables ORDER BY table_name").fetchall()
        return [
            {
                "table": row["table_name"],
                "job": row["job"],
                "scanned_at": row["scanned_at"],
                "due": bool(row["due"]),
                **json.loads(row["fragmentation"]),
                "settings": json.loads(row["settings"]),
            }
            for row in rows
        ]

    def record_schedules(self, next_runs: dict[tuple[str, str], float | None]) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM schedules")
            db.executemany(
                "INSERT INTO schedules VALUES (?, ?, ?)",
                [(job, action, at) for (job, action), at in sorted(next_runs.items())],
            )

    def schedules(self) -> dict[tuple[str, str], float | None]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM schedules ORDER BY job, action").fetchall()
        return {(row["job"], row["action"]): row["next_run_at"] for row in rows}

    def record_tick(self, job: str, action: str, now: float, error: str | None) -> int:
        """Record a tick of ``job``'s ``action`` (failed when ``error`` is given); the ticks
        failed in a row since, 0 after a success."""
        with self._tx() as db:
            before = db.execute(
                "SELECT consecutive_failures, last_success_at FROM ticks WHERE job = ? AND action = ?",
                (job, action),
            ).fetchone()
            last_success: float | None
            if error is None:
                failures, last_success = 0, now
            else:
                failures = (before["consecutive_failures"] if before else 0) + 1
                last_success = before["last_success_at"] if before else None
            db.execute(
                "INSERT OR REPLACE INTO ticks VALUES (?, ?, ?, ?, ?, ?)",
                (job, action, now, failures, last_success, redact(error) if error else None),
            )
        return failures

    def forget_ticks(self, keep: AbstractSet[tuple[str, str]]) -> None:
        """Drop the tick records of (job, action) pairs no longer configured."""
        with self._tx() as db:
            for row in db.execute("SELECT job, action FROM ticks").fetchall():
                if (row["job"], row["action"]) not in keep:
                    db.execute(
                        "DELETE FROM ticks WHERE job = ? AND action = ?",
                        (row["job"], row["action"]),
                    )

    def record_grown_groups(
        self, job: str, table_name: str, settings: str, inputs: frozenset[frozenset[str]]
    ) -> None:
        """Remember the inputs of ``table_name``'s groups whose rewrite grew under ``settings``
        (forget them when there are none)."""
        with self._tx() as db:
            db.execute(
                "DELETE FROM grown_groups WHERE job = ? AND table_name = ?", (job, table_name)
            )
            if inputs:
                listed = sorted(sorted(group) for group in inputs)
                db.execute(
                    "INSERT INTO grown_groups VALUES (?, ?, ?, ?)",
                    (job, table_name, settings, json.dumps(listed)),
                )

    def grown_groups(self, job: str, table_name: str, settings: str) -> frozenset[frozenset[str]]:
        """The inputs :meth:`record_grown_groups` remembered under the same ``settings``."""
        with self._lock:
            row = self._db.execute(
                "SELECT inputs FROM grown_groups WHERE job = ? AND table_name = ? AND settings = ?",
                (job, table_name, settings),
            ).fetchone()
        return frozenset(frozenset(g) for g in json.loads(row["inputs"])) if row else frozenset()

    def forget_grown_groups(self, keep_jobs: set[str]) -> None:
        """Drop what jobs no longer configured remembered."""
        with self._tx() as db:
            for row in db.execute("SELECT DISTINCT job FROM grown_groups").fetchall():
                if row["job"] not in keep_jobs:
                    db.execute("DELETE FROM grown_groups WHERE job = ?", (row["job"],))

    def record_manifests(self, table_name: str, now: float, stats: dict[str, Any]) -> None:
        """A table's manifests, at its last manifest check or rewrite."""
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO manifests VALUES (?, ?, ?)",
                (table_name, now, json.dumps(stats)),
            )

    def manifests(self) -> dict[str, dict[str, Any]]:
        """Each table's manifests at its last check (``checked_at`` included), by table."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM manifests").fetchall()
        return {
            row["table_name"]: {"checked_at": row["checked_at"], **json.loads(row["stats"])}
            for row in rows
        }

    def ticks(self) -> list[dict[str, Any]]:
        """The last tick of every (job, action): when, failures in a row, last success, error."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM ticks ORDER BY job, action").fetchall()
        return [dict(row) for row in rows]


def _run(row: sqlite3.Row) -> RunRow:
    return RunRow(
        table_name=row["table_name"],
        action=row["action"],
        job=row["job"],
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        outcome=row["outcome"],
        input_files=row["input_files"],
        input_bytes=row["input_bytes"],
        output_files=row["output_files"],
        output_bytes=row["output_bytes"],
        snapshot_ids=json.loads(row["snapshot_ids"]),
        conflicts=row["conflicts"],
        error=row["error"],
        skipped_files=json.loads(row["skipped_files"]),
        commits_in_doubt=json.loads(row["commits_in_doubt"]),
        quarantined_files=json.loads(row["quarantined_files"]),
        id=row["id"],
    )
