"""``compactor daemon``, ``status`` and ``jobs validate``: the service and its job files."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.text import Text

from compactor.cli.common import JsonOpt
from compactor.cli.output import err, guarded, out, print_json, print_table, state
from compactor.errors import EXIT_USAGE, CompactorError, ConfigError
from compactor.redaction import redact
from compactor.sizes import count, format_size

if TYPE_CHECKING:
    from compactor.daemon.config import DaemonConfig
    from compactor.daemon.jobfiles import Job, Resolution

commands = typer.Typer()
jobs_app = typer.Typer(help="Inspect and check the daemon's job files.", no_args_is_help=True)

ConfigFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        help="The daemon's settings file. Default: ./compactor.toml if it exists, else defaults "
        "(job files in ./jobs, state in $COMPACTOR_HOME/daemon.db).",
    ),
]


def _load_daemon_setup(config: Path | None) -> tuple[DaemonConfig, list[Job]]:
    from compactor.daemon.config import load_daemon_config
    from compactor.daemon.jobfiles import load_jobs

    settings = load_daemon_config(config)
    jobs = load_jobs(settings.jobs_dir)
    _check_catalogs(jobs, settings.section.catalog)
    return settings, jobs


def _check_catalogs(jobs: list[Job], default: str | None) -> None:
    """Every job's catalog is configured (checked offline: no catalog is contacted)."""
    problems = _catalog_problems(jobs, default)
    if problems:
        raise ConfigError(next(iter(problems.values())))


def _catalog_problems(jobs: list[Job], default: str | None) -> dict[Path, str]:
    """The jobs whose catalog is configured nowhere, each with its problem (offline)."""
    from compactor.iceberg.catalogs import catalog_properties

    problems = {}
    for job in jobs:
        try:
            catalog_properties(job.spec.catalog or default)
        except ConfigError as exc:
            problems[job.path] = f"{job.path}: {exc}"
    return problems


@commands.command()
@guarded
def daemon(config: ConfigFileOpt = None) -> None:
    """Run continuously: compact, expire and sweep the tables of the job files on their schedules.

    Serves /metrics (Prometheus) and /healthz on 127.0.0.1:9464 unless `listen` says otherwise,
    logs one JSON object a line when stderr is not a terminal, and keeps its run history in the
    state file that `compactor status` reads. SIGTERM or Ctrl-C drains: no new run starts,
    running ones commit their finished groups, and the process exits 0.

    Example: compactor daemon --config /etc/compactor/compactor.toml
    """
    from compactor.daemon.logs import configure_logging
    from compactor.daemon.service import Daemon

    settings, jobs = _load_daemon_setup(config)
    configure_logging(settings.section.log_format, state["verbose"])
    service = Daemon(settings, jobs)
    # Signals wait in the main thread (sigwait), blocked everywhere else: a signal the
    # kernel would hand to a worker thread can then never go unnoticed.
    signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        service.start()
    except OSError as exc:
        raise CompactorError(f"daemon: {exc}") from exc
    received = signal.sigwait(signals)
    logging.getLogger("compactor.daemon.service").info(
        "signal received", extra={"event": "signal", "signal": signal.Signals(received).name}
    )
    service.drain()


@jobs_app.command("validate")
@guarded
def jobs_validate(
    files: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Job files (or directories of them) to check. Default: every *.toml of the "
            "daemon's job directory."
        ),
    ] = None,
    config: ConfigFileOpt = None,
    connect: Annotated[
        bool,
        typer.Option(
            "--connect",
            help="Also load every catalog the job files name and resolve each job's tables: "
            "an unreachable catalog, a named table that does not exist and a glob that matches "
            "no table are errors (one line each).",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Check job files without starting the daemon: every problem of every file, as FILE:LINE.

    Offline by default: no catalog is contacted. With --connect, each job's tables are resolved
    in its catalog and listed.

    Example: compactor jobs validate jobs/*.toml

    Example: compactor jobs validate --connect --config /etc/compactor/compactor.toml
    """
    from compactor.daemon.config import load_daemon_config
    from compactor.daemon.config_files import ConfigProblems
    from compactor.daemon.jobfiles import job_paths, load_job, resolve_jobs

    default_catalog = None
    if files:
        paths = [
            found
            for path in files
            for found in (sorted(path.glob("*.toml")) if path.is_dir() else [path])
        ]
    else:
        settings = load_daemon_config(config)
        paths, default_catalog = job_paths(settings.jobs_dir), settings.section.catalog
    loaded, problems = [], []
    for path in paths:  # every problem of every file, not only the first
        try:
            loaded.append(load_job(path))
        except ConfigProblems as exc:
            problems += exc.problems
        except ConfigError as exc:
            problems.append(str(exc))
    unconfigured = _catalog_problems(loaded, default_catalog)
    problems += unconfigured.values()
    jobs = [job for job in loaded if job.path not in unconfigured]
    resolved = resolve_jobs(jobs, default_catalog) if connect else []
    resolutions: list[Resolution | None] = [*resolved, *[None] * (len(jobs) - len(resolved))]
    problems = [redact(problem) for problem in problems]
    problems += [redact(problem) for r in resolved for problem in r.problems]
    if as_json:
        summary: list[dict[str, Any]] = [
            {
                "file": str(job.path),
                "description": job.spec.description,
                "catalog": job.spec.catalog,
                "tables": job.spec.tables,
                "exclude": job.spec.exclude,
                "actions": {name: s.describe() for name, s in job.spec.actions().items()},
                "resolved": None  # without --connect
                if resolution is None
                else {"catalog": resolution.catalog, "tables": resolution.tables},
            }
            for job, resolution in zip(jobs, resolutions, strict=True)
        ]
        print_json(
            {
                "valid": not problems,
                "jobs": summary,
                "errors": problems,
                "exit_code": EXIT_USAGE if problems else 0,
            }
        )
    else:
        failed = {str(r.job.path) for r in resolved if r.problems}
        for job, resolution in zip(jobs, resolutions, strict=True):
            if str(job.path) in failed:
                continue
            actions = "; ".join(f"{name} {s.describe()}" for name, s in job.spec.actions().items())
            exclude = job.spec.exclude
            excluded = f" except {', '.join(exclude)}" if exclude else ""
            lines = [f"{job.path}: ok: {', '.join(job.spec.tables)}{excluded}: {actions}"]
            if resolution is not None:
                tables = resolution.tables
                lines.append(f"{job.path}: {count(len(tables), 'table')} ({', '.join(tables)})")
            for line in lines:
                out.print(line, markup=False, highlight=False)
    for problem in problems:
        err.print(f"error: {problem}", markup=False, highlight=False)
    if problems:
        raise typer.Exit(EXIT_USAGE)


def _when(at_ms: int | None) -> str:
    from compactor.durations import format_time

    return format_time(at_ms) if at_ms else "-"


def _last_compaction(last: dict[str, Any] | None) -> str:
    return f"{last['outcome']} {_when(last['ended_at_ms'])}" if last else "-"


@commands.command()
@guarded
def status(config: ConfigFileOpt = None, as_json: JsonOpt = False) -> None:
    """Show what the daemon knows: per-table fragmentation, each job's last tick (failures in a
    row, last success, last error), last runs, next planned runs.

    Reads the daemon's state file, so it works while the daemon runs (or after it stopped).
    """
    import time

    from compactor.daemon.config import load_daemon_config
    from compactor.daemon.jobfiles import load_jobs
    from compactor.daemon.status import daemon_status
    from compactor.options.table_properties import DEFAULT

    settings = load_daemon_config(config)
    if not settings.state_path.exists():
        raise ConfigError(
            f"state file {settings.state_path}: does not exist (has the daemon run with this "
            "--config?)"
        )
    jobs = load_jobs(settings.jobs_dir) if settings.jobs_dir.is_dir() else []
    data = daemon_status(settings, jobs, time.time())
    if as_json:
        print_json(data)
        return
    print_table(
        f"tables ({data['state_file']})",
        (
            "table",
            "job",
            "small files",
            "delete files",
            "data files",
            "score",
            "due",
            "last compaction",
            "next compaction",
            "manifests",
        ),
        (
            (
                t["table"],
                t["job"],
                "-" if t["small_files"] is None else str(t["small_files"]),
                str(t["delete_files"]),
                str(t["data_files"]),
                str(t["score"]),
                _due(t),
                _last_compaction(t["last_compaction"]),
                _when(t["next_compaction_at_ms"]),
                _manifests(t["manifests"]),
            )
            for t in data["tables"]
        ),
        right=(
            "small files",
            "delete files",
            "data files",
            "score",
            "due",
            "last compaction",
            "next compaction",
            "manifests",
        ),
    )
    print_table(
        "settings (each table's, where not the default, at its last scan)",
        ("table", "setting", "value", "source"),
        (
            (t["table"], v["option"], Text(str(v["value"])), v["source"])  # no markup
            for t in data["tables"]
            for v in t["settings"]
            if v["source"] != DEFAULT
        ),
        fold=("value", "source"),
        skip_empty=True,
    )
    print_table(
        "jobs",
        (
            "job",
            "action",
            "last tick",
            "outcome",
            "failed in a row",
            "last success",
            "last error",
        ),
        (
            (
                j["job"],
                j["action"],
                _when(j["last_tick_at_ms"]),
                j["last_outcome"],
                str(j["consecutive_failures"]),
                _when(j["last_success_at_ms"]),
                Text(j["last_error"] or ""),  # as written: no markup
            )
            for j in data["jobs"]
        ),
        right=("failed in a row",),
    )
    print_table(
        "next ticks",
        ("job", "action", "next run"),
        ((s["job"], s["action"], _when(s["next_run_at_ms"])) for s in data["schedules"]),
    )
    print_table(
        "recent runs",
        ("started", "table", "action", "outcome", "files in", "bytes in", "files out", "error"),
        (
            (
                _when(r["started_at_ms"]),
                r["table"],
                r["action"],
                r["outcome"] or "running",
                str(r["input_files"]),
                format_size(r["input_bytes"]),
                str(r["output_files"]),
                Text(r["error"] or ""),  # as written: no markup
            )
            for r in data["runs"]
        ),
        right=("files in", "bytes in", "files out"),
    )
    print_table(
        "unreadable files (found by each table's last compaction)",
        ("table", "file", "reason"),
        (
            (t["table"], Text(f["path"]), Text(f["reason"]))  # no markup
            for t in data["tables"]
            for f in (t["last_compaction"] or {}).get("skipped_files", [])
        ),
        fold=("table", "file", "reason"),
        skip_empty=True,
    )
    print_table(
        "quarantined files (left out of compaction, as each table's last compaction left them)",
        ("table", "file", "since", "reason"),
        (
            (t["table"], Text(f["path"]), _when(f["first_seen_ms"]), Text(f["reason"]))
            for t in data["tables"]
            for f in (t["last_compaction"] or {}).get("quarantined_files", [])
        ),
        fold=("table", "file", "reason"),
        skip_empty=True,
    )
    newest = {r["table"]: r for r in reversed(data["runs"]) if r["outcome"]}
    print_table(
        "commits in doubt (their files kept until each lands or cannot)",
        ("table", "run", "snapshot", "branch"),
        (
            (name, c["run_id"], str(c["snapshot_id"]), c["branch"])
            for name, run in sorted(newest.items())  # as each table's newest run left them
            for c in run["commits_in_doubt"]
        ),
        skip_empty=True,
    )


def _due(table: dict[str, Any]) -> str:
    """``yes``, ``no``, or ``paused`` (by the table's own properties)."""
    enabled = next((s for s in table["settings"] if s["option"] == "enabled"), None)
    if enabled is not None and enabled["value"] == "False":
        return "paused"
    return "yes" if table["due"] else "no"


def _manifests(manifests: dict[str, Any] | None) -> str:
    """``12 (3.5/manifest)``: a table's manifests at the last check, and entries per manifest."""
    if manifests is None:
        return "-"
    total = sum(manifests["manifests"].values())
    return f"{total:,} ({manifests['average_entries_per_manifest']:,.1f}/manifest)"
