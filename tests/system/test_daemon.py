"""The daemon as users run it: a real ``compactor daemon`` process against a SQLite catalog.

Every test starts the daemon as a subprocess with a job file whose schedules tick every second,
follows its structured log (one JSON object a line on stderr) and waits for the events it
expects; nothing waits on a clock. The daemon is stopped with SIGTERM and must exit 0.
"""

from __future__ import annotations

import json
import signal
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.exceptions import CommitStateUnknownException
from pyiceberg.table.snapshots import Operation

from compactor import api
from compactor.bench.sample import create_events_table
from compactor.commit.inflight import read_record
from compactor.daemon.service import DEGRADED_AFTER_FAILED_TICKS
from compactor.errors import CommitStateUnknownError

from support import crash_runner
from support.daemon import (
    CATALOG,
    COMPACT_EVERY_SECOND,
    EVENT_TIMEOUT_S,
    EXIT_TIMEOUT_S,
    Setup,
)
from support.deletes import commit_delete_files, write_position_delete_file
from support.java_reader import JavaReader, java_read
from support.java_writer import read_expected, write_cdc_table
from support.json_output import assert_documented
from support.rows import assert_same_rows, scan_rows
from support.stress import INITIAL_COMMITS, INITIAL_ROWS, read_log, start_writer
from support.stress import TABLE as WRITER_TABLE
from support.tables import live_data_files, local_path, unreferenced_files

# The ``setup`` fixture: a catalog, a job directory and a daemon's environment.
pytest_plugins = ("support.daemon",)

pytestmark = pytest.mark.slow  # left out by `make test-quick`

CRASH_RUNNER = Path(crash_runner.__file__)


def _compactor_snapshots(table: Any) -> list[Any]:
    return [
        s
        for s in table.metadata.snapshots
        if s.summary is not None
        and s.summary.operation == Operation.REPLACE
        and "compactor.version" in s.summary.additional_properties
    ]


def test_daemon_compacts_beside_a_writer_records_and_reports_it(setup: Setup) -> None:
    table = create_events_table(
        setup.catalog, WRITER_TABLE, commits=INITIAL_COMMITS, rows_per_commit=INITIAL_ROWS, days=3
    )
    initial_ids = set(scan_rows(table)["event_id"].to_pylist())
    setup.job("writer", COMPACT_EVERY_SECOND)
    log = setup.root / "writer.log"
    ops = 30
    with open(setup.root / "writer.err", "w") as writer_err:
        writer = start_writer(setup.catalog, ops, log, writer_err)
        daemon = setup.start()
        try:
            # The daemon compacts on its own while the writer keeps committing.
            first = daemon.run_finished(WRITER_TABLE, committed=True)
            assert first["outcome"] in ("succeeded", "partial")
            assert first["input_files"] > first["output_files"] > 0
            assert writer.wait(timeout=EVENT_TIMEOUT_S) == 0, (
                setup.root / "writer.err"
            ).read_text()
            # One more compaction of what the writer left, now that it has stopped.
            daemon.run_finished(WRITER_TABLE, committed=True)
            metrics = daemon.metrics()
        finally:
            code = daemon.terminate()
            writer.kill()
    assert code == 0, "".join(daemon.lines)

    # The rows are exactly what the writer committed, whatever the daemon did in between.
    batches, deleted = read_log(log, initial_ids, ops)
    table = setup.catalog.load_table(WRITER_TABLE)
    rows = scan_rows(table)
    expected = (initial_ids | {i for b in batches for i in _batch_ids(b)}) - deleted
    assert sorted(rows["event_id"].to_pylist()) == sorted(expected)
    snapshots = _compactor_snapshots(table)
    assert len(snapshots) >= 2
    # The writer's own retried commits leave files behind; the daemon's runs leave none.
    assert [f for f in unreferenced_files(table) if Path(f).name.startswith("compactor-")] == []

    # The state file recorded the runs; /metrics counted them; status reports them.
    runs = [r for r in setup.runs() if r["action"] == "compact" and r["outcome"] != "noop"]
    committed = [r for r in runs if json.loads(r["snapshot_ids"])]
    assert {s.snapshot_id for s in snapshots} == {
        i for r in committed for i in json.loads(r["snapshot_ids"])
    }
    assert all(r["ended_at"] >= r["started_at"] for r in runs)
    succeeded = metrics[("compactor_runs_total", (("action", "compact"), ("outcome", "succeeded")))]
    partial = metrics.get(
        ("compactor_runs_total", (("action", "compact"), ("outcome", "partial"))), 0
    )
    assert succeeded + partial >= 2
    assert metrics[("compactor_rewritten_files_total", ())] >= first["input_files"]
    assert ("compactor_grown_groups_total", ()) in metrics
    assert metrics[("compactor_run_duration_seconds_count", (("action", "compact"),))] >= 2
    assert ("compactor_table_small_files", (("table", WRITER_TABLE),)) in metrics
    assert ("compactor_queue_length", ()) in metrics
    status = setup.status()
    (row,) = [t for t in status["tables"] if t["table"] == WRITER_TABLE]
    # The latest compaction in the state file (the daemon may have started one more, cancelled
    # by the SIGTERM, after the writer stopped).
    last = [r for r in setup.runs() if r["action"] == "compact"][-1]
    assert row["job"] == "writer"
    assert (row["last_compaction"]["id"], row["last_compaction"]["outcome"]) == (
        last["id"],
        last["outcome"],
    )
    assert {(s["job"], s["action"]) for s in status["schedules"]} == {("writer", "compact")}
    assert len(status["runs"]) == min(len(setup.runs()), 20)


def _batch_ids(batch: int) -> list[int]:
    from compactor.bench.sample import events_batch

    from support.stress_writer import DAYS, ROWS_PER_BATCH

    return events_batch(batch, ROWS_PER_BATCH, DAYS)["event_id"].to_pylist()


def test_sigterm_during_a_run_drains_and_leaves_nothing_behind(setup: Setup) -> None:
    table = create_events_table(setup.catalog, "db.events", commits=12, rows_per_commit=300, days=3)
    rows = scan_rows(table)
    setup.job(
        "events",
        COMPACT_EVERY_SECOND.replace(
            "min_input_files = 2", "min_input_files = 2\ncommit_every = 1"
        ),
    )
    # SIGTERM arrives once the first output file of the first compaction is closed.
    daemon = setup.start(sys.executable, str(CRASH_RUNNER), "close", "1", "SIGTERM", "--")
    daemon.wait_for(lambda e: e.get("event") == "draining", "the drain")
    finished = daemon.run_finished("db.events")
    assert daemon.process.wait(timeout=EXIT_TIMEOUT_S) == 0, "".join(daemon.lines)
    assert "crash_runner: close call 1: sending SIGTERM" in "".join(daemon.lines)

    assert finished["outcome"] == "cancelled"
    assert [r["outcome"] for r in setup.runs()] == ["cancelled"]
    table = setup.catalog.load_table("db.events")
    assert_same_rows(rows, scan_rows(table))
    assert unreferenced_files(table) == []
    assert not list(
        (Path(table.location().removeprefix("file://")) / "metadata").glob("compactor-run.*")
    )


def test_sigterm_while_a_tick_scores_a_table_stops_the_daemon(setup: Setup) -> None:
    """The drain waits for a running tick; that tick then must not wait for the scheduler the
    drain is shutting down (it did, reading the next schedules: the daemon hung until killed)."""
    create_events_table(setup.catalog, "db.events", commits=2, rows_per_commit=100, days=1)
    setup.job("scores", COMPACT_EVERY_SECOND)
    daemon = setup.start(sys.executable, str(CRASH_RUNNER), "tick", "1", "SIGTERM", "--")
    assert daemon.process.wait(timeout=EXIT_TIMEOUT_S) == 0, "".join(daemon.lines)
    assert any("crash_runner: tick call 1" in line for line in daemon.lines)
    assert '"daemon_stopped"' in daemon.lines[-1]


def test_a_killed_daemon_is_picked_up_by_the_next_one(setup: Setup) -> None:
    table = create_events_table(setup.catalog, "db.events", commits=12, rows_per_commit=300, days=3)
    rows = scan_rows(table)
    setup.job("events", COMPACT_EVERY_SECOND)
    killed = setup.start(sys.executable, str(CRASH_RUNNER), "close", "2", "SIGKILL", "--")
    assert killed.process.wait(timeout=EXIT_TIMEOUT_S) == -signal.SIGKILL
    assert [r["outcome"] for r in setup.runs()] == [None]  # left open by the dead daemon
    table = setup.catalog.load_table("db.events")
    assert unreferenced_files(table), "the killed run should have left output files"

    daemon = setup.start()
    try:
        assert daemon.started["interrupted_runs_closed"] == 1
        daemon.run_finished("db.events", committed=True)
    finally:
        assert daemon.terminate() == 0, "".join(daemon.lines)
    outcomes = [r["outcome"] for r in setup.runs()]
    assert outcomes[0] == "interrupted" and "succeeded" in outcomes[1:]
    table = setup.catalog.load_table("db.events")
    assert_same_rows(rows, scan_rows(table))
    assert unreferenced_files(table) == []


def test_new_tables_matching_a_glob_are_picked_up_and_expired_without_restart(
    setup: Setup,
) -> None:
    create_events_table(setup.catalog, "db.first", commits=6, rows_per_commit=100, days=2)
    setup.job(
        "all",
        COMPACT_EVERY_SECOND
        + '\n[expire]\nevery = "1s"\nolder_than = "0s"\non_table_globs = true\n'
        + '\n[orphans]\nevery = "1h"\non_table_globs = true\n',
    )
    setup.job("other", 'tables = ["elsewhere.*"]\n[compact]\nevery = "1h"\n')
    daemon = setup.start()
    try:
        daemon.run_finished("db.first", committed=True)
        # A table created while the daemon runs is found on a later tick.
        second = create_events_table(
            setup.catalog, "db.second", commits=6, rows_per_commit=100, days=2
        )
        rows = scan_rows(second)
        daemon.run_finished("db.second", committed=True)
        expired = daemon.wait_for(
            lambda e: (
                e.get("event") == "run_finished"
                and e["table"] == "db.second"
                and e["action"] == "expire"
                and e["input_files"] > 0
            ),
            "an expiry of db.second after its compaction",
        )
    finally:
        assert daemon.terminate() == 0, "".join(daemon.lines)
    assert expired["outcome"] == "succeeded"
    table = setup.catalog.load_table("db.second")
    assert len(table.metadata.snapshots) == 1  # only the current one is kept
    assert_same_rows(rows, scan_rows(table))
    assert unreferenced_files(table) == []
    scanned = {t["table"] for t in setup.status()["tables"]}
    assert scanned == {"db.first", "db.second"}


def test_deletion_vectors_of_a_v3_table_are_left_to_its_compaction(
    setup: Setup, java_reader: JavaReader
) -> None:
    """rewrite-deletes does not merge deletion vectors: the daemon never queues it for a
    format-3 table without equality deletes, however many DVs it has; a compaction applies
    them."""
    location = setup.root / "dv"
    setup.catalog.register_table(("db", "dv"), write_cdc_table("dv", location, seed=2))
    setup.job(
        "cdc",
        COMPACT_EVERY_SECOND.replace('"db.*"', '"db.dv"')
        + 'target_file_size = "1MiB"\nallow_small_target = true\n\n'
        + '[rewrite_deletes]\nevery = "1s"\nmin_position_delete_files = 1\n',
    )
    daemon = setup.start()
    try:
        daemon.run_finished("db.dv", committed=True)
        tick = daemon.wait_for(
            lambda e: e.get("event") == "tick" and e["action"] == "rewrite_deletes",
            "a rewrite_deletes tick after the compaction",
        )
    finally:
        assert daemon.terminate() == 0, "".join(daemon.lines)
    assert tick["queued"] == []
    assert [r["action"] for r in setup.runs()] == ["compact"]
    table = setup.catalog.load_table("db.dv")
    assert java_read(table, []).current.rows == read_expected(location).rows


def test_a_table_target_outside_the_range_is_warned_about_and_still_compacted(
    setup: Setup,
) -> None:
    table = create_events_table(setup.catalog, "db.odd", commits=4, rows_per_commit=200, days=1)
    with table.transaction() as transaction:
        transaction.set_properties({"write.target-file-size-bytes": "1024"})
    setup.job("odd", COMPACT_EVERY_SECOND)
    daemon = setup.start()
    try:
        warned = daemon.wait_for(lambda e: e.get("event") == "setting_replaced", "a warning")
        finished = daemon.run_finished("db.odd", committed=True)
        for _ in range(2):  # the table is scored again each tick: the warning is not repeated
            daemon.wait_for(lambda e: e.get("event") == "tick", "a later tick")
    finally:
        assert daemon.terminate() == 0, "".join(daemon.lines)
    assert warned["table"] == "db.odd"
    assert "write.target-file-size-bytes=1024" in warned["message"]
    assert sum('"setting_replaced"' in line for line in daemon.lines) == 1, daemon.lines
    assert not any('"scan_failed"' in line for line in daemon.lines)
    assert finished["outcome"] == "succeeded", finished


def test_groups_whose_rewrite_grew_are_not_rewritten_at_every_cooldown(setup: Setup) -> None:
    """Files that grow when rewritten (zstd files in a table now set to uncompressed, three
    files to a partition that would come out as more) are rewritten once; the runs after leave
    them alone while they and the settings stay, after a restart too (the state file keeps
    them)."""
    table = create_events_table(
        setup.catalog, "db.grows", commits=3, rows_per_commit=60_000, days=1
    )
    with table.transaction() as transaction:
        transaction.set_properties({"write.parquet.compression-codec": "uncompressed"})
    snapshot = setup.catalog.load_table("db.grows").current_snapshot()
    setup.job(
        "grows",
        COMPACT_EVERY_SECOND.replace('"db.*"', '"db.grows"')
        + 'target_file_size = "512KiB"\nallow_small_target = true\n',
    )
    daemon = setup.start()
    try:
        runs = [daemon.run_finished("db.grows") for _ in range(3)]
        metrics = daemon.metrics()
    finally:
        assert daemon.terminate() == 0, "".join(daemon.lines)
    restarted = setup.start()
    try:
        runs.append(restarted.run_finished("db.grows"))
    finally:
        assert restarted.terminate() == 0, "".join(restarted.lines)
    assert [r["outcome"] for r in runs] == ["noop"] * 4, runs
    grew = [line for line in daemon.lines + restarted.lines if "its rewrite grew" in line]
    assert len(grew) == 4, grew  # one group per (day, region) partition, in the first run
    assert metrics[("compactor_grown_groups_total", ())] == 4
    assert setup.catalog.load_table("db.grows").current_snapshot() == snapshot


def test_cron_schedules_wait_for_their_time_and_every_schedules_start_at_once(
    setup: Setup,
) -> None:
    create_events_table(setup.catalog, "db.first", commits=6, rows_per_commit=100, days=2)
    setup.job("nightly", 'tables = ["db.first"]\n\n[expire]\ncron = "0 3 * * *"\n')
    setup.job("busy", COMPACT_EVERY_SECOND)
    daemon = setup.start()
    try:
        daemon.run_finished("db.first", committed=True)  # the `every` job ticked at start
        schedules = {
            (s["job"], s["action"]): s["next_run_at_ms"] for s in setup.status()["schedules"]
        }
    finally:
        assert daemon.terminate() == 0
    assert [r["action"] for r in setup.runs() if r["action"] == "expire"] == []
    next_expire = datetime.fromtimestamp(schedules[("nightly", "expire")] / 1000, UTC)
    assert (next_expire.hour, next_expire.minute, next_expire.second) == (3, 0, 0)
    assert next_expire > datetime.now(UTC)


def _health(url: str) -> tuple[int, dict[str, Any]]:
    """``/healthz``: status code and JSON body, whatever the code."""
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_job_failing_every_tick_is_shown_degrades_health_and_recovers(setup: Setup) -> None:
    create_events_table(setup.catalog, "db.events", commits=6, rows_per_commit=100, days=2)
    setup.job("healthy", COMPACT_EVERY_SECOND.replace('"db.*"', '"db.events"'))
    setup.job("broken", COMPACT_EVERY_SECOND.replace('"db.*"', '"db.gone"'))
    daemon = setup.start()
    try:
        seen: dict[str, dict[str, Any]] = {}

        def failing_and_compacted(event: dict[str, Any]) -> bool:
            if (
                event.get("job") == "broken"
                and event.get("consecutive_failures", 0) >= DEGRADED_AFTER_FAILED_TICKS
            ):
                seen.setdefault("failing", event)
            if (
                event.get("event") == "run_finished"
                and event["table"] == "db.events"
                and event["snapshot_ids"]
            ):
                seen["compacted"] = event  # the healthy job still compacts
            return len(seen) == 2

        daemon.wait_for(
            failing_and_compacted,
            f"{DEGRADED_AFTER_FAILED_TICKS} failed ticks of one job and a compaction by the other",
        )
        code, health = _health(daemon.url)
        metrics = daemon.metrics()
        status = setup.status()
        # The table appears: the next tick succeeds and the daemon is healthy again.
        create_events_table(setup.catalog, "db.gone", commits=1, rows_per_commit=10, days=1)
        daemon.wait_for(
            lambda e: e.get("job") == "broken" and e.get("consecutive_failures") == 0,
            "a successful tick of the broken job",
        )
        recovered_code, recovered = _health(daemon.url)
        recovered_status = setup.status()
    finally:
        assert daemon.terminate() == 0, "".join(daemon.lines)

    missing = f"table db.gone does not exist in catalog '{CATALOG}'"
    assert (seen["failing"]["event"], seen["failing"]["error"]) == ("tick_failed", missing)
    assert (code, health["status"]) == (503, "degraded"), health
    (failed,) = health["failing"]
    assert (failed["job"], failed["action"], failed["error"]) == ("broken", "compact", missing)
    assert failed["consecutive_failures"] >= DEGRADED_AFTER_FAILED_TICKS
    broken = (("action", "compact"), ("job", "broken"))
    healthy = (("action", "compact"), ("job", "healthy"))
    assert metrics[("compactor_job_tick_failures_total", broken)] >= DEGRADED_AFTER_FAILED_TICKS
    assert metrics[("compactor_job_consecutive_tick_failures", broken)] >= (
        DEGRADED_AFTER_FAILED_TICKS
    )
    assert metrics[("compactor_job_tick_failures_total", healthy)] == 0
    assert metrics[("compactor_job_consecutive_tick_failures", healthy)] == 0
    jobs = {j["job"]: j for j in status["jobs"]}
    assert jobs["broken"]["last_outcome"] == "failed"
    assert jobs["broken"]["consecutive_failures"] >= DEGRADED_AFTER_FAILED_TICKS
    assert (jobs["broken"]["last_success_at_ms"], jobs["broken"]["last_error"]) == (None, missing)
    assert (jobs["healthy"]["last_outcome"], jobs["healthy"]["consecutive_failures"]) == ("ok", 0)
    assert jobs["healthy"]["last_success_at_ms"] is not None

    assert (recovered_code, recovered["status"]) == (200, "ok"), recovered
    assert "failing" not in recovered
    jobs = {j["job"]: j for j in recovered_status["jobs"]}
    assert (jobs["broken"]["last_outcome"], jobs["broken"]["consecutive_failures"]) == ("ok", 0)
    assert jobs["broken"]["last_success_at_ms"] is not None
    assert jobs["broken"]["last_error"] is None


def test_an_unreadable_file_is_logged_recorded_and_shown_by_status(setup: Setup) -> None:
    table = create_events_table(setup.catalog, "db.bad", commits=3, rows_per_commit=200, days=1)
    bad = sorted(live_data_files(table))[0]
    local_path(bad).unlink()
    setup.job("bad", COMPACT_EVERY_SECOND.replace('"db.*"', '"db.bad"'))
    daemon = setup.start()
    try:
        logged = daemon.wait_for(lambda e: e.get("event") == "file_unreadable", "a skipped file")
        finished = daemon.run_finished("db.bad", committed=True)
    finally:
        assert daemon.terminate() == 0, "".join(daemon.lines)
    assert (logged["level"], logged["table"], logged["path"]) == ("warning", "db.bad", bad)
    assert f"unreadable file {bad}: missing data file: " in logged["message"]
    assert finished["outcome"] == "partial", finished
    assert [f["path"] for f in finished["skipped_files"]] == [bad]
    (row,) = [t for t in setup.status()["tables"] if t["table"] == "db.bad"]
    assert row["last_compaction"]["skipped_files"] == finished["skipped_files"]
    shown = setup.cli("status", "--config", "compactor.toml")
    assert "unreadable files" in shown and bad in shown
    assert finished["skipped_files"][0]["reason"] in shown  # "[errno 2]" and all


# Scores db.events from its manifests at every tick and never finds it due.
SCORE_ONLY = """
tables = ["db.events"]

[compact]
every = "1h"
min_small_files = 100000
min_small_bytes = "1TiB"
"""


def _cell(text: str, row: str, column: int) -> str:
    """Column ``column`` of the first rich table row of ``text`` whose first cell is ``row``."""
    cells = [
        [cell.strip() for cell in line.split("│")[1:-1]]
        for line in text.splitlines()
        if "│" in line
    ]
    found = next(c for c in cells if c[0] == row)
    return found[column]


def test_inspect_status_and_metrics_count_the_same_small_files_before_and_after_a_compaction(
    setup: Setup,
) -> None:
    """Small files are those a compaction would rewrite, wherever they are counted."""
    create_events_table(setup.catalog, "db.events", commits=6, rows_per_commit=100, days=2)
    setup.job("score", SCORE_ONLY)
    inspect = ("inspect", "--table", "db.events", "--catalog", CATALOG)
    counts = []
    for step in ("before", "after"):
        if step == "after":
            setup.cli("run", "--table", "db.events", "--catalog", CATALOG)
        daemon = setup.start()
        try:
            daemon.wait_for(lambda e: e.get("event") == "tick" and e["job"] == "score", "a scan")
            metrics = daemon.metrics()
        finally:
            assert daemon.terminate() == 0, "".join(daemon.lines)
        status = setup.status()
        assert_documented("status", status)
        (row,) = status["tables"]
        inspected = json.loads(setup.cli(*inspect, "--json"))
        counts.append(
            {
                "inspect --json": inspected["small_files"],
                "inspect": int(
                    _cell(setup.cli(*inspect), "small files (a compaction would rewrite)", 1)
                ),
                "status --json": row["small_files"],
                "status": int(
                    _cell(setup.cli("status", "--config", "compactor.toml"), "db.events", 2)
                ),
                "/metrics": metrics[("compactor_table_small_files", (("table", "db.events"),))],
            }
        )
        assert row["files_under_target"] == inspected["files_under_target"] > 0
    before, after = counts
    assert set(before.values()) == {6 * 8}, before  # 6 files in each of 8 partitions
    assert set(after.values()) == {0}, after  # 8 files left, one a partition: nothing to merge


def test_a_commit_in_doubt_is_kept_by_the_daemon_and_shown_by_status(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's commit got a 504 and was not applied (yet): the daemon's next action on the
    table keeps its files, and says so."""
    table = create_events_table(setup.catalog, "db.doubt", commits=3, rows_per_commit=200, days=1)
    # A position delete file: the delete rewrite is due, and finds nothing to merge.
    data_file = next(iter(live_data_files(table).values()))
    table = commit_delete_files(table, [write_position_delete_file(table, {data_file: [0]})])

    def lost(*_: object) -> None:
        raise CommitStateUnknownException("504 Gateway Timeout")

    with monkeypatch.context() as patched:
        patched.setattr(setup.catalog, "commit_table", lost)
        with pytest.raises(CommitStateUnknownError):
            api.compact(table, target_file_size="1MiB", allow_small_target=True, min_input_files=2)
    kept = unreferenced_files(table)
    (pending,) = read_record(table).commits()
    setup.job(
        "doubt",
        'tables = ["db.doubt"]\n\n[rewrite_deletes]\nevery = "1s"\nmin_position_delete_files = 1\n',
    )
    daemon = setup.start()
    try:
        finished = daemon.run_finished("db.doubt", action="rewrite_deletes")
        metrics = daemon.metrics()
    finally:
        assert daemon.terminate() == 0, "".join(daemon.lines)
    assert finished["outcome"] == "noop", finished
    assert metrics[("compactor_table_commits_in_doubt", (("table", "db.doubt"),))] == 1
    assert [c["snapshot_id"] for c in finished["commits_in_doubt"]] == [pending.snapshot_id]
    (run,) = [r for r in setup.status()["runs"] if r["table"] == "db.doubt"][:1]
    assert run["commits_in_doubt"] == finished["commits_in_doubt"]
    shown = setup.cli("status", "--config", "compactor.toml")
    assert "commits in doubt" in shown and str(pending.snapshot_id) in shown
    assert set(kept) <= set(unreferenced_files(setup.catalog.load_table("db.doubt")))


def test_a_tables_own_properties_pause_or_tune_the_daemons_actions(setup: Setup) -> None:
    """``compactor.enabled=false`` pauses every action on a table, not counted as a failure;
    ``compactor.compact.min-small-files`` raises the job file's threshold for one table."""
    tables = {name: f"db.{name}" for name in ("paused", "tuned", "plain")}
    for name, identifier in tables.items():
        table = create_events_table(setup.catalog, identifier, commits=6, rows_per_commit=100)
        properties = {
            "paused": {"compactor.enabled": "false"},
            "tuned": {"compactor.compact.min-small-files": "1000"},
        }.get(name)
        if properties:
            with table.transaction() as tx:
                tx.set_properties(properties)
    expire = '\n[expire]\nevery = "1s"\nolder_than = "0s"\non_table_globs = true\n'
    setup.job("all", COMPACT_EVERY_SECOND + expire)
    daemon = setup.start()
    try:
        paused = daemon.wait_for(
            lambda e: e.get("event") == "paused" and e["table"] == tables["paused"],
            "the paused table's compaction to be left alone",
        )
        expiry = daemon.run_finished(tables["paused"], action="expire")
        daemon.run_finished(tables["plain"], committed=True)
        daemon.wait_for(
            lambda e: e.get("event") == "run_finished" and e["table"] == tables["plain"],
            "another tick after the first compaction",
        )
    finally:
        assert daemon.terminate() == 0, "".join(daemon.lines)
    assert paused["by"] == "compactor.enabled=false" and paused["action"] == "compact"
    assert expiry["outcome"] == "skipped"
    assert "expire is paused by its property compactor.enabled=false" in expiry["error"]
    for name in ("paused", "tuned"):
        assert _compactor_snapshots(setup.catalog.load_table(tables[name])) == [], name
    status = setup.status()
    scans = {t["table"]: t for t in status["tables"]}
    assert scans[tables["tuned"]]["reasons"] == []
    # The paused table is scored from its snapshot summary, never due, its pause named.
    paused_scan = scans[tables["paused"]]
    settings = {s["option"]: (s["value"], s["source"]) for s in paused_scan["settings"]}
    assert paused_scan["due"] is False and paused_scan["source"] == "summary"
    assert settings["enabled"] == ("False", "table property compactor.enabled")
    # One convention in the log and in status --json: "table", times in epoch milliseconds.
    assert expiry["table"] == tables["paused"] and isinstance(expiry["started_at_ms"], int)
    assert not {"table_name", "started_at", "ended_at"} & (set(expiry) | set(status["runs"][0]))
