"""``compactor status``: what the daemon knows, read from its state file while it runs."""

from __future__ import annotations

from typing import Any

from compactor.daemon.config import DaemonConfig
from compactor.daemon.history import History
from compactor.daemon.jobfiles import CompactAction, Job
from compactor.daemon.scheduling import Request, RunPolicy
from compactor.durations import parse_duration_ms

LAST_RUNS = 20


def daemon_status(config: DaemonConfig, jobs: list[Job], now: float) -> dict[str, Any]:
    """Per-table fragmentation and last run, next planned runs, and the most recent runs."""
    history = History(config.state_path)
    try:
        scans = history.scans()
        runs = history.runs(limit=LAST_RUNS)
        schedules = history.schedules()
        recent = history.recent_runs(1_000)
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
        tables.append(
            {
                **scan,
                "last_compaction": last.to_dict() if last else None,
                "eligible_at": eligible or None,
                "next_compaction_at": max(tick, eligible) if tick is not None else None,
            }
        )
    return {
        "state_file": str(config.state_path),
        "tables": tables,
        "schedules": [
            {"job": job, "action": action, "next_run_at": at}
            for (job, action), at in sorted(schedules.items())
        ],
        "runs": [run.to_dict() for run in runs],
    }
