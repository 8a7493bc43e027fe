"""The quarantine: a file found unreadable stays in the table as it is, out of compaction, until
its bytes change or it is cleared; the command line lists and clears it; orphans never delete it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog

from compactor import api
from compactor.daemon.config import DaemonConfig, DaemonSection
from compactor.daemon.jobfiles import CompactAction
from compactor.daemon.scheduling import Request
from compactor.daemon.service import Daemon, Work
from compactor.daemon.status import daemon_status
from compactor.iceberg.delete_files import commit_delete_files
from compactor.options import resolve_options
from compactor.quarantine import clear_quarantine, quarantine_path, read_quarantine

from support.cli import assert_one_error_line, embedded, invoke, isolate
from support.deletes import write_position_delete_file
from support.json_output import assert_documented
from support.rows import assert_same_rows, scan_rows
from support.runs import DEFAULT_OPTIONS, run_compaction
from support.tables import live_data_files, live_delete_files, local_path

TABLE = "db.t"
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("x", pa.float64())])
ROWS = 500
SMALL_TARGET = ("--target-file-size", "1MiB", "--allow-small-target", "--min-input-files", "2")


def append(catalog: Catalog, *starts: int) -> None:
    table = catalog.load_table(TABLE)
    for start in starts:
        ids = np.arange(start, start + ROWS)
        table.append(pa.table({"id": ids, "x": np.random.default_rng(start).random(ROWS)}, SCHEMA))


def ids_of(data: pa.Table) -> set[int]:
    return set(data.column("id").to_pylist())


def damage(path: Path, how: str) -> None:
    """Truncate ``path`` to 100 bytes, delete it, or flip a bit in a (checksummed) page of x."""
    if how == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    elif how == "missing":
        path.unlink()
    else:
        chunk = pq.ParquetFile(path).metadata.row_group(0).column(1)  # x: plain doubles
        data = bytearray(path.read_bytes())
        data[chunk.data_page_offset + chunk.total_compressed_size // 2] ^= 0x01
        path.write_bytes(bytes(data))


@pytest.fixture(params=["truncated", "corrupt page", "missing"])
def damaged(request: pytest.FixtureRequest, catalog: Catalog) -> tuple[str, bytes, pa.Table]:
    """An unpartitioned table of three files, one damaged: its path, its bytes as they were,
    and the table's rows before. A damaged page is caught by its CRC, which compactor writes:
    that file is the output of a first compaction."""
    codec = {"write.parquet.compression-codec": "uncompressed"}
    catalog.create_table(TABLE, SCHEMA, properties=codec)
    if request.param == "corrupt page":
        append(catalog, 0, ROWS, 2 * ROWS)
        result, _ = run_compaction(catalog, TABLE)
        (bad,) = [d.file_path for d in result.added_files]
        append(catalog, 3 * ROWS, 4 * ROWS)
    else:
        append(catalog, 0, ROWS, 2 * ROWS)
        bad = sorted(live_data_files(catalog.load_table(TABLE)))[0]
    rows = scan_rows(catalog.load_table(TABLE))
    original = local_path(bad).read_bytes()
    damage(local_path(bad), request.param)
    return bad, original, rows


def test_a_run_commits_around_an_unreadable_file_and_the_next_leave_it_out_until_it_changes(
    catalog: Catalog, damaged: tuple[str, bytes, pa.Table]
) -> None:
    bad, original, rows = damaged
    before = live_data_files(catalog.load_table(TABLE))

    first, table = run_compaction(catalog, TABLE)
    second, _ = run_compaction(catalog, TABLE)
    local_path(bad).write_bytes(original)  # repaired: other bytes than when it was found
    third, repaired = run_compaction(catalog, TABLE)

    # The first run rewrote the other files into one and left the unreadable one as it was.
    assert [f.path for f in first.skipped_files] == [bad]
    assert [f.path for f in first.quarantined_files] == [bad]
    assert first.failures == [] and len(first.snapshot_ids) == 1
    (added,) = [d.file_path for d in first.added_files]
    after = live_data_files(table)
    assert set(after) == {bad, added}
    assert after[bad].record_count == before[bad].record_count
    assert sum(f.record_count for f in after.values()) == rows.num_rows  # no row lost
    bad_ids = ids_of(pq.read_table(pa.BufferReader(original)))
    assert ids_of(pq.read_table(local_path(added))) == ids_of(rows) - bad_ids
    # The second did not try it again.
    assert second.plan.groups == [] and second.skipped_files == []
    assert second.plan.skipped["quarantined_files"] == 1
    (held,) = second.quarantined_files
    assert (held.path, held.first_seen_ms) == (bad, first.quarantined_files[0].first_seen_ms)
    # Repaired, it is planned again: the table holds every row it had.
    assert third.quarantined_files == [] and third.skipped_files == []
    assert bad in {f.path for f in third.rewritten_files}
    assert_same_rows(rows, scan_rows(repaired))
    assert read_quarantine(repaired) == {}


def test_a_cleared_file_is_tried_again(catalog: Catalog) -> None:
    catalog.create_table(TABLE, SCHEMA)
    append(catalog, 0, ROWS, 2 * ROWS)
    bad = sorted(live_data_files(catalog.load_table(TABLE)))[0]
    damage(local_path(bad), "truncated")
    run_compaction(catalog, TABLE)
    append(catalog, 3 * ROWS)  # the new file and the one the first run wrote: a group

    assert clear_quarantine(catalog.load_table(TABLE)) == [bad]
    again, _ = run_compaction(catalog, TABLE)

    assert [f.path for f in again.skipped_files] == [bad]  # tried, found unreadable again
    assert [f.path for f in again.quarantined_files] == [bad]
    assert len(again.snapshot_ids) == 1 and again.failures == []


def test_orphans_never_delete_the_quarantine(catalog: Catalog) -> None:
    catalog.create_table(TABLE, SCHEMA)
    append(catalog, 0, ROWS, 2 * ROWS)
    bad = sorted(live_data_files(catalog.load_table(TABLE)))[0]
    local_path(bad).unlink()
    _, table = run_compaction(catalog, TABLE)
    stored = local_path(quarantine_path(table))
    week_ago = time.time() - 7 * 86400
    os.utime(stored, (week_ago, week_ago))  # older than the orphans' default cut-off

    swept = api.remove_orphans(table)

    assert stored.exists() and str(stored) not in {
        str(local_path(p)) for p in swept.orphan_locations
    }
    assert list(read_quarantine(table)) == [bad]


def test_the_command_line_reports_lists_and_clears_the_quarantine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolate(monkeypatch, tmp_path)
    monkeypatch.chdir(tmp_path)
    catalog = embedded(tmp_path)
    catalog.create_namespace("db")
    catalog.create_table(TABLE, SCHEMA)
    append(catalog, 0, ROWS, 2 * ROWS)
    bad = sorted(live_data_files(catalog.load_table(TABLE)))[0]
    damage(local_path(bad), "truncated")

    run = invoke("run", "--table", TABLE, *SMALL_TARGET, "--json")
    inspected = invoke("inspect", "--table", TABLE)
    listed = invoke("quarantine", "list", "--json")  # every table of the catalog
    unknown = invoke("quarantine", "clear", "--table", TABLE, "--path", "f.parquet")
    cleared = invoke("quarantine", "clear", "--table", TABLE, "--json")

    assert run.returncode == 0, run.stderr  # committed around the file: not a failure
    document = json.loads(run.stdout)
    assert_documented("run", document)
    assert [f["path"] for f in document["skipped_files"]] == [bad]
    assert [f["path"] for f in document["quarantined_files"]] == [bad]
    assert document["committed_groups"] == 1 and document["failed_groups"] == []
    assert inspected.returncode == 0, inspected.stderr
    assert "quarantined file, left out of compaction since " in inspected.stdout
    assert bad in inspected.stdout
    assert listed.returncode == 0, listed.stderr
    files = json.loads(listed.stdout)
    assert_documented("quarantine list", files)
    assert [(f["table"], f["path"], f["changed"]) for f in files["files"]] == [(TABLE, bad, False)]
    assert_one_error_line(unknown, 2, TABLE, "f.parquet is not quarantined")
    assert cleared.returncode == 0, cleared.stderr
    assert json.loads(cleared.stdout) == {"table": TABLE, "cleared": [bad]}
    assert_documented("quarantine clear", json.loads(cleared.stdout))
    assert read_quarantine(catalog.load_table(TABLE)) == {}


def test_the_daemon_records_exports_and_reports_the_quarantine(
    catalog: Catalog, tmp_path: Path
) -> None:
    """In the state file (and so in ``status``), as a gauge, and in /healthz, also after a
    restart."""
    catalog.create_table(TABLE, SCHEMA)
    append(catalog, 0, ROWS, 2 * ROWS)
    bad = sorted(live_data_files(catalog.load_table(TABLE)))[0]
    local_path(bad).unlink()
    config = DaemonConfig(tmp_path / "compactor.toml", DaemonSection(state="state.db", listen=""))
    section = CompactAction(every="1h", **DEFAULT_OPTIONS)
    properties = catalog.load_table(TABLE).metadata.properties
    work = Work(catalog, section, resolve_options(TABLE, properties, **section.given()))
    gauge = ("compactor_table_quarantined_files", {"table": TABLE})

    daemon = Daemon(config, [])
    daemon.start()
    daemon._execute(Request(TABLE, "compact", "job", payload=work))
    health, exported = daemon._health(), daemon.metrics.registry.get_sample_value(*gauge)
    daemon.drain()
    restarted = Daemon(config, [])
    restarted.start()
    health_after_restart = restarted._health()
    restarted.drain()

    (run,) = daemon_status(config, [], time.time())["runs"]
    assert run["outcome"] == "partial" and run["snapshot_ids"]
    assert [(f["path"], f["reason"][:13]) for f in run["quarantined_files"]] == [
        (bad, "missing data ")
    ]
    expected = [{"table": TABLE, "path": bad, "reason": run["quarantined_files"][0]["reason"]}]
    assert health == ("ok", {"running": 0, "queued": 0, "quarantined_files": expected})
    assert health_after_restart[1]["quarantined_files"] == expected
    assert exported == 1


def test_an_unreadable_delete_file_leaves_out_the_data_files_it_applies_to(
    catalog: Catalog,
) -> None:
    """Rewriting them without it would bring its deleted rows back: they stay as they are, with
    it, until it can be read again."""
    catalog.create_table(TABLE, SCHEMA)
    append(catalog, 0, ROWS, 2 * ROWS)
    table = catalog.load_table(TABLE)
    target, *_ = sorted(live_data_files(table).values(), key=lambda f: f.file_path)
    deletes = write_position_delete_file(table, {target: range(10)})
    table = commit_delete_files(table, [deletes])
    rows = scan_rows(table)
    original = local_path(deletes.file_path).read_bytes()
    local_path(deletes.file_path).unlink()

    first, table = run_compaction(catalog, TABLE)
    second, _ = run_compaction(catalog, TABLE)
    local_path(deletes.file_path).write_bytes(original)
    third, repaired = run_compaction(catalog, TABLE)

    assert [f.path for f in first.quarantined_files] == [deletes.file_path]
    assert first.skipped_files[0].reason.startswith("missing delete file: ")
    (added,) = [d.file_path for d in first.added_files]
    assert set(live_data_files(table)) == {target.file_path, added}
    assert set(live_delete_files(table)) == {deletes.file_path}
    written = ids_of(pq.read_table(local_path(added)))
    # The other two files' rows; none of the target's, whose deletes could not be read.
    assert written == set(range(3 * ROWS)) - ids_of(pq.read_table(local_path(target.file_path)))
    assert second.plan.groups == [] and second.plan.skipped["quarantined_files"] == 1
    assert third.quarantined_files == [] and len(third.snapshot_ids) == 1
    assert_same_rows(rows, scan_rows(repaired))  # the 10 deleted rows stay deleted
