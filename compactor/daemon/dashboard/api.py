"""The dashboard's JSON API: documents built from the state file, the job files and a read of
each table's metadata. Field conventions are those of ``--json`` (docs/json-output.md): times in
``*_at_ms`` epoch milliseconds, sizes in bytes. Every string passes through the redaction."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from compactor.daemon.config import DaemonConfig
from compactor.daemon.dashboard.inspection import (
    SIZE_BUCKETS,
    Inspection,
    TableReader,
    deletes_over_time,
)
from compactor.daemon.history import History, RunRow
from compactor.daemon.jobfiles import Job
from compactor.daemon.status import daemon_status
from compactor.durations import epoch_ms
from compactor.errors import first_line
from compactor.redaction import redact

DAY_S = 86_400
TOTALS_WINDOWS = {"day": DAY_S, "week": 7 * DAY_S}
# Actions whose input - output files is what they took off the tables' query plans.
REWRITING_ACTIONS = ("compact", "rewrite_deletes")
# Actions that delete files (their input files and bytes are what they deleted).
DELETING_ACTIONS = ("expire", "orphans")
RUNS_PER_TABLE = 50
# What an overview row shows of the last scan when the table cannot be read now.
SCANNED_COUNTS = (
    "snapshot_id",
    "data_files",
    "data_bytes",
    "small_files",
    "small_bytes",
    "delete_files",
)
MAX_RUNS = 1_000


class DashboardApi:
    """Builds every document the dashboard's pages read; changes nothing anywhere."""

    def __init__(
        self,
        config: DaemonConfig,
        jobs: list[Job],
        history: History,
        catalog: Callable[[str | None], Catalog],
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.jobs = {job.name: job for job in jobs}
        self.history = history
        self.catalog = catalog
        self.clock = clock
        self.reader = TableReader()

    # --- documents -----------------------------------------------------------------------------

    def tables(self) -> dict[str, Any]:
        """``/api/v1/tables``: every table the jobs cover, the neediest first; failing job
        actions; what the runs saved over the last day and week."""
        now = self.clock()
        status = daemon_status(self.config, list(self.jobs.values()), now)
        rows = [self._table_row(scan, status)[0] for scan in self._scanned(status)]
        rows.sort(key=lambda r: (r["health_score"], -r["score"], r["table"]))
        failing = [tick for tick in status["jobs"] if tick["consecutive_failures"]]
        return redacted(
            {
                "generated_at_ms": epoch_ms(now),
                "tables": rows,
                "failing_jobs": failing,
                "totals": {
                    window: self._totals(now - seconds)
                    for window, seconds in TOTALS_WINDOWS.items()
                },
            }
        )

    def table(self, name: str) -> dict[str, Any] | None:
        """``/api/v1/tables/{name}``, or None when no job covers ``name``."""
        now = self.clock()
        status = daemon_status(self.config, list(self.jobs.values()), now)
        scan = next((s for s in self._scanned(status) if s["table"] == name), None)
        if scan is None:
            return None
        row, table, inspection = self._table_row(scan, status)
        runs = self.history.runs(name, limit=RUNS_PER_TABLE)
        detail: dict[str, Any] = {
            **row,
            "target_file_size": inspection.target_file_size if inspection else None,
            "size_buckets": list(SIZE_BUCKETS),
            "sizes": self._sizes(name, table, inspection, runs),
            "worst_partitions": (
                inspection.health.to_dict()["worst_partitions"] if inspection else []
            ),
            "deletes_over_time": deletes_over_time(table) if table else [],
            "runs": [run_record(run) for run in runs],
        }
        return redacted(detail)

    def runs(self, limit: int) -> dict[str, Any]:
        """``/api/v1/runs``: the most recent runs across tables."""
        runs = self.history.runs(limit=max(1, min(limit, MAX_RUNS)))
        return redacted({"runs": [run_record(run) for run in runs]})

    def job_list(self) -> dict[str, Any]:
        """``/api/v1/jobs``: each job, its tables and each action's schedule and last tick."""
        status = daemon_status(self.config, list(self.jobs.values()), self.clock())
        ticks = {(t["job"], t["action"]): t for t in status["jobs"]}
        schedules = {(s["job"], s["action"]): s["next_run_at_ms"] for s in status["schedules"]}
        jobs = []
        for name, job in sorted(self.jobs.items()):
            actions = []
            for action, section in job.spec.actions().items():
                tick = ticks.get((name, action), {})
                actions.append(
                    {
                        "action": action,
                        "schedule": section.describe(),
                        "next_run_at_ms": schedules.get((name, action)),
                        "last_tick_at_ms": tick.get("last_tick_at_ms"),
                        "last_outcome": tick.get("last_outcome"),
                        "consecutive_failures": tick.get("consecutive_failures", 0),
                        "last_error": tick.get("last_error"),
                    }
                )
            jobs.append(
                {
                    "job": name,
                    "file": job.path.name,
                    "catalog": job.spec.catalog or self.config.section.catalog,
                    "tables": list(job.spec.tables),
                    "actions": actions,
                }
            )
        return redacted({"jobs": jobs})

    # --- parts ---------------------------------------------------------------------------------

    def _scanned(self, status: dict[str, Any]) -> list[dict[str, Any]]:
        """The status's scanned tables, and those only runs know of (a job that expires or
        sweeps without compacting), as scans without scores."""
        scanned = [t for t in status["tables"] if t["job"] in self.jobs]
        known = {t["table"] for t in scanned}
        for run in self.history.runs(limit=MAX_RUNS):
            if run.table_name not in known and run.job in self.jobs:
                known.add(run.table_name)
                scanned.append({"table": run.table_name, "job": run.job})
        return scanned

    def _table_row(
        self, scan: dict[str, Any], status: dict[str, Any]
    ) -> tuple[dict[str, Any], Table | None, Inspection | None]:
        """A table's overview row, its loaded table and its inspection (None when the table
        cannot be read: the row then holds the last scan's counts and the error)."""
        name, job = scan["table"], self.jobs[scan["job"]]
        table = inspection = None
        error = None
        try:
            loaded = self.catalog(job.spec.catalog or self.config.section.catalog).load_table(name)
            inspection = self.reader.inspect(job, name, loaded)
            table = loaded
        except Exception as exc:
            error = first_line(exc)
        if inspection is not None:
            health = inspection.health
            counts: dict[str, Any] = {
                "snapshot_id": inspection.snapshot_id,
                "data_files": health.data_files,
                "data_bytes": health.data_bytes,
                "small_files": health.small_files,
                "small_bytes": health.small_bytes,
                "delete_files": health.delete_files,
                "delete_files_by_kind": inspection.delete_files_by_kind,
                "manifests": inspection.manifests,
            }
        else:
            counts = {
                **{k: scan.get(k) for k in SCANNED_COUNTS},
                "delete_files_by_kind": None,
                "manifests": None,
            }
        files = (counts["data_files"] or 0) + (counts["delete_files"] or 0)
        score = (counts["small_files"] or 0) + (counts["delete_files"] or 0)
        last = self.history.runs(name, limit=1)
        row = {
            "table": name,
            "job": job.name,
            "due": scan.get("due"),
            "reasons": scan.get("reasons", []),
            **counts,
            "average_file_size": (
                round(counts["data_bytes"] / counts["data_files"]) if counts["data_files"] else 0
            ),
            "score": score,
            "health_score": round(100 * (1 - score / files)) if files else 100,
            "scanned_at_ms": scan.get("scanned_at_ms"),
            "last_run": run_record(last[0]) if last else None,
            "next_action": _next_action(job, scan, status),
            "error": error,
        }
        return row, table, inspection

    def _sizes(
        self, name: str, table: Table | None, inspection: Inspection | None, runs: list[RunRow]
    ) -> dict[str, Any]:
        """File-size histograms: now, and before and after the last compaction that committed
        while its snapshots are still in the metadata (else a note saying why not)."""
        current = inspection.sizes if inspection else None
        found: dict[str, Any] = {
            "current": current.to_dict() if current else None,
            "before": None,
            "after": None,
            "compaction_run_id": None,
            "note": None,
        }
        compaction = next((r for r in runs if r.action == "compact" and r.snapshot_ids), None)
        if table is None:
            found["note"] = "the table could not be read"
        elif compaction is None:
            found["note"] = (
                f"no compaction committed among the last {RUNS_PER_TABLE} runs: current sizes only"
            )
        else:
            found["compaction_run_id"] = compaction.id
            first = table.snapshot_by_id(compaction.snapshot_ids[0])
            last = table.snapshot_by_id(compaction.snapshot_ids[-1])
            parent = (
                table.snapshot_by_id(first.parent_snapshot_id)
                if first and first.parent_snapshot_id is not None
                else None
            )
            if parent is None or last is None:
                found["note"] = (
                    f"the snapshots of compaction run {compaction.id} have expired: "
                    "current sizes only"
                )
            else:
                before, after = self.reader.sizes(name, table, [parent, last])
                found["before"], found["after"] = before.to_dict(), after.to_dict()
        return found

    def _totals(self, since: float) -> dict[str, int]:
        """What finished runs did since ``since``: files taken off query plans by compactions and
        delete rewrites, files and bytes deleted by expiry and orphan removal."""
        totals = self.history.totals(since)

        def total(actions: tuple[str, ...], field: str) -> int:
            return sum(totals.get(a, {}).get(field) or 0 for a in actions)

        return {
            "runs": sum(t["runs"] for t in totals.values()),
            "files_saved": total(REWRITING_ACTIONS, "input_files")
            - total(REWRITING_ACTIONS, "output_files"),
            "bytes_rewritten": total(REWRITING_ACTIONS, "input_bytes"),
            "files_deleted": total(DELETING_ACTIONS, "input_files"),
            "bytes_deleted": total(DELETING_ACTIONS, "input_bytes"),
        }


def _next_action(job: Job, scan: dict[str, Any], status: dict[str, Any]) -> dict[str, Any] | None:
    """The job's next scheduled tick for the table; a compaction's waits for its cool-down."""
    planned = [
        (s["next_run_at_ms"], s["action"])
        for s in status["schedules"]
        if s["job"] == job.name and s["next_run_at_ms"] is not None
    ]
    compaction = scan.get("next_compaction_at_ms")
    planned = [(compaction, a) if a == "compact" and compaction else (t, a) for t, a in planned]
    if not planned:
        return None
    at_ms, action = min(planned)
    return {"action": action, "at_ms": at_ms}


def run_record(run: RunRow) -> dict[str, Any]:
    """A run as ``compactor status --json`` lists it, with its duration."""
    ended = run.ended_at
    return {**run.to_dict(), "duration_ms": epoch_ms(ended - run.started_at) if ended else None}


def redacted(value: Any) -> Any:
    """``value`` with every string in it (keys included) redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {redact(k): redacted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redacted(v) for v in value]
    return value
