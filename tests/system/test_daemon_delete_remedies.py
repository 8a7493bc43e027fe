"""The daemon picks the cheapest remedy for equality deletes: convert, compact, or wait.

Three CDC tables written by Iceberg Java (the upsert scenario: 4 partitions, each with 24 data
files of about 2 KB, 30 equality-delete files and 8 to 13 position-delete files), one job file
each, the same but for the target file size and ``min_equality_delete_files``. A real
``compactor daemon`` process, as in test_daemon.py: its log is followed event by event.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.manifest import DataFileContent

from support.daemon import Setup
from support.java_reader import JavaReader, java_read
from support.java_writer import read_expected, write_cdc_table
from support.tables import live_data_files, live_delete_files

pytest_plugins = ("support.daemon",)

pytestmark = pytest.mark.slow  # left out by `make test-quick`

SEED = 1  # the same table three times
EQUALITY_PER_PARTITION = 30
# Compaction on delete files only past the position-delete files (40) plus the 4 a conversion
# writes, below all delete files (160): counting the equality deletes would make it due.
MIN_DELETE_FILES = 100
TICKS = (
    ("few", "compact"),
    ("few", "rewrite_deletes"),
    ("sized", "compact"),
    ("small", "rewrite_deletes"),
)


def _job(table: str, target: str, min_equality_delete_files: int) -> str:
    return f"""
tables = ["{table}"]

[compact]
every = "1s"
cooldown = "0s"
target_file_size = "{target}"
allow_small_target = true
min_small_files = 1000
min_delete_files = {MIN_DELETE_FILES}

[rewrite_deletes]
every = "1s"
min_equality_delete_files = {min_equality_delete_files}
min_position_delete_files = 1000
"""


def _deletes(table: Any) -> Counter[DataFileContent]:
    return Counter(f.content for f in live_delete_files(table).values())


def _committed(event: dict[str, Any]) -> bool:
    return event.get("event") == "run_finished" and bool(event["snapshot_ids"])


def _ticked(job: str, action: str) -> Any:
    return lambda e: e.get("event") == "tick" and e["job"] == job and e["action"] == action


def test_equality_deletes_converted_over_right_sized_data_compacted_over_small_data(
    setup: Setup, java_reader: JavaReader
) -> None:
    tables: dict[str, Path] = {}
    for name in ("sized", "small", "few"):
        tables[name] = setup.root / name
        setup.catalog.register_table(("db", name), write_cdc_table("upsert", tables[name], SEED))
    before = {name: setup.catalog.load_table(f"db.{name}") for name in tables}
    for table in before.values():
        assert _deletes(table)[DataFileContent.EQUALITY_DELETES] == 4 * EQUALITY_PER_PARTITION
    # 2000 bytes: every data file (1.7 to 2.5 KB) is right-sized; the default target: all small.
    setup.job("sized", _job("db.sized", "2000", EQUALITY_PER_PARTITION))
    setup.job("small", _job("db.small", "512MiB", EQUALITY_PER_PARTITION))
    setup.job("few", _job("db.few", "2000", EQUALITY_PER_PARTITION + 1))
    daemon = setup.start()
    try:
        finished: dict[str, dict[str, Any]] = {}
        while len(finished) < 2:  # in either order
            event = daemon.wait_for(_committed, "the runs on db.sized and db.small")
            finished[event["table"]] = event
        converted, compacted = finished["db.sized"], finished["db.small"]
        # Ticks of every job after both runs: each scored its table again, queueing nothing.
        later = [
            daemon.wait_for(_ticked(job, action), f"a {job} {action} tick") for job, action in TICKS
        ]
    finally:
        assert daemon.terminate() == 0, "".join(daemon.lines)
    due = {json.loads(line)["table"] for line in daemon.lines if '"deletes_due"' in line}
    assert due == {"db.sized"}
    assert all(tick["queued"] == [] for tick in later), later

    runs = Counter((r["table_name"], r["action"]) for r in setup.runs())
    assert runs[("db.sized", "compact")] == 0, runs
    assert runs[("db.small", "rewrite_deletes")] == 0, runs
    assert not [key for key in runs if key[0] == "db.few"], runs

    # Converted: the same data files, no equality delete left, the rows Java read before.
    sized = setup.catalog.load_table("db.sized")
    assert set(live_data_files(sized)) == set(live_data_files(before["sized"]))
    assert _deletes(sized)[DataFileContent.EQUALITY_DELETES] == 0
    assert converted["action"] == "rewrite_deletes", converted
    assert converted["input_files"] >= 4 * EQUALITY_PER_PARTITION, converted
    # Compacted: the rewrite applied the equality deletes, which went with the old files.
    small = setup.catalog.load_table("db.small")
    assert len(live_data_files(small)) == 4
    assert _deletes(small)[DataFileContent.EQUALITY_DELETES] == 0
    assert (compacted["action"], compacted["outcome"]) == ("compact", "succeeded"), compacted
    (scan,) = [t for t in setup.status()["tables"] if t["table"] == "db.small"]
    # Left alone: the same files as written.
    few = setup.catalog.load_table("db.few")
    assert few.current_snapshot() == before["few"].current_snapshot()
    for name, location in tables.items():
        table = setup.catalog.load_table(f"db.{name}")
        assert java_read(table, []).current.rows == read_expected(location).rows, name
    assert scan["due"] is False  # scored again after the compaction: nothing left to do
