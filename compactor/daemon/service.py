"""``compactor daemon``: keep every table of the job files healthy, with no one calling.

Each (job file, action) has an APScheduler schedule. A compaction tick scores every table in
scope (:mod:`compactor.daemon.fragmentation`) and queues those over a threshold; a manifest tick reads
each table's manifest list and queues those with too many manifests, behind every compaction
(and again right after a compaction of the table commits); an expiry or orphan tick queues
every table in scope. :class:`~compactor.daemon.scheduling.RunPolicy` decides which queued
run starts, and runs execute on a pool of ``max_concurrent_runs`` threads. Everything that
happens is written to the state file (:mod:`compactor.daemon.history`), counted in
:mod:`compactor.daemon.metrics` and logged with fields.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from apscheduler.executors.pool import ThreadPoolExecutor as TickExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table

from compactor import api
from compactor.compaction import RunResult
from compactor.daemon.config import DaemonConfig
from compactor.daemon.dashboard.api import DashboardApi
from compactor.daemon.dashboard.routes import Dashboard
from compactor.daemon.fragmentation import (
    SUMMARY,
    Fragmentation,
    FragmentationScanner,
    deletes_due_reasons,
    due_reasons,
    summary_fragmentation,
)
from compactor.daemon.history import History, RunRow
from compactor.daemon.jobfiles import (
    Action,
    ActionSection,
    CompactAction,
    ExpireAction,
    Job,
    OrphansAction,
    RewriteDeletesAction,
    RewriteManifestsAction,
    listed_tables,
)
from compactor.daemon.metrics import DaemonMetrics, MetricsServer
from compactor.daemon.scheduling import (
    CANCELLED,
    CONFLICT,
    FAILED,
    NOOP,
    PARTIAL,
    SKIPPED,
    SUCCEEDED,
    Request,
    RunPolicy,
)
from compactor.daemon.table_overrides import for_table, property_action, table_settings
from compactor.durations import parse_duration_ms
from compactor.errors import (
    CommitConflictError,
    CommitStateUnknownError,
    GcDisabledError,
    UnsupportedTableError,
    first_line,
)
from compactor.execute.progress_log import ProgressLog, progress_interval
from compactor.iceberg.catalogs import open_catalog
from compactor.options.compact import RewriteOptions, resolve_options
from compactor.options.table_properties import TableDisabledError, paused_by, settings_list
from compactor.planning.manifest_groups import ManifestStats, manifest_stats
from compactor.sizes import count

log = logging.getLogger("compactor.daemon.service")
WRITING_ACTIONS = ("compact", "rewrite_deletes", "rewrite_manifests")
# Manifest rewrites queue behind every compaction (whose priority is its score, >= 0).
MANIFEST_REWRITE_PRIORITY = -1.0


@dataclass(frozen=True)
class Work:
    """What a queued run needs: the job's catalog, the action's section of the job file and,
    for a compaction, the options resolved when the table was found due."""

    catalog: Catalog
    section: ActionSection
    options: RewriteOptions | None = None


# Runs of each (table, action) read back from the state file at start, to rebuild streaks.
RESTORE_RUNS = 32
# Ticks (scans) running at once; runs have their own pool.
TICK_THREADS = 2
# /healthz answers "degraded" (503) once a job's action has failed this many ticks in a row.
DEGRADED_AFTER_FAILED_TICKS = 3


def _log_progress(message: str, fields: dict[str, Any]) -> None:
    log.info(message, extra={"event": "run_progress", **fields})


class Daemon:
    """The long-lived process: schedules, queue, runs, state file, metrics, endpoint."""

    def __init__(
        self,
        config: DaemonConfig,
        jobs: list[Job],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        section = config.section
        self.config = config
        self.jobs = jobs
        self.clock = clock
        self.stopping = threading.Event()
        self.progress_interval_s = progress_interval()
        self.history = History(config.state_path)
        self.metrics = DaemonMetrics()
        self.policy = RunPolicy(
            section.max_concurrent_runs,
            config.backoff_initial_s,
            config.backoff_max_s,
            section.conflicts_before_backoff,
            clock,
        )
        self.scanner = FragmentationScanner()
        self.server: MetricsServer | None = None
        self._lock = threading.Lock()
        self._catalogs: dict[str | None, Catalog] = {}
        # (job, action) -> ticks failed in a row and the last error, as in the state file.
        self._tick_failures: dict[tuple[str, str], tuple[int, str | None]] = {}
        # (job, table) -> the settings warnings last logged for it: logged again only on change.
        self._warned: dict[tuple[str, str], tuple[str, ...]] = {}
        # table -> its quarantine after its last compaction (RunRow.quarantined_files).
        self._quarantined: dict[str, list[dict[str, Any]]] = {}
        self._runs = ThreadPoolExecutor(section.max_concurrent_runs, thread_name_prefix="run")
        self._scheduler = BackgroundScheduler(
            timezone=UTC,
            executors={"default": TickExecutor(TICK_THREADS)},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )

    # --- life cycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Open the endpoint, restore state and start the schedules: ``every`` ones tick right
        away, ``cron`` ones at their next time."""
        now = self.clock()
        interrupted = self.history.close_interrupted(now)
        recent = self.history.recent_runs(RESTORE_RUNS)
        self.policy.restore(
            {
                key: [(r.outcome or FAILED, r.ended_at or now, r.conflicts) for r in runs]
                for key, runs in recent.items()
            }
        )
        self._restore_ticks()
        for (table, action), runs in recent.items():
            if action == "compact":
                self._record_quarantine(table, runs[0].quarantined_files)
        self.history.forget_grown_groups({job.name for job in self.jobs})
        listen = self.config.listen
        if listen:
            dashboard = Dashboard(
                DashboardApi(self.config, self.jobs, self.history, self._catalog, self.clock),
                self.config.http_token,
            )
            self.server = MetricsServer(listen, self.metrics, self._health, dashboard.handle)
            self.server.start()
        first = datetime.now(UTC)
        for job in self.jobs:
            for action, section in job.spec.actions().items():
                # An interval schedule ticks at once; a cron schedule waits for its time.
                when = {"next_run_time": first} if section.cron is None else {}
                self._scheduler.add_job(
                    self._tick,
                    trigger=section.trigger(),
                    args=(job, action),
                    id=f"{job.name}:{action}",
                    name=f"{job.name} {action}",
                    **when,
                )
        self._scheduler.start()
        log.info(
            "daemon started",
            extra={
                "event": "daemon_started",
                "jobs": [job.name for job in self.jobs],
                "state": str(self.config.state_path),
                "url": self.server.url if self.server else None,
                "max_concurrent_runs": self.policy.max_concurrent,
                "interrupted_runs_closed": interrupted,
            },
        )

    def drain(self) -> None:
        """Start nothing new; let running runs finish or abandon their group; close everything."""
        with self._lock:  # after a tick reading the schedules: see _record_schedules
            self.stopping.set()
            self.policy.close()
            running = [r.table for r in self.policy.running]
        log.info("draining", extra={"event": "draining", "running": running})
        self._scheduler.shutdown(wait=True)
        self._runs.shutdown(wait=True)
        self.metrics.queue_length.set(0)
        if self.server:
            self.server.stop()
        self.history.close()
        log.info("daemon stopped", extra={"event": "daemon_stopped"})

    def _health(self) -> tuple[str, dict[str, Any]]:
        """``draining``, ``degraded`` (some job failed its last DEGRADED_AFTER_FAILED_TICKS
        ticks) or ``ok``, and details: the files quarantined by each table's last compaction
        among them (they degrade nothing: the tables' other files are compacted)."""
        with self._lock:
            details: dict[str, Any] = {
                "running": len(self.policy.running),
                "queued": len(self.policy.queued),
            }
            quarantined = [
                {"table": table, "path": f["path"], "reason": f["reason"]}
                for table, files in sorted(self._quarantined.items())
                for f in files
            ]
            if quarantined:
                details["quarantined_files"] = quarantined
            failing = [
                {"job": job, "action": action, "consecutive_failures": n, "error": error}
                for (job, action), (n, error) in sorted(self._tick_failures.items())
                if n >= DEGRADED_AFTER_FAILED_TICKS
            ]
        if self.stopping.is_set():
            return "draining", details
        if failing:
            return "degraded", {**details, "failing": failing}
        return "ok", details

    def _record_quarantine(self, table: str, files: list[dict[str, Any]]) -> None:
        """``table``'s quarantine after its last compaction, for /healthz and /metrics."""
        with self._lock:
            self._quarantined[table] = files
        self.metrics.quarantined_files.labels(table).set(len(files))

    def _restore_ticks(self) -> None:
        """Carry on the failure streaks of the configured (job, action) pairs; forget others."""
        keys = {(job.name, action) for job in self.jobs for action in job.spec.actions()}
        self.history.forget_ticks(keys)
        restored = {(t["job"], t["action"]): t for t in self.history.ticks()}
        for key in keys:
            self.metrics.tick_failures.labels(*key)  # exported as 0 from the start
            tick = restored.get(key)
            failures = tick["consecutive_failures"] if tick else 0
            self._tick_failures[key] = (failures, tick["last_error"] if tick else None)
            self.metrics.consecutive_tick_failures.labels(*key).set(failures)

    def _tick_done(self, job: Job, action: Action, error: str | None) -> int:
        """Record the tick's outcome (state file, streak, metrics); the ticks failed in a row."""
        failures = self.history.record_tick(job.name, action, self.clock(), error)
        with self._lock:
            self._tick_failures[(job.name, action)] = (failures, error)
        self.metrics.consecutive_tick_failures.labels(job.name, action).set(failures)
        if error is not None:
            self.metrics.tick_failures.labels(job.name, action).inc()
        return failures

    # --- ticks: decide what to queue -----------------------------------------------------------

    def _catalog(self, name: str | None) -> Catalog:
        with self._lock:
            if name not in self._catalogs:
                self._catalogs[name] = open_catalog(name)
            return self._catalogs[name]

    def _tick(self, job: Job, action: Action) -> None:
        """Queue the tables of ``job`` due for ``action``. The tick fails when the catalog cannot
        be listed, a table the job names does not exist, or a table cannot be scored."""
        if self.stopping.is_set():
            return
        try:
            catalog = self._catalog(job.spec.catalog or self.config.section.catalog)
            listed = listed_tables(catalog, job)
        except Exception as exc:
            unlisted = first_line(exc)
            failures = self._tick_done(job, action, unlisted)
            log.error(
                "cannot list tables",
                extra={
                    "event": "tick_failed",
                    "job": job.name,
                    "action": action,
                    "error": unlisted,
                    "consecutive_failures": failures,
                },
            )
            return
        tables = [t for t in listed if job.matches(t)]
        errors = [
            f"table {t} does not exist in catalog {catalog.name!r}"
            for t in job.missing_tables(listed)
        ]
        offered = []
        for identifier in tables:
            if self.stopping.is_set():
                return
            try:
                request = self._request(catalog, job, action, identifier)
            except Exception as exc:
                self.metrics.scan_errors.inc()
                log.warning(
                    "cannot score table",
                    extra={"event": "scan_failed", "table": identifier, "error": first_line(exc)},
                )
                errors.append(f"table {identifier}: {first_line(exc)}")
                continue
            if request is None:
                continue
            with self._lock:
                refused = self.policy.offer(request)
            if refused is None:
                offered.append(identifier)
            else:
                log.debug(
                    "not queued",
                    extra={
                        "event": "not_queued",
                        "table": identifier,
                        "action": action,
                        "reason": refused,
                    },
                )
        error = errors[0] if errors else None
        failures = self._tick_done(job, action, error)
        log.log(
            logging.ERROR if errors else logging.INFO,
            "tick",
            extra={
                "event": "tick_failed" if errors else "tick",
                "job": job.name,
                "action": action,
                "tables": len(tables),
                "queued": offered,
                "error": error,
                "consecutive_failures": failures,
            },
        )
        self._dispatch()
        self._record_schedules()

    def _request(
        self, catalog: Catalog, job: Job, action: Action, identifier: str
    ) -> Request | None:
        """The run to offer for ``identifier``, None when it is not due; raises when the table
        cannot be loaded or scored."""
        section = job.spec.actions()[action]
        if not isinstance(section, CompactAction | RewriteDeletesAction | RewriteManifestsAction):
            # expire, orphans: the API reads the table's compactor.* properties as it runs them
            return Request(identifier, action, job.name, payload=Work(catalog, section))
        table = catalog.load_table(identifier)
        properties = table.metadata.properties
        setting = paused_by(identifier, properties, property_action(action))
        if setting is not None:
            log.info(
                "paused by the table",
                extra={"event": "paused", "table": identifier, "action": action, "by": setting},
            )
            if isinstance(section, CompactAction):  # its totals, and why it is not due
                totals = summary_fragmentation(table, identifier)
                self._record_scan(table, identifier, job, totals, section, [])
            return None
        section = for_table(section, identifier, properties, action)
        if isinstance(section, RewriteManifestsAction):
            return self._manifest_request(catalog, job.name, identifier, section, table)
        if isinstance(section, RewriteDeletesAction):
            return self._deletes_request(catalog, job, identifier, section, table)
        options = resolve_options(identifier, properties, **section.given())
        if self._warned.get((job.name, identifier)) != options.warnings:
            self._warned[(job.name, identifier)] = options.warnings
            for warning in options.warnings:
                log.warning(warning, extra={"event": "setting_replaced", "table": identifier})
        reasons, score = self._score(table, identifier, job, options, section)
        if not reasons:
            return None
        return Request(
            identifier,
            action,
            job.name,
            priority=score,
            cooldown_s=parse_duration_ms(section.cooldown, "cooldown") / 1000,
            payload=Work(catalog, section, options),
        )

    def _score(
        self,
        table: Table,
        identifier: str,
        job: Job,
        options: RewriteOptions,
        section: CompactAction,
    ) -> tuple[list[str], int]:
        """Score ``table``, record the scan and its gauges; the thresholds crossed and the score."""
        deletes = job.spec.rewrite_deletes
        target = options.plan.target_file_size
        fragmentation = self.scanner.scan(table, identifier, target, section, deletes)
        reasons = due_reasons(fragmentation, section, deletes)
        assert job.spec.compact is not None  # the job file's, before the table's properties
        self._record_scan(table, identifier, job, fragmentation, job.spec.compact, reasons)
        self.metrics.small_files.labels(identifier).set(fragmentation.small_files or 0)
        self.metrics.small_bytes.labels(identifier).set(fragmentation.small_bytes or 0)
        self.metrics.data_files.labels(identifier).set(fragmentation.data_files)
        self.metrics.delete_files.labels(identifier).set(fragmentation.delete_files)
        return reasons, fragmentation.score

    def _record_scan(
        self,
        table: Table,
        identifier: str,
        job: Job,
        fragmentation: Fragmentation | None,
        section: CompactAction,
        reasons: list[str],
    ) -> None:
        """Record a scan of ``table`` (due when there are ``reasons``) in the state file, with
        the settings of the job file's ``section`` as they apply to it."""
        settings = table_settings(section, identifier, table.metadata.properties, "compact")
        found = fragmentation or Fragmentation(identifier, None, 0, 0, 0, SUMMARY, 0)
        self.history.record_scan(
            identifier,
            job.name,
            self.clock(),
            {**found.to_dict(), "reasons": reasons},
            bool(reasons),
            settings_list(settings),
        )

    def _deletes_request(
        self,
        catalog: Catalog,
        job: Job,
        identifier: str,
        section: RewriteDeletesAction,
        table: Table,
    ) -> Request | None:
        """A delete rewrite of ``identifier`` when some partition is due for one (see
        :mod:`compactor.daemon.remedies`), else None. It converts equality deletes only when
        some partition is due for conversion; the job's ``[compact]`` settings say which data
        files a compaction rewrites anyway."""
        properties = table.metadata.properties
        compact = job.spec.compact
        if compact is not None:
            compact = for_table(compact, identifier, properties, "compact")
        given = compact.given() if compact is not None else {}
        options = resolve_options(identifier, properties, **given)
        target = options.plan.target_file_size
        fragmentation = self.scanner.scan(table, identifier, target, compact, section)
        reasons, convert = deletes_due_reasons(fragmentation, compact, section)
        if not reasons:
            return None
        log.info(
            "deletes due",
            extra={"event": "deletes_due", "table": identifier, "reasons": reasons},
        )
        run = section.model_copy(update={"convert_equality_deletes": convert})
        return Request(identifier, "rewrite_deletes", job.name, payload=Work(catalog, run))

    def _record_schedules(self) -> None:
        """Record each schedule's next tick, unless draining.

        A drain shuts the scheduler down holding the scheduler's job-store lock while it waits
        for running ticks, so a tick must not ask the scheduler anything once the drain began:
        the check and the question are made under the lock the drain takes to begin.
        """
        with self._lock:
            if self.stopping.is_set():
                return
            scheduled = self._scheduler.get_jobs()
        next_runs = {}
        for job in scheduled:
            job_name, _, action = job.id.partition(":")
            when = job.next_run_time
            next_runs[(job_name, action)] = when.timestamp() if when else None
        self.history.record_schedules(next_runs)

    # --- runs ----------------------------------------------------------------------------------

    def _dispatch(self) -> None:
        with self._lock:
            started = self.policy.take()
            self.metrics.queue_length.set(len(self.policy.queued))
            self.metrics.running.set(len(self.policy.running))
            for request in started:
                self._runs.submit(self._execute, request)

    def _execute(self, request: Request) -> None:
        row = self.history.start_run(request.table, request.action, request.job, self.clock())
        log.info(
            "run started",
            extra={
                "event": "run_started",
                "table": request.table,
                "action": request.action,
                "run": row.id,
            },
        )
        started = time.monotonic()
        unknown = 0  # this run's own commit, when the catalog gave no answer
        try:
            row.outcome = self._perform(request, row)
        except (GcDisabledError, UnsupportedTableError, TableDisabledError) as exc:
            # gc.enabled=false, not something this action does (e.g. rewrite_deletes on a v3
            # table), or paused by the table's compactor.* properties: nothing to retry, nothing
            # changed. (A table another run holds comes back as a result that backed off.)
            row.outcome, row.error = SKIPPED, first_line(exc)
        except CommitConflictError as exc:
            row.outcome, row.error, row.conflicts = CONFLICT, first_line(exc), 1
            self.metrics.commit_conflicts.inc()
        except Exception as exc:
            row.outcome, row.error = FAILED, first_line(exc)
            unknown = int(isinstance(exc, CommitStateUnknownError))
            log.debug("run failed", exc_info=True)
        duration = time.monotonic() - started
        row.ended_at = self.clock()
        if request.action in WRITING_ACTIONS:  # the actions that commit, and so report doubts
            doubts = len(row.commits_in_doubt) + unknown
            self.metrics.commits_in_doubt.labels(request.table).set(doubts)
        self.history.finish_run(row)
        self.metrics.runs.labels(request.action, row.outcome).inc()
        self.metrics.duration.labels(request.action).observe(duration)
        with self._lock:
            self.policy.finish(request, row.outcome, row.conflicts)
        level = logging.WARNING if row.outcome in (FAILED, CONFLICT) else logging.INFO
        log.log(
            level,
            "run finished",
            extra={
                "event": "run_finished",
                **row.to_dict(),
                "duration_s": round(duration, 3),
            },
        )
        self._dispatch()

    def _perform(self, request: Request, row: RunRow) -> str:
        work: Work = request.payload
        table = work.catalog.load_table(request.table)
        section = work.section
        if isinstance(section, RewriteDeletesAction):
            return self._rewrite_deletes(table, request, section, row)
        if isinstance(section, RewriteManifestsAction):
            return self._rewrite_manifests(table, request, section, row)
        if isinstance(section, CompactAction):
            assert work.options is not None  # resolved when the table was found due
            return self._compact(table, request, section, work.options, row)
        return self._reclaim(work.catalog, table, request, section, row)

    def _reclaim(
        self,
        catalog: Catalog,
        table: Table,
        request: Request,
        section: ExpireAction | OrphansAction,
        row: RunRow,
    ) -> str:
        """Expire snapshots or remove orphan files; the outcome.

        A table with gc.enabled=false raises GcDisabledError: the run is skipped, deleting nothing.
        """
        if isinstance(section, ExpireAction):
            expired = api.expire_snapshots(table, section, catalog=catalog)
            report, changed = expired.report, bool(expired.plan.expire)
        else:
            swept = api.remove_orphans(table, section, catalog=catalog)
            report, changed = swept.report, False
        row.input_files, row.input_bytes = report.files, report.bytes
        self.metrics.deleted_files.labels(request.action).inc(report.files)
        self.metrics.deleted_bytes.labels(request.action).inc(report.bytes)
        if report.failed:
            row.error = (
                f"could not delete {count(len(report.failed), 'file')}, e.g. {report.failed[0]}"
            )
            return PARTIAL
        return SUCCEEDED if changed or report.files else NOOP

    def _rewrite_deletes(
        self, table: Table, request: Request, section: RewriteDeletesAction, row: RunRow
    ) -> str:
        """Convert the table's equality deletes and compact its position-delete files; the
        outcome."""
        result = api.rewrite_deletes(table, section)
        if result.backed_off:  # another run holds the table: nothing was done
            row.error = result.backed_off
            return SKIPPED
        conversion = result.equality_conversion
        converted = conversion.equality_delete_files_converted if conversion else 0
        written = (conversion.position_delete_files_written or 0) if conversion else 0
        conflicts = (
            [reason for _, reason in sorted(conversion.conflicts.items())] if conversion else []
        )
        conflicts += [reason for _, reason in sorted(result.conflicts.items())]
        row.input_files, row.input_bytes = result.files_removed + converted, result.bytes_removed
        row.output_files, row.output_bytes = result.files_added + written, result.bytes_added
        committed = (conversion.snapshot_id if conversion else None, result.snapshot_id)
        row.snapshot_ids = list(dict.fromkeys(s for s in committed if s is not None))
        row.conflicts = len(conflicts)
        row.commits_in_doubt = [c.to_dict() for c in result.commits_in_doubt]
        self.metrics.deleted_files.labels(request.action).inc(result.files_removed)
        self.metrics.deleted_bytes.labels(request.action).inc(result.bytes_removed)
        if conflicts and not row.snapshot_ids:
            row.error = conflicts[0]
            return PARTIAL
        return SUCCEEDED if result.changed else NOOP

    def _compact(
        self,
        table: Table,
        request: Request,
        section: CompactAction,
        options: RewriteOptions,
        row: RunRow,
    ) -> str:
        """Compact the table; the outcome."""
        progress = ProgressLog(request.table, _log_progress, self.progress_interval_s)
        # Groups whose rewrite grew are not rewritten again while their inputs and settings stay.
        settings = _growth_settings(options, table.metadata.properties)
        grown_before = self.history.grown_groups(request.job, request.table, settings)
        result = api.compact(
            table, options, progress=progress, stop=self.stopping, grown_before=grown_before
        )
        if result.backed_off:  # another run holds the table: nothing was done
            row.error = result.backed_off
            return SKIPPED
        self.history.record_grown_groups(request.job, request.table, settings, result.grown_inputs)
        rewritten, added = result.rewritten_files, result.added_files
        row.input_files, row.input_bytes = len(rewritten), sum(f.size for f in rewritten)
        row.output_files = len(added)
        row.output_bytes = sum(d.file_size_in_bytes for d in added)
        row.snapshot_ids = result.snapshot_ids
        row.conflicts = len(result.conflicts)
        row.skipped_files = [
            vars(f) for f in sorted(result.skipped_files, key=lambda f: (f.group_id, f.path))
        ]
        row.quarantined_files = [
            {"path": f.path, "reason": f.reason, "first_seen_ms": f.first_seen_ms}
            for f in result.quarantined_files
        ]
        self._record_quarantine(request.table, row.quarantined_files)
        row.commits_in_doubt = [c.to_dict() for c in result.commits_in_doubt]
        errors = result.errors
        if errors:
            row.error = f"group {errors[0].group_id}: {errors[0].reason}"
        self.metrics.rewritten_files.inc(row.input_files)
        self.metrics.rewritten_bytes.inc(row.input_bytes)
        self.metrics.added_files.inc(row.output_files)
        self.metrics.commit_conflicts.inc(row.conflicts)
        self.metrics.grown_groups.inc(len(result.grown_groups))
        job = self._job(request.job)
        if result.snapshot_ids and job is not None:  # show the table as it is now
            table.refresh()
            self._score(table, request.table, job, options, section)
            self._manifests_after_compaction(request, table)
        return compaction_outcome(result)

    def _job(self, name: str) -> Job | None:
        return next((job for job in self.jobs if job.name == name), None)

    # --- manifests -----------------------------------------------------------------------------

    def _manifest_request(
        self,
        catalog: Catalog,
        job_name: str,
        identifier: str,
        section: RewriteManifestsAction,
        table: Table,
    ) -> Request | None:
        """A manifest rewrite of ``table`` when it crosses ``section``'s thresholds, else None;
        its manifest gauges are set either way. Reads the manifest list only."""
        stats = self._record_manifests(identifier, table)
        reasons = section.due(stats.total, sum(stats.entries.values()))
        if not reasons:
            return None
        log.info(
            "manifests due",
            extra={"event": "manifests_due", "table": identifier, "reasons": reasons},
        )
        return Request(
            identifier,
            "rewrite_manifests",
            job_name,
            priority=MANIFEST_REWRITE_PRIORITY,
            payload=Work(catalog, section),
        )

    def _record_manifests(self, identifier: str, table: Table) -> ManifestStats:
        stats = manifest_stats(table)
        self.history.record_manifests(identifier, self.clock(), stats.to_dict())
        for content, manifests in stats.manifests.items():
            self.metrics.manifests.labels(identifier, content).set(manifests)
        self.metrics.manifest_entries.labels(identifier).set(stats.average_entries)
        self.metrics.metadata_files.labels(identifier).set(stats.metadata_files)
        return stats

    def _manifests_after_compaction(self, request: Request, table: Table) -> None:
        """Right after a compaction committed, queue the job's manifest rewrite of the table
        if it is due now (it starts once the compaction has finished)."""
        job = self._job(request.job)
        section = job.spec.rewrite_manifests if job is not None else None
        if section is None:
            return
        work: Work = request.payload
        follow = self._manifest_request(work.catalog, request.job, request.table, section, table)
        if follow is not None:
            with self._lock:
                self.policy.offer(follow)

    def _rewrite_manifests(
        self, table: Table, request: Request, section: RewriteManifestsAction, row: RunRow
    ) -> str:
        """Rewrite the table's manifests that are out of order; the outcome."""
        result = api.rewrite_manifests(table, section)
        if result.backed_off:  # another run holds the table: nothing was done
            row.error = result.backed_off
            return SKIPPED
        row.input_files, row.input_bytes = result.manifests_replaced, result.bytes_replaced
        row.output_files, row.output_bytes = result.manifests_written, result.bytes_written
        row.snapshot_ids = [result.snapshot_id] if result.snapshot_id else []
        row.conflicts = len(result.conflicts)
        row.commits_in_doubt = [c.to_dict() for c in result.commits_in_doubt]
        self.metrics.rewritten_manifests.inc(result.manifests_replaced)
        self.metrics.commit_conflicts.inc(row.conflicts)
        table.refresh()
        self._record_manifests(request.table, table)
        if result.conflicts:
            row.error = result.conflicts[min(result.conflicts)]
            return PARTIAL if result.snapshot_id else CONFLICT
        return SUCCEEDED if result.snapshot_id else NOOP


def _growth_settings(options: RewriteOptions, properties: dict[str, str]) -> str:
    """What a rewrite's size depends on besides its inputs, as a key: the run's options and the
    table's properties (codec, level, row-group size...)."""
    text = repr((options, sorted(properties.items())))
    return hashlib.sha256(text.encode()).hexdigest()


def compaction_outcome(result: RunResult) -> str:
    """What a compaction run comes to in the state file (and the backoff rules)."""
    if result.stopped:
        return CANCELLED
    if not result.plan.groups:
        return NOOP
    if result.snapshot_ids:  # partial too when it found unreadable files (and committed around)
        return PARTIAL if result.failures or result.skipped_files else SUCCEEDED
    if result.errors:
        return FAILED
    if result.failures:
        return CONFLICT
    # Every group was rewritten and left uncommitted as not worth it (its output grew).
    return NOOP
