"""``compactor status``: what the daemon knows, read from its state file while it runs."""

from __future__ import annotations

from typing import Any

from compactor.daemon.config import DaemonConfig
from compactor.daemon.history import History
from compactor.daemon.jobfiles import CompactAction, Job
from compactor.daemon.scheduling import Request, RunPolicy
from compactor.durations import epoch_ms, parse_duration_ms

LAST_RUNS = 20


def daemon_status(config: DaemonConfig, jobs: list[Job], now: float) -> dict[str, Any]:
    """Per-table fragmentation and last run, each job's last tick, next planned runs, and the
    most recent runs."""
    history = History(config.state_path)
    try:
        scans = history.scans()
        runs = history.runs(limit=LAST_RUNS)
        schedules = history.schedules()
        recent = history.recent_runs(1_000)
        ticks = history.ticks()
        manifests = history.manifests()
    finally:
        history.close()
    section = config.section
    policy = RunPolicy(
        section.max_concurrent_runs,
        config.backoff_initial_s,
        config.backoff_max_s,
        section.conflicts_before_backoff,
        lambda: now,
    )
    policy.restore(
        {
            key: [(r.outcome or "", r.ended_at or now, r.conflicts) for r in rows if r.outcome]
            for key, rows in recent.items()
        }
    )
    cooldowns = {
        job.name: parse_duration_ms(job.spec.compact.cooldown, "cooldown") / 1000
        for job in jobs
        if isinstance(job.spec.compact, CompactAction)
    }
    tables = []
    for scan in scans:
        last = recent.get((scan["table"], "compact"), [None])[0]
        tick = schedules.get((scan["job"], "compact"))
        request = Request(
            scan["table"], "compact", scan["job"], cooldown_s=cooldowns.get(scan["job"], 0)
        )
        eligible = policy.not_before(request)
        scanned_at = scan.pop("scanned_at")
        next_at = max(tick, eligible) if tick is not None else None
        tables.append(
            {
                **scan,
                "scanned_at_ms": epoch_ms(scanned_at),
                "last_compaction": last.to_dict() if last else None,
                "manifests": _manifests(manifests.get(scan["table"])),
                "eligible_at_ms": epoch_ms(eligible or None),
                "next_compaction_at_ms": epoch_ms(next_at),
            }
        )
    return {
        "state_file": str(config.state_path),
        "tables": tables,
        "jobs": [_job_tick(tick) for tick in ticks],
        "schedules": [
            {"job": job, "action": action, "next_run_at_ms": epoch_ms(at)}
            for (job, action), at in sorted(schedules.items())
        ],
        "runs": [run.to_dict() for run in runs],
    }


def _manifests(checked: dict[str, Any] | None) -> dict[str, Any] | None:
    """A table's manifests at its last manifest check, ``checked_at`` in epoch ms."""
    if checked is None:
        return None
    found = dict(checked)
    checked_at = found.pop("checked_at")
    return {**found, "checked_at_ms": epoch_ms(checked_at)}


def _job_tick(tick: dict[str, Any]) -> dict[str, Any]:
    """The last tick of a job's action: ``ok`` or ``failed``, with the failure streak."""
    failures = tick["consecutive_failures"]
    return {
        "job": tick["job"],
        "action": tick["action"],
        "last_tick_at_ms": epoch_ms(tick["ticked_at"]),
        "last_outcome": "failed" if failures else "ok",
        "consecutive_failures": failures,
        "last_success_at_ms": epoch_ms(tick["last_success_at"]),
        "last_error": tick["last_error"],
    }
