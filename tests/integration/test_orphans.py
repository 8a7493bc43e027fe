"""``compactor orphans``: files under the table location that no metadata references.

File ages are set with ``os.utime``; cut-offs are explicit, computed from one ``now``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

import compactor.iceberg.references as references_module
import compactor.maintain.orphans as orphans_module
from compactor.bench.sample import create_events_table
from compactor.durations import DAY_MS
from compactor.errors import UsageError
from compactor.iceberg.references import FileRef, table_references
from compactor.maintain.expire import DeletionReport
from compactor.maintain.orphans import (
    ORPHAN_DATA,
    ORPHAN_METADATA,
    OrphanResult,
    find_orphans,
    orphan_cutoff,
    remove_orphans,
)
from compactor.storage.listing import StoredFile

from support.aged_files import (
    NOW_MS,
    OLD_MS,
    SCHEMA,
    age_everything,
    batch,
    junk,
    listing,
    root,
    set_mtime,
)
from support.cli import assert_one_error_line, compactor, embedded
from support.java_reader import assert_java_reads_same
from support.rows import assert_same_rows, scan_rows
from support.runs import assert_dry_run_predicts
from support.tables import local_path

TABLE = "db.t"


# --- building tables and files ---------------------------------------------------------------


def new_table(catalog: Catalog, appends: int = 3, identifier: str = TABLE) -> Table:
    table = catalog.create_table(identifier, SCHEMA)
    for i in range(appends):
        table.append(batch(100 * i))
    return table


def parquet_file(path: Path, start: int) -> Path:
    """A Parquet file with the table's columns and no field ids, as ``add_files`` wants it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(batch(start), path)
    return path


def reported(result: OrphanResult, kind: str) -> set[str]:
    return {str(local_path(ref.location)) for ref in result.report.by_kind.get(kind, [])}


def assert_referenced_files_exist(table: Table) -> None:
    missing = [loc for loc in table_references(table).all() if not local_path(loc).exists()]
    assert not missing, missing
    for entry in table.metadata.metadata_log:
        assert local_path(entry.metadata_file).exists()
    assert local_path(table.metadata_location).exists()


def assert_same_contents(before: pa.Table, after: pa.Table) -> None:
    """Same rows; pyiceberg reads ``string`` columns as ``large_string`` from some files."""
    assert_same_rows(before, after.cast(before.schema))


# --- 7. what goes and what stays -------------------------------------------------------------


def test_old_junk_goes_by_kind_referenced_and_young_files_stay(catalog: SqlCatalog) -> None:
    table = new_table(catalog)
    rows = scan_rows(table)
    location = root(table)
    age_everything(location)
    data_junk = {
        junk(location / "data" / "junk-1.parquet", 300),
        junk(location / "data" / "x=1" / "junk-2.bin", 200),
    }
    metadata_junk = {
        junk(location / "metadata" / "stray-m0.avro", 150),
        junk(location / "metadata" / "99999-stale.metadata.json", 50),
    }
    young = junk(location / "data" / "young.parquet", ms=None)  # written just now
    protected = {
        junk(location / "metadata" / "compactor-run.0.json"),  # a run record
        junk(location / "metadata" / "version-hint.text"),
    }
    before = listing(location)

    result = remove_orphans(table, TABLE, orphan_cutoff(None, NOW_MS))

    summary = result.to_dict()
    assert summary["older_than_ms"] == NOW_MS - 3 * DAY_MS
    assert summary["listed_files"] == len(before)
    assert summary["orphan_files"] == 4
    assert summary["skipped_too_young"] == 1
    assert summary["refused"] == []
    assert reported(result, ORPHAN_DATA) == {str(p) for p in data_junk}
    assert reported(result, ORPHAN_METADATA) == {str(p) for p in metadata_junk}
    assert summary["deleted"] == {
        ORPHAN_DATA: {"files": 2, "bytes": 500},
        ORPHAN_METADATA: {"files": 2, "bytes": 200},
    }
    assert summary["files_deleted"] == 4 and summary["bytes_deleted"] == 700
    after = listing(location)
    assert set(before) - set(after) == {str(p) for p in data_junk | metadata_junk}
    assert young.exists() and all(p.exists() for p in protected)
    table = catalog.load_table(TABLE)
    assert_referenced_files_exist(table)
    assert_same_contents(rows, scan_rows(table))
    assert_java_reads_same(table)


def test_a_digest_shared_with_a_referenced_file_keeps_an_orphan_and_deletes_nothing_needed(
    catalog: SqlCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Referenced files are held as digests: an orphan whose digest a referenced file shares is
    kept, the others go, and no referenced file is ever taken for an orphan."""
    table = new_table(catalog)
    rows = scan_rows(table)
    location = root(table)
    data = sorted((location / "data").rglob("*.parquet"))
    shadows = {junk(p.with_name(p.name + ".old"), 100) for p in data}  # same digests, below
    alone = {junk(location / "data" / f"junk-{i}.bin", 100) for i in range(3)}
    age_everything(location)
    digest = references_module.key_digest
    monkeypatch.setattr(
        references_module, "key_digest", lambda key: digest(key.removesuffix(".old"))
    )

    result = remove_orphans(table, TABLE, orphan_cutoff(None, NOW_MS))

    assert reported(result, ORPHAN_DATA) == {str(p) for p in alone}
    assert all(p.exists() for p in shadows)
    table = catalog.load_table(TABLE)
    assert_referenced_files_exist(table)
    assert_same_contents(rows, scan_rows(table))


def test_references_match_however_the_metadata_spells_the_path(catalog: SqlCatalog) -> None:
    table = new_table(catalog, appends=1)
    location = root(table)
    plain = parquet_file(location / "data" / "plain.parquet", 1000)
    single_slash = parquet_file(location / "data" / "single-slash.parquet", 2000)
    # Java writers escape partition values in paths; the object's name keeps the escape.
    escaped = parquet_file(location / "data" / "v=a%3Db" / "escaped.parquet", 3000)
    spellings = [str(plain), f"file:{single_slash}", f"file://{escaped}"]
    table.add_files(spellings)
    assert set(spellings) <= set(table_references(table).all())
    rows = scan_rows(table)
    age_everything(location)

    # Any unreferenced file would go.
    result = remove_orphans(table, TABLE, NOW_MS + DAY_MS, allow_short_older_than=True)

    assert result.to_dict()["orphan_files"] == 0
    assert plain.exists() and single_slash.exists() and escaped.exists()
    assert_same_contents(rows, scan_rows(catalog.load_table(TABLE)))


# --- 7. a commit between the scan and the deletion -------------------------------------------


def commit_before_deleting(
    monkeypatch: pytest.MonkeyPatch, catalog: Catalog, path: Path
) -> list[list[FileRef]]:
    """Make ``remove_orphans`` commit ``path`` (via ``add_files``) after its scan, before deleting.

    Returns the list of candidates the deletion step was given.
    """
    original = orphans_module.delete_unreachable
    seen: list[list[FileRef]] = []

    def commit_then_delete(
        table: Table, candidates: list[FileRef], *, dry_run: bool, report: DeletionReport
    ) -> None:
        catalog.load_table(TABLE).add_files([path.as_uri()])  # a concurrent writer commits
        seen.append(list(candidates))
        original(table, candidates, dry_run=dry_run, report=report)

    monkeypatch.setattr(orphans_module, "delete_unreachable", commit_then_delete)
    return seen


def test_grace_period_protects_a_file_committed_after_the_scan(
    catalog: SqlCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = new_table(catalog)
    location = root(table)
    age_everything(location)
    late = parquet_file(location / "data" / "late-writer.parquet", 5000)  # young, unreferenced
    expected = pa.concat_tables([scan_rows(table), batch(5000)])
    seen = commit_before_deleting(monkeypatch, catalog, late)

    result = remove_orphans(table, TABLE, orphan_cutoff(None, NOW_MS))

    assert len(seen) == 1  # the commit happened between the scan and the deletion
    assert result.scan.too_young == 1 and result.scan.orphans == []
    assert late.exists()
    table = catalog.load_table(TABLE)
    assert str(late.as_uri()) in table_references(table).all()
    assert_same_contents(expected, scan_rows(table))
    assert_referenced_files_exist(table)


def test_without_the_grace_period_the_late_commit_would_lose_its_file(
    catalog: SqlCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = new_table(catalog)
    location = root(table)
    late = parquet_file(location / "data" / "late-writer.parquet", 5000)
    # Scanned directly, before the commit: with a cut-off in the future it is an orphan.
    assert [str(local_path(o.location)) for o in find_orphans(table, NOW_MS + DAY_MS).orphans] == [
        str(late)
    ]
    seen = commit_before_deleting(monkeypatch, catalog, late)

    # The same race, dry run: the deletion step is handed the now-committed file.
    result = remove_orphans(
        table, TABLE, NOW_MS + DAY_MS, dry_run=True, allow_short_older_than=True
    )

    assert len(seen) == 1
    assert [str(local_path(ref.location)) for ref in seen[0]] == [str(late)]
    assert reported(result, ORPHAN_DATA) == {str(late)}  # what a real run would have deleted
    table = catalog.load_table(TABLE)
    assert late.as_uri() in table_references(table).all()  # ... although the table reads it
    assert late.exists()


def test_a_file_committed_while_listing_is_seen_as_referenced(
    catalog: SqlCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = new_table(catalog)
    late = parquet_file(root(table) / "data" / "late-writer.parquet", 5000)
    original = orphans_module.list_files

    def list_then_commit(io: Any, location: str) -> Iterator[StoredFile]:
        listed = list(original(io, location))
        catalog.load_table(TABLE).add_files([late.as_uri()])  # lands after the listing
        return iter(listed)

    monkeypatch.setattr(orphans_module, "list_files", list_then_commit)

    # No grace period: only the order (list storage, then read the metadata) protects it.
    result = remove_orphans(table, TABLE, NOW_MS + DAY_MS, allow_short_older_than=True)

    assert result.scan.orphans == [] and result.scan.too_young == 0
    assert late.exists()
    assert late.as_uri() in table_references(catalog.load_table(TABLE)).all()


# --- 8. refusals -----------------------------------------------------------------------------


def test_symlinks_are_refused_and_their_targets_untouched(
    catalog: SqlCatalog, tmp_path: Path
) -> None:
    table = new_table(catalog, appends=1)
    location = root(table)
    outside = tmp_path / "outside"
    target = junk(outside / "target.parquet", 64)
    target_dir_file = junk(outside / "dir" / "inner.parquet", 64)
    link = location / "data" / "link.parquet"
    link.symlink_to(target)
    dir_link = location / "data" / "linked-dir"
    dir_link.symlink_to(outside / "dir", target_is_directory=True)
    age_everything(location)
    set_mtime([link, dir_link], OLD_MS)

    result = remove_orphans(table, TABLE, NOW_MS + DAY_MS, allow_short_older_than=True)

    assert sorted(str(local_path(r)) for r in result.scan.refused) == sorted(
        [str(link), str(dir_link)]
    )
    assert result.to_dict()["files_deleted"] == 0
    assert link.is_symlink() and dir_link.is_symlink()
    assert target.exists() and target_dir_file.exists()
    assert listing(outside) == {str(target): 64, str(target_dir_file): 64}


def test_a_sibling_sharing_the_table_location_prefix_is_never_touched(
    catalog: SqlCatalog,
) -> None:
    table = new_table(catalog, appends=2, identifier="db.events")
    location = root(table)
    assert location.name == "events"
    sibling = location.parent / "events_old"
    sibling_files = {
        junk(sibling / "data" / "old.parquet"),
        junk(sibling / "metadata" / "00000-x.metadata.json"),
        junk(location.parent / "events.parquet"),  # beside the table, not in it
    }
    age_everything(location)
    own_junk = junk(location / "data" / "junk.parquet")
    before = listing(location)

    result = remove_orphans(table, "db.events", NOW_MS + DAY_MS, allow_short_older_than=True)

    assert result.to_dict()["listed_files"] == len(before)
    assert reported(result, ORPHAN_DATA) == {str(own_junk)}
    assert not own_junk.exists()
    assert all(p.exists() for p in sibling_files)
    assert all(
        not str(local_path(o.location)).startswith(str(sibling)) for o in result.scan.orphans
    )


# --- 5. dry run ------------------------------------------------------------------------------

COMPARED = (
    "listed_files",
    "orphan_files",
    "skipped_too_young",
    "refused",
    "refused_outside_table_location",
    "failed",
)


def test_dry_run_changes_nothing_and_predicts_the_real_run(
    catalog: SqlCatalog, tmp_path: Path
) -> None:
    table = new_table(catalog)
    location = root(table)
    age_everything(location)
    junk(location / "data" / "a.parquet", 10)
    junk(location / "data" / "p=1" / "b.parquet", 20)
    junk(location / "metadata" / "c.avro", 30)
    junk(location / "data" / "young.parquet", 40, ms=None)
    (location / "data" / "link").symlink_to(junk(tmp_path / "target", 5))
    before = listing(location)
    ids = {s.snapshot_id for s in table.metadata.snapshots}

    dry = remove_orphans(table, TABLE, orphan_cutoff("3d", NOW_MS), dry_run=True).to_dict()

    assert listing(location) == before
    table = catalog.load_table(TABLE)
    assert {s.snapshot_id for s in table.metadata.snapshots} == ids
    assert dry["dry_run"] is True
    assert sorted(str(local_path(o)) for o in dry["orphans"]) == sorted(
        str(location / p) for p in ("data/a.parquet", "data/p=1/b.parquet", "metadata/c.avro")
    )

    real = remove_orphans(table, TABLE, orphan_cutoff("3d", NOW_MS)).to_dict()

    assert real["dry_run"] is False and real["orphans"] == dry["orphans"]
    assert {key: real[key] for key in COMPARED} == {key: dry[key] for key in COMPARED}
    assert_dry_run_predicts(dry, real)
    assert real["deleted_paths"] == real["orphans"]
    assert real["files_deleted"] == 3 and real["bytes_deleted"] == 60
    assert len(before) - len(listing(location)) == 3


# --- 10. the CLI -----------------------------------------------------------------------------

CLI_TABLE = "db.events"


@pytest.fixture
def cli_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A COMPACTOR_HOME whose embedded catalog holds a small ``db.events``."""
    for name in list(os.environ):
        if name.upper().startswith(("PYICEBERG_", "COMPACTOR_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path))
    create_events_table(embedded(tmp_path), CLI_TABLE, commits=2, rows_per_commit=100, days=1)
    return tmp_path


def test_cli_orphans_dry_run_json(cli_home: Path) -> None:
    location = local_path(embedded(cli_home).load_table(CLI_TABLE).metadata.location)
    junk(location / "data" / "junk.parquet", 1000)
    junk(location / "metadata" / "junk.avro", 500)
    before = listing(cli_home / "warehouse")

    result = compactor(
        cli_home,
        "orphans",
        "--table",
        CLI_TABLE,
        "--older-than",
        "0s",
        "--allow-short-older-than",
        "--dry-run",
        "--json",
    )

    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    assert report["table"] == CLI_TABLE and report["dry_run"] is True
    assert report["orphan_files"] == 2
    assert report["would_delete"] == {
        ORPHAN_DATA: {"files": 1, "bytes": 1000},
        ORPHAN_METADATA: {"files": 1, "bytes": 500},
    }
    assert report["would_delete_files"] == 2 and report["would_delete_bytes"] == 1500
    assert report["files_deleted"] == 0 and report["deleted"] == {}
    assert report["skipped_too_young"] == 0 and report["refused"] == []
    assert sorted(local_path(o).name for o in report["orphans"]) == ["junk.avro", "junk.parquet"]
    assert listing(cli_home / "warehouse") == before


def test_cli_orphans_text_prints_a_summary_and_the_first_paths_unless_list(cli_home: Path) -> None:
    location = local_path(embedded(cli_home).load_table(CLI_TABLE).metadata.location)
    for i in range(25):
        junk(location / "data" / f"junk-{i:02}.parquet", 10)
    args = ("orphans", "--table", CLI_TABLE, "--older-than", "0s", "--allow-short-older-than")

    short = compactor(cli_home, *args, "--dry-run")
    full = compactor(cli_home, *args, "--dry-run", "--list")

    assert short.returncode == 0 and full.returncode == 0, short.stderr + full.stderr
    listed = [line.strip() for line in short.stdout.splitlines() if "junk-" in line]
    assert [local_path(p).name for p in listed] == [f"junk-{i:02}.parquet" for i in range(20)]
    assert "... and 5 more (--list prints them all)" in short.stdout
    every = [line.strip() for line in full.stdout.splitlines() if "junk-" in line]
    assert len(every) == 25 and "more (--list" not in full.stdout


def test_cli_orphans_bad_age_exits_2_with_one_error_line(cli_home: Path) -> None:
    before = listing(cli_home / "warehouse")

    result = compactor(cli_home, "orphans", "--table", CLI_TABLE, "--older-than", "garbage")

    assert_one_error_line(result, 2, "--older-than", "garbage")
    assert listing(cli_home / "warehouse") == before


# --- a sub-path only (Spark's location) -----------------------------------------------------


@pytest.mark.parametrize("spelling", ["relative", "absolute"])
def test_location_sweeps_only_that_sub_path(catalog: SqlCatalog, spelling: str) -> None:
    table = new_table(catalog)
    rows = scan_rows(table)
    location = root(table)
    age_everything(location)
    inside = junk(location / "data" / "x=1" / "junk-1.parquet", 300)
    outside = {
        junk(location / "data" / "x=2" / "junk-2.parquet", 200),
        junk(location / "metadata" / "stray-m0.avro", 150),
    }
    sub = "data/x=1" if spelling == "relative" else f"{table.metadata.location}/data/x=1"

    result = remove_orphans(table, TABLE, orphan_cutoff(None, NOW_MS), location=sub)

    assert reported(result, ORPHAN_DATA) == {str(inside)}
    assert result.to_dict()["listed_files"] == 1
    assert not inside.exists() and all(p.exists() for p in outside)
    table = catalog.load_table(TABLE)
    assert_referenced_files_exist(table)
    assert_same_contents(rows, scan_rows(table))


@pytest.mark.parametrize(
    "where",
    ["../elsewhere", "/tmp", "file:///", "", "."],
    ids=["up", "abs", "root", "empty", "dot"],
)
def test_a_location_outside_the_table_is_refused_and_nothing_is_deleted(
    catalog: SqlCatalog, where: str
) -> None:
    table = new_table(catalog)
    location = root(table)
    age_everything(location)
    junk(location / "data" / "junk-1.parquet", 300)
    before = listing(location)

    with pytest.raises(UsageError, match=r"^table db\.t: location .* is not under the table's"):
        remove_orphans(table, TABLE, orphan_cutoff(None, NOW_MS), location=where)

    assert listing(location) == before


def test_orphans_location_on_the_command_line(tmp_path: Path) -> None:
    home = tmp_path
    table = create_events_table(embedded(home), "db.events", commits=2, rows_per_commit=50)
    location = root(table)
    age_everything(location)
    stray = junk(location / "data" / "stray.parquet", 100)

    outside = compactor(home, "orphans", "--table", "db.events", "--location", "/etc", "--json")
    swept = compactor(
        home, "orphans", "--table", "db.events", "--location", "data", "--dry-run", "--json"
    )

    assert_one_error_line(outside, 2, "db.events", "/etc")
    assert swept.returncode == 0, swept.stderr
    assert json.loads(swept.stdout)["orphans"] == [f"{table.metadata.location}/data/stray.parquet"]
    assert stray.exists()
