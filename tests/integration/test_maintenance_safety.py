"""``expire`` and ``orphans`` never delete what another table, a ref or a run still needs.

One or more tests per defect of issue 9 ("Never lose a row, never break a reader"), named
``test_<number>_...`` after it:

5. ``gc.enabled=false`` forbids deleting any file (CLI, library and daemon).
6. Another table's location nested inside a table's, a location shared with another table, and
   the warehouse root.
8. A branch or tag created while an expiry runs survives it, with its files.
10. Files listed in a run record are never orphans; a short ``--older-than`` needs a flag.
11. Statistics files the table metadata lists are never deleted.

File ages are set with ``os.utime``; cut-offs are explicit, computed from one ``now``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table
from pyiceberg.table.statistics import PartitionStatisticsFile, StatisticsFile
from pyiceberg.table.update import AssertTableUUID, SetPartitionStatisticsUpdate

import compactor.maintain.expire as expire_module
from compactor.commit.inflight import RunLease
from compactor.daemon.jobfiles import load_job
from compactor.errors import CommitConflictError, ConfigError, UsageError
from compactor.iceberg.references import table_references
from compactor.maintain.expire import RetentionPolicy, expire_snapshots
from compactor.maintain.orphans import orphan_cutoff, remove_orphans

from support.aged_files import NOW_MS, SCHEMA, age_everything, batch, junk, listing, root, set_mtime
from support.cli import assert_one_error_line, compactor, embedded
from support.daemon import Setup
from support.java_reader import assert_java_reads_same
from support.rows import assert_same_rows, scan_rows
from support.tables import local_path

# The ``setup`` fixture: a catalog, a job directory and a daemon's environment.
pytest_plugins = ("support.daemon",)


def new_table(
    catalog: Catalog, identifier: str, appends: int = 3, location: Path | None = None
) -> Table:
    table = catalog.create_table(
        identifier, SCHEMA, location=location.as_uri() if location else None
    )
    for i in range(appends):
        table.append(batch(100 * i))
    return table


def same_rows(expected: pa.Table, table: Table, snapshot_id: int | None = None) -> None:
    """``table`` (at ``snapshot_id``) reads exactly ``expected``, with every file it needs."""
    found = table.scan(snapshot_id=snapshot_id).to_arrow() if snapshot_id else scan_rows(table)
    assert_same_rows(expected, found.cast(expected.schema))
    missing = [loc for loc in table_references(table).all() if not local_path(loc).exists()]
    assert not missing, missing


def snapshot_ids(table: Table) -> list[int]:
    return [s.snapshot_id for s in table.metadata.snapshots]


def after_every_snapshot(table: Table) -> Callable[[], float]:
    """A clock one second after the newest snapshot (a ``0s`` cut-off expires them all)."""
    now_ms = max(s.timestamp_ms for s in table.metadata.snapshots) + 1000
    return lambda: now_ms / 1000


def expire_all_but_current(table: Table, identifier: str) -> expire_module.ExpireResult:
    clock = after_every_snapshot(table)
    policy = RetentionPolicy(older_than_ms=int(clock() * 1000), retain_last=1, max_ref_age_ms=None)
    return expire_snapshots(table, identifier, policy, clock=clock)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A COMPACTOR_HOME whose embedded catalog (warehouse ``home/warehouse``) has namespace db."""
    for name in list(os.environ):
        if name.upper().startswith(("PYICEBERG_", "COMPACTOR_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path))
    embedded(tmp_path).create_namespace("db")
    return tmp_path


def registered_copy(catalog: Catalog, original: Table, identifier: str) -> Table:
    """``identifier`` registered from ``original``'s current metadata: same location, same files."""
    return catalog.register_table(identifier, original.metadata_location)


# --- 5. gc.enabled=false ---------------------------------------------------------------------


def test_5_gc_disabled_copy_refuses_orphans_and_expire_and_deletes_nothing(home: Path) -> None:
    catalog = embedded(home)
    original = new_table(catalog, "db.orig")
    copy = registered_copy(catalog, original, "db.copy")
    with copy.transaction() as tx:
        tx.set_properties({"gc.enabled": "false"})
    original.append(batch(1000))  # files and metadata the copy knows nothing of
    rows = scan_rows(original)
    age_everything(home / "warehouse")
    before = listing(home / "warehouse")

    swept = compactor(home, "orphans", "--table", "db.copy")
    expired = compactor(home, "expire", "--table", "db.copy", "--older-than", "0s")

    for result in (swept, expired):
        assert_one_error_line(result, 2, "db.copy", "gc.enabled=false")
    assert listing(home / "warehouse") == before
    original = catalog.load_table("db.orig")
    assert local_path(original.metadata_location).exists()
    same_rows(rows, original)
    copy = catalog.load_table("db.copy")
    assert len(copy.metadata.snapshots) == 3
    # The library refuses as well, a dry run included.
    with pytest.raises(ConfigError, match="db.copy: cannot expire snapshots: gc.enabled=false"):
        expire_all_but_current(copy, "db.copy")
    with pytest.raises(ConfigError, match="db.copy: cannot remove orphan files: gc.enabled=false"):
        remove_orphans(copy, "db.copy", orphan_cutoff(None, NOW_MS), dry_run=True)


def test_5_the_daemon_skips_expiry_and_sweeps_of_a_gc_disabled_table(
    setup: Setup,
) -> None:
    table = new_table(setup.catalog, "db.nogc", appends=4)
    with table.transaction() as tx:
        tx.set_properties({"gc.enabled": "FALSE"})
    junk(root(table) / "data" / "stray.parquet")
    age_everything(root(table))
    before = listing(root(table))
    setup.job(
        "reclaim",
        'tables = ["db.*"]\n\n[expire]\nevery = "1s"\nolder_than = "0s"\non_table_globs = true\n\n'
        '[orphans]\nevery = "1s"\non_table_globs = true\n',
    )
    daemon = setup.start()
    try:
        runs = {action: daemon.run_finished("db.nogc", action) for action in ("expire", "orphans")}
    finally:
        assert daemon.terminate() == 0, "".join(daemon.lines)

    for action, run in runs.items():
        assert run["outcome"] == "skipped", (action, run)
        assert "gc.enabled=FALSE" in run["error"] and "db.nogc" in run["error"]
        assert run["input_files"] == 0
    assert listing(root(table)) == before
    assert len(setup.catalog.load_table("db.nogc").metadata.snapshots) == 4


# --- 6. other tables' locations --------------------------------------------------------------


def test_6_orphans_never_enter_a_nested_tables_location(home: Path) -> None:
    catalog = embedded(home)
    shared = home / "warehouse" / "shared"
    parent = new_table(catalog, "db.parent", location=shared)
    child = new_table(catalog, "db.child", location=shared / "child")
    # Only the catalog knows this one's data lies inside the parent: its metadata is elsewhere.
    sidecar = catalog.create_table(
        "db.sidecar",
        SCHEMA,
        location=(home / "warehouse" / "sidecar").as_uri(),
        properties={"write.data.path": (shared / "sidecar-data").as_uri()},
    )
    sidecar.append(batch(500))
    # And only storage knows of this one: another catalog's table.
    other_catalog = SqlCatalog(
        "other", uri=f"sqlite:///{home}/other.db", warehouse=(home / "other").as_uri()
    )
    other_catalog.create_namespace("db")
    foreign = new_table(other_catalog, "db.foreign", appends=1, location=shared / "foreign")
    contents = {
        name: scan_rows(t)
        for name, t in {"db.parent": parent, "db.child": child, "db.sidecar": sidecar}.items()
    }
    foreign_rows = scan_rows(foreign)
    own_junk = junk(shared / "data" / "junk.parquet")
    age_everything(home / "warehouse")
    others_before = {
        path: size
        for path, size in listing(shared).items()
        if path.startswith(
            (str(shared / "child"), str(shared / "sidecar-data"), str(shared / "foreign"))
        )
    }

    result = compactor(home, "orphans", "--table", "db.parent", "--json")

    assert result.returncode == 0, result.stderr
    after = listing(shared)
    assert {path: after.get(path) for path in others_before} == others_before
    assert not own_junk.exists()
    report: dict[str, Any] = json.loads(result.stdout)
    assert report["files_deleted"] == 1
    assert set(report["skipped_other_tables"]) == {
        "db.child",
        "db.sidecar",
        f"a table at file://{shared / 'foreign'}",
    }
    assert sum(report["skipped_other_tables"].values()) == len(others_before)
    for name, expected in contents.items():
        same_rows(expected, catalog.load_table(name))
        assert_java_reads_same(catalog.load_table(name))
    same_rows(foreign_rows, other_catalog.load_table("db.foreign"))


def test_6_orphans_refuse_the_warehouse_root_and_a_location_shared_with_another_table(
    home: Path,
) -> None:
    catalog = embedded(home)
    warehouse = home / "warehouse"
    other = new_table(catalog, "db.other")
    at_root = new_table(catalog, "db.at_root", appends=1, location=warehouse)
    original = new_table(catalog, "db.original")
    copy = registered_copy(catalog, original, "db.copy")  # GC enabled on both
    copy.append(batch(2000))  # files only the copy references, in the original's location
    rows = {
        name: scan_rows(t)
        for name, t in {
            "db.other": other,
            "db.at_root": at_root,
            "db.original": original,
            "db.copy": copy,
        }.items()
    }
    age_everything(warehouse)
    before = listing(warehouse)

    at_root_swept = compactor(home, "orphans", "--table", "db.at_root")
    original_swept = compactor(home, "orphans", "--table", "db.original")
    original_expired = compactor(home, "expire", "--table", "db.original", "--older-than", "0s")

    assert_one_error_line(at_root_swept, 2, "db.at_root", "warehouse")
    assert_one_error_line(original_swept, 2, "db.original", "db.copy")
    assert_one_error_line(original_expired, 2, "db.original", "db.copy")
    assert listing(warehouse) == before
    for name, expected in rows.items():
        same_rows(expected, catalog.load_table(name))


def test_6_expire_never_deletes_a_file_under_a_nested_tables_location(home: Path) -> None:
    catalog = embedded(home)
    shared = home / "warehouse" / "shared"
    parent = new_table(catalog, "db.parent", appends=1, location=shared)
    child = new_table(catalog, "db.child", appends=1, location=shared / "child")
    # A file of the child's that the parent imported too.
    imported = shared / "child" / "data" / "imported.parquet"
    pq.write_table(batch(7000), imported)
    child.add_files([imported.as_uri()])
    parent.add_files([imported.as_uri()])
    parent.overwrite(batch(8000))  # the parent's current snapshot no longer reads it
    child_rows = scan_rows(child)

    result = compactor(home, "expire", "--table", "db.parent", "--older-than", "0s", "--json")

    assert result.returncode == 0, result.stderr
    assert imported.exists()
    same_rows(child_rows, catalog.load_table("db.child"))
    report: dict[str, Any] = json.loads(result.stdout)
    assert report["snapshots_expired"] == 3  # append, add_files, the overwrite's delete
    assert report["refused_other_table_locations"] == 1
    assert report["deleted"]["data_files"]["files"] == 1  # the parent's own first append
    same_rows(batch(8000), catalog.load_table("db.parent"))


# --- 8. refs created while an expiry runs ----------------------------------------------------


def commit_first(
    monkeypatch: pytest.MonkeyPatch, catalog: Catalog, before_commit: Callable[[], None]
) -> list[int]:
    """Run ``before_commit`` (a concurrent writer) just before the catalog's first commit."""
    original = catalog.commit_table
    calls: list[int] = []

    def commit(table: Table, requirements: Any, updates: Any) -> Any:
        calls.append(len(calls))
        if len(calls) == 1:
            before_commit()
        return original(table, requirements, updates)

    monkeypatch.setattr(catalog, "commit_table", commit)
    return calls


@pytest.mark.parametrize("kind", ["tag", "branch"])
def test_8_expire_keeps_a_tag_or_branch_created_while_it_runs(
    catalog: SqlCatalog, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    table = new_table(catalog, "db.t")
    m1, m2, m3 = snapshot_ids(table)
    target = m1 if kind == "tag" else m2  # both would be expired by the plan
    contents = {sid: table.scan(snapshot_id=sid).to_arrow() for sid in (m1, m2, m3)}
    files = set(table_references(table, [table.metadata.snapshot_by_id(target)]).all())

    def create_ref() -> None:
        manage = catalog.load_table("db.t").manage_snapshots()
        if kind == "tag":
            manage.create_tag(target, "late").commit()
        else:
            manage.create_branch(target, "late").commit()

    commit_first(monkeypatch, catalog, create_ref)

    result = expire_all_but_current(table, "db.t")

    table = catalog.load_table("db.t")
    assert "late" in table.metadata.refs
    assert table.metadata.refs["late"].snapshot_id == target
    assert target not in result.plan.expire
    assert all(local_path(f).exists() for f in files)
    same_rows(contents[target], table, table.metadata.refs["late"].snapshot_id)
    same_rows(contents[m3], table)
    assert m3 in snapshot_ids(table)
    assert assert_java_reads_same(table).refs["late"].snapshot_id == target


def test_8_a_ref_the_catalog_could_not_guard_keeps_its_files(
    catalog: SqlCatalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a catalog that cannot assert "no new ref" (REST), a dropped ref stops all deletion."""
    monkeypatch.setattr(
        expire_module, "_checks_requirements_in_process", lambda _catalog: False, raising=False
    )
    table = new_table(catalog, "db.t")
    m1, _, _ = snapshot_ids(table)
    before = listing(root(table))
    commit_first(
        monkeypatch,
        catalog,
        lambda: catalog.load_table("db.t").manage_snapshots().create_tag(m1, "late").commit(),
    )

    with pytest.raises(CommitConflictError, match="late") as raised:
        expire_all_but_current(table, "db.t")

    assert "no files were deleted" in str(raised.value)
    after = listing(root(table))
    assert set(before) <= set(after)  # only the commits' metadata files were added


# --- 10. run records and the age floor -------------------------------------------------------


def test_10_orphans_keep_every_file_a_run_record_lists_live_or_abandoned(
    catalog: SqlCatalog,
) -> None:
    table = new_table(catalog, "db.t")
    location = root(table)
    lease = RunLease(table, "run-1", ttl_s=3600)
    lease.acquire()
    try:
        outputs = [f"{table.metadata.location}/data/run-1-output-{i}.parquet" for i in range(2)]
        lease.add_files(outputs)
        for output in outputs:
            junk(local_path(output))  # written, not committed yet
        stray = junk(location / "data" / "stray.parquet")
        age_everything(location)

        live = remove_orphans(table, "db.t", orphan_cutoff(None, NOW_MS))

        assert all(local_path(o).exists() for o in outputs)
        assert not stray.exists()
        assert live.to_dict()["skipped_in_run_record"] == 2
    finally:
        lease.abandon()  # a killed run: its record stays, expired
    second_stray = junk(location / "data" / "stray-2.parquet")
    age_everything(location)

    abandoned = remove_orphans(table, "db.t", orphan_cutoff(None, NOW_MS))

    assert all(local_path(o).exists() for o in outputs)
    assert not second_stray.exists()
    assert abandoned.to_dict()["skipped_in_run_record"] == 2
    assert abandoned.to_dict()["files_deleted"] == 1


def test_10_a_short_older_than_needs_the_explicit_flag(home: Path) -> None:
    catalog = embedded(home)
    table = new_table(catalog, "db.events", appends=2)
    location = root(table)
    recent = junk(location / "data" / "recent.parquet")
    set_mtime([recent], NOW_MS - 2 * 3_600_000)  # two hours old
    before = listing(location)

    for older_than in ("0s", "1h", "23h"):
        refused = compactor(home, "orphans", "--table", "db.events", "--older-than", older_than)
        assert_one_error_line(refused, 2, f"--older-than {older_than}", "--allow-short-older-than")
    assert listing(location) == before
    with pytest.raises(UsageError, match="allow_short_older_than"):
        remove_orphans(table, "db.events", NOW_MS)
    assert listing(location) == before

    allowed = compactor(
        home, "orphans", "--table", "db.events", "--older-than", "1h", "--allow-short-older-than"
    )

    assert allowed.returncode == 0, allowed.stderr
    assert not recent.exists()
    assert set(before) - set(listing(location)) == {str(recent)}


def test_10_job_files_refuse_a_short_older_than_without_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "sweep.toml"
    path.write_text('tables = ["db.*"]\n\n[orphans]\nevery = "1h"\nolder_than = "2h"\n')

    with pytest.raises(ConfigError, match="allow_short_older_than") as raised:
        load_job(path)

    assert str(raised.value).startswith(f"{path}:5: orphans.older_than: '2h'")
    path.write_text(
        'tables = ["db.*"]\n\n[orphans]\nevery = "1h"\nolder_than = "2h"\n'
        "allow_short_older_than = true\non_table_globs = true\n"
    )
    assert load_job(path).spec.orphans is not None


# --- 11. statistics files --------------------------------------------------------------------


def register_statistics(table: Table, snapshot_id: int, *, partition: bool) -> Path:
    """Write a (dummy) statistics file for ``snapshot_id`` and list it in the table metadata."""
    kind = "partition-stats" if partition else "stats"
    path = root(table) / "metadata" / f"{kind}-{snapshot_id}.puffin"
    path.write_bytes(b"PFA1" + b"s" * 60)
    size = path.stat().st_size
    if partition:
        update = SetPartitionStatisticsUpdate(
            partition_statistics=PartitionStatisticsFile(
                snapshot_id=snapshot_id, statistics_path=path.as_uri(), file_size_in_bytes=size
            )
        )
        table.catalog.commit_table(
            table, (AssertTableUUID(uuid=table.metadata.table_uuid),), (update,)
        )
        table.refresh()
    else:
        stats = StatisticsFile(
            snapshot_id=snapshot_id,
            statistics_path=path.as_uri(),
            file_size_in_bytes=size,
            file_footer_size_in_bytes=0,
            blob_metadata=[],
        )
        table.update_statistics().set_statistics(stats).commit()
    return path


def listed_statistics(table: Table) -> set[Path]:
    metadata = table.metadata
    return {
        local_path(s.statistics_path)
        for s in [*metadata.statistics, *metadata.partition_statistics]
    }


def test_11_expire_never_deletes_statistics_files_the_metadata_still_lists(
    catalog: SqlCatalog,
) -> None:
    table = new_table(catalog, "db.t")
    m1, _, m3 = snapshot_ids(table)
    expired_files = {register_statistics(table, m1, partition=p) for p in (False, True)}
    kept_files = {register_statistics(table, m3, partition=p) for p in (False, True)}
    # An entry for a snapshot the table no longer has: still listed, so still not garbage.
    stale = register_statistics(table, 424242, partition=True)
    rows = scan_rows(table)

    result = expire_all_but_current(table, "db.t")

    table = catalog.load_table("db.t")
    assert snapshot_ids(table) == [m3]
    listed = listed_statistics(table)
    assert all(path.exists() for path in listed), [p for p in listed if not p.exists()]
    # As in Java: the expired snapshot's entries leave the metadata, then their files go.
    assert listed == kept_files | {stale}
    assert not any(path.exists() for path in expired_files)
    assert result.to_dict()["deleted"]["statistics"]["files"] == 2
    same_rows(rows, table)

    age_everything(root(table))
    swept = remove_orphans(table, "db.t", orphan_cutoff(None, NOW_MS))

    assert swept.to_dict()["files_deleted"] == 0
    assert all(path.exists() for path in listed_statistics(catalog.load_table("db.t")))
