"""The daemon's ``[rewrite_manifests]``: manifests rewritten once a compaction has committed.

A real ``compactor daemon`` process, as in test_daemon.py: its log is followed event by event.
"""

from __future__ import annotations

import json

import pytest

from compactor.bench.sample import create_events_table
from compactor.planning.manifest_groups import manifest_stats, plan_manifest_rewrite

from support.daemon import CATALOG, COMPACT_EVERY_SECOND, Setup
from support.json_output import assert_documented
from support.rows import assert_same_rows, scan_rows
from support.tables import unreferenced_files

pytest_plugins = ("support.daemon",)

pytestmark = pytest.mark.slow  # left out by `make test-quick`

TABLE = "db.events"


def test_manifests_are_rewritten_right_after_a_compaction_and_reported(setup: Setup) -> None:
    table = create_events_table(setup.catalog, TABLE, commits=12, rows_per_commit=160, days=2)
    rows = scan_rows(table)
    # Compaction of one region: every commit's manifest loses entries and is rewritten. The
    # manifest schedule never comes in the test (1 January): only the compaction queues it.
    setup.job(
        "streaming",
        COMPACT_EVERY_SECOND
        + "where = \"region = 'eu'\"\n\n"
        + '[rewrite_manifests]\ncron = "0 0 1 1 *"\nmin_manifests = 4\n',
    )
    daemon = setup.start()
    try:
        compaction = daemon.run_finished(TABLE, committed=True)
        rewrite = daemon.run_finished(TABLE, action="rewrite_manifests", committed=True)
        metrics = daemon.metrics()
    finally:
        assert daemon.terminate() == 0, "".join(daemon.lines)

    assert compaction["outcome"] == "succeeded"
    assert rewrite["outcome"] == "succeeded", rewrite
    assert rewrite["input_files"] >= 12 and 0 < rewrite["output_files"] < 4
    runs = {r["action"]: r for r in setup.runs() if json.loads(r["snapshot_ids"])}
    assert runs["rewrite_manifests"]["started_at"] >= runs["compact"]["ended_at"]
    table = setup.catalog.load_table(TABLE)
    assert_same_rows(rows, scan_rows(table))
    assert not plan_manifest_rewrite(table, 8 << 20).groups
    assert unreferenced_files(table) == []
    stats = manifest_stats(table)
    assert (
        metrics[("compactor_table_manifests", (("content", "data"), ("table", TABLE)))]
        == (stats.manifests["data"])
    )
    assert metrics[("compactor_rewritten_manifests_total", ())] == rewrite["input_files"]
    assert ("compactor_table_metadata_files", (("table", TABLE),)) in metrics
    # status shows the manifests counted at the rewrite, as inspect and the gauges do.
    status = setup.status()
    assert_documented("status", status)
    (row,) = status["tables"]
    assert row["manifests"]["manifests"] == stats.manifests
    inspected = json.loads(setup.cli("inspect", "--table", TABLE, "--catalog", CATALOG, "--json"))
    assert inspected["manifests"] == stats.manifests
    assert (
        inspected["average_entries_per_manifest"]
        == row["manifests"]["average_entries_per_manifest"]
    )
    assert inspected["metadata_files"] == row["manifests"]["metadata_files"]
    runs_total = (
        "compactor_runs_total",
        (("action", "rewrite_manifests"), ("outcome", "succeeded")),
    )
    assert metrics[runs_total] == 1
