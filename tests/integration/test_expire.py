"""``compactor expire``: which snapshots go (Java RemoveSnapshots rules), and which files with them.

Time is never waited for: snapshot timestamps come from commit time, so every cut-off and every
``clock`` below is computed from the snapshots' actual timestamps.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table, TableProperties
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.types import LongType, NestedField, StringType

from compactor.bench.sample import create_events_table
from compactor.durations import DAY_MS
from compactor.errors import ConfigError, UsageError
from compactor.iceberg.references import table_references
from compactor.maintain.expire import (
    DEFAULT_MAX_SNAPSHOT_AGE_MS,
    MAX_REF_AGE_PROPERTY,
    MAX_SNAPSHOT_AGE_PROPERTY,
    METADATA_KIND,
    MIN_SNAPSHOTS_PROPERTY,
    ExpireResult,
    RetentionPolicy,
    expire_snapshots,
    retention_policy,
)
from compactor.maintain.orphans import remove_orphans

from support.cli import assert_one_error_line, compactor, embedded
from support.java_reader import assert_java_reads_same
from support.rows import assert_same_rows, scan_rows
from support.runs import assert_dry_run_predicts, run_compaction
from support.tables import local_path, unreferenced_files

TABLE = "db.t"
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "v", StringType(), required=False),
)


# --- building tables -------------------------------------------------------------------------


def batch(start: int, rows: int = 50) -> pa.Table:
    ids = range(start, start + rows)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "v": pa.array([f"row-{i}-" + "x" * (i % 40) for i in ids], pa.string()),
        }
    )


def new_table(catalog: Catalog, properties: dict[str, str] | None = None) -> Table:
    return catalog.create_table(TABLE, SCHEMA, properties=properties or {})


def append(table: Table, start: int, branch: str = MAIN_BRANCH) -> int:
    """Append one batch to ``branch``; the new head's snapshot id."""
    table.append(batch(start), branch=branch)
    snapshot = table.metadata.snapshot_by_name(branch)
    assert snapshot is not None
    return snapshot.snapshot_id


def set_retention(table: Table, branch: str, **retention: int) -> None:
    """Give ``branch`` its own retention (pyiceberg forgets it when it writes to the branch)."""
    head = table.metadata.refs[branch].snapshot_id
    table.manage_snapshots().create_branch(head, branch, **retention).commit()
    ref = table.metadata.refs[branch]
    assert {name: getattr(ref, name) for name in retention} == retention


def timestamps(table: Table) -> dict[int, int]:
    return {s.snapshot_id: s.timestamp_ms for s in table.metadata.snapshots}


def snapshot_ids(table: Table) -> set[int]:
    return {s.snapshot_id for s in table.metadata.snapshots}


def after_every_snapshot(table: Table) -> Callable[[], float]:
    """A clock one second after the newest snapshot (so a ``0s`` cut-off expires them all)."""
    now_ms = max(timestamps(table).values()) + 1000
    return lambda: now_ms / 1000


def policy(
    cutoff_ms: int, retain_last: int = 1, max_ref_age_ms: int | None = None
) -> RetentionPolicy:
    return RetentionPolicy(
        older_than_ms=cutoff_ms, retain_last=retain_last, max_ref_age_ms=max_ref_age_ms
    )


def disk_files(table: Table) -> dict[str, int]:
    """Absolute path -> size of every file under the table's location."""
    root = local_path(table.metadata.location)
    return {str(p): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def snapshot_contents(table: Table) -> dict[int, pa.Table]:
    return {sid: table.scan(snapshot_id=sid).to_arrow() for sid in sorted(snapshot_ids(table))}


def assert_reachable_files_exist(table: Table) -> None:
    """Every file any snapshot of ``table`` can reach is on disk, and so is its metadata.json."""
    missing = [loc for loc in table_references(table).all() if not local_path(loc).exists()]
    assert not missing, missing
    assert local_path(table.metadata_location).exists()


def assert_same_contents(before: pa.Table, after: pa.Table) -> None:
    """Same rows; pyiceberg reads ``string`` columns as ``large_string`` from some files."""
    assert_same_rows(before, after.cast(before.schema))


def deleted_paths(result: ExpireResult) -> dict[str, int]:
    """Local path -> size of every file the run reports deleted."""
    return {
        str(local_path(ref.location)): ref.size or 0
        for refs in result.report.by_kind.values()
        for ref in refs
    }


# --- 1. bytes fall, contents stay ------------------------------------------------------------


def test_expiry_after_compaction_frees_bytes_and_keeps_contents(catalog: SqlCatalog) -> None:
    table = new_table(catalog)
    for commit in range(8):
        append(table, commit * 50)
    rows = scan_rows(table)
    bytes_before = sum(disk_files(table).values())

    _, table = run_compaction(catalog, TABLE)
    current = table.metadata.current_snapshot_id
    assert len(table.metadata.snapshots) == 9
    before_expiry = disk_files(table)

    clock = after_every_snapshot(table)
    rules = retention_policy(table, TABLE, "0s", 1, int(clock() * 1000))

    result = expire_snapshots(table, TABLE, rules, clock=clock)

    table = catalog.load_table(TABLE)
    assert snapshot_ids(table) == {current}
    assert result.to_dict()["snapshots_expired"] == 8
    after = disk_files(table)
    assert sum(after.values()) < bytes_before
    assert sum(after.values()) < sum(before_expiry.values())
    assert_same_contents(rows, scan_rows(table))
    # What vanished from disk is exactly what the report lists, with the sizes it reports.
    vanished = {path: size for path, size in before_expiry.items() if path not in after}
    assert vanished == deleted_paths(result)
    summary = result.to_dict()
    assert summary["files_deleted"] == len(vanished)
    assert summary["bytes_deleted"] == sum(vanished.values())
    assert summary["deleted"]["data_files"]["files"] == 8
    assert summary["deleted"]["manifest_lists"]["files"] == 8
    assert summary["deleted"]["manifests"]["files"] >= 8
    assert unreferenced_files(table) == []
    assert_reachable_files_exist(table)
    assert_java_reads_same(table)


# --- 2. time travel to everything retained ---------------------------------------------------


def test_branches_tags_and_their_retention_survive_expiry_and_orphan_removal(
    catalog: SqlCatalog,
) -> None:
    table = new_table(catalog)
    m1 = append(table, 0)
    m2 = append(table, 100)
    m3 = append(table, 200)
    table.manage_snapshots().create_tag(m1, "v1").commit()
    table.manage_snapshots().create_branch(m2, "b").commit()
    b1, b2, b3, b4 = (append(table, 1000 + 100 * i, branch="b") for i in range(4))
    # Branch b keeps its last three snapshots whatever the cut-off.
    set_retention(table, "b", min_snapshots_to_keep=3)
    table.manage_snapshots().create_branch(m3, "c").commit()
    c1 = append(table, 2000, branch="c")
    # A branch removed again leaves its snapshot unreferenced.
    table.manage_snapshots().create_branch(m3, "tmp").commit()
    t1 = append(table, 3000, branch="tmp")
    table.manage_snapshots().remove_branch("tmp").commit()
    m4 = append(table, 300)
    m5 = append(table, 400)
    _, table = run_compaction(catalog, TABLE)
    m6 = table.metadata.current_snapshot_id
    assert m6 is not None and m6 != m5
    table.manage_snapshots().create_tag(m6, "compacted").commit()
    every = {m1, m2, m3, m4, m5, m6, b1, b2, b3, b4, c1, t1}
    assert snapshot_ids(table) == every
    ts = timestamps(table)
    assert len(set(ts.values())) == len(every)  # cut-offs can fall between them
    clock = after_every_snapshot(table)
    now_ms = int(clock() * 1000)
    # Branch c keeps the history since m3: c1 and m3 are young enough for it, m2 is not.
    set_retention(table, "c", max_snapshot_age_ms=now_ms - ts[m3])

    contents = snapshot_contents(table)
    refs = {name: ref.snapshot_id for name, ref in table.metadata.refs.items()}
    assert refs == {MAIN_BRANCH: m6, "v1": m1, "b": b4, "c": c1, "compacted": m6}

    # A table-wide cut-off after every snapshot: only what the rules protect stays.
    result = expire_snapshots(table, TABLE, policy(now_ms), clock=clock)

    # main: its head m6 (retain_last 1); compacted: m6; v1: m1 (nothing else keeps it);
    # b: b4, b3, b2 (min_snapshots_to_keep=3); c: c1, m3 (its max_snapshot_age_ms).
    # m4, m5 (main beyond retain_last), m2 (older than c's age, beyond b's three), b1
    # (beyond b's three) and t1 (unreferenced and old) go.
    kept = {m6, m1, b4, b3, b2, c1, m3}
    expired = {m2, m4, m5, b1, t1}
    assert set(result.plan.expire) == expired
    assert result.plan.retain == kept
    assert result.plan.remove_refs == []
    table = catalog.load_table(TABLE)
    assert snapshot_ids(table) == kept
    assert {name: ref.snapshot_id for name, ref in table.metadata.refs.items()} == refs
    # Only m4's, m5's (compacted since) and t1's data files: m3 and b2 still read m2's and b1's.
    assert result.to_dict()["deleted"]["data_files"]["files"] == 3

    future = int(clock() * 1000) + DAY_MS
    orphans = remove_orphans(table, TABLE, future, allow_short_older_than=True)
    assert orphans.to_dict()["orphan_files"] == 0  # expiry left nothing behind
    table = catalog.load_table(TABLE)
    assert snapshot_ids(table) == kept

    assert_reachable_files_exist(table)
    for snapshot_id in kept:
        assert_same_contents(contents[snapshot_id], table.scan(snapshot_id=snapshot_id).to_arrow())
    for name, snapshot_id in refs.items():
        ref = table.metadata.refs[name]
        assert ref.snapshot_id == snapshot_id
        assert_same_contents(
            contents[snapshot_id], table.scan(snapshot_id=ref.snapshot_id).to_arrow()
        )
    assert unreferenced_files(table) == []
    # Iceberg Java reads every retained snapshot, branch and tag after expiry and the sweep.
    java = assert_java_reads_same(table)
    assert set(java.refs) == set(refs)


def test_main_keeps_its_own_retention_through_compaction(catalog: SqlCatalog) -> None:
    table = new_table(catalog)
    m1, m2, m3 = (append(table, 100 * i) for i in range(3))
    set_retention(table, MAIN_BRANCH, min_snapshots_to_keep=2)

    _, table = run_compaction(catalog, TABLE)

    m4 = table.metadata.current_snapshot_id
    assert m4 not in (None, m3)
    assert table.metadata.refs[MAIN_BRANCH].min_snapshots_to_keep == 2
    clock = after_every_snapshot(table)
    result = expire_snapshots(table, TABLE, policy(int(clock() * 1000)), clock=clock)
    assert set(result.plan.expire) == {m1, m2}
    assert snapshot_ids(catalog.load_table(TABLE)) == {m3, m4}


def test_a_branch_age_shorter_than_the_table_wide_one_expires_its_ancestors(
    catalog: SqlCatalog,
) -> None:
    table = new_table(catalog)
    m1, m2, m3 = (append(table, 100 * i) for i in range(3))
    now_ms = timestamps(table)[m3] + 1000
    set_retention(table, MAIN_BRANCH, max_snapshot_age_ms=1000)  # m3 is exactly that old
    rules = retention_policy(table, TABLE, None, None, now_ms)
    assert rules.older_than_ms == now_ms - DEFAULT_MAX_SNAPSHOT_AGE_MS  # m1, m2 young for it

    result = expire_snapshots(table, TABLE, rules, clock=lambda: now_ms / 1000)

    # Ancestors of a branch follow the branch's rules, not the rule for unreferenced snapshots.
    assert set(result.plan.expire) == {m1, m2}
    assert snapshot_ids(catalog.load_table(TABLE)) == {m3}


# --- 3. ref ages -----------------------------------------------------------------------------


def test_refs_older_than_their_max_ref_age_are_removed_but_main_never(
    catalog: SqlCatalog,
) -> None:
    table = new_table(catalog, {MAX_REF_AGE_PROPERTY: "5000"})
    m1 = append(table, 0)
    m2 = append(table, 100)
    m3 = append(table, 200)
    (
        table.manage_snapshots()
        .create_tag(m2, "t_old", max_ref_age_ms=5000)
        .create_tag(m1, "t_keep", max_ref_age_ms=DAY_MS)
        .create_tag(m1, "t_prop")  # no age of its own: the table property applies
        .create_branch(m1, "b_old")
        .create_branch(m1, "b_keep", max_ref_age_ms=DAY_MS)
        .commit()
    )
    b1 = append(table, 1000, branch="b_old")
    set_retention(table, "b_old", max_ref_age_ms=5000)
    b_keep = table.metadata.refs["b_keep"].snapshot_id
    b1_files = set(table_references(table, [table.metadata.snapshot_by_id(b1)]).all())
    # Ten seconds after the newest snapshot: every ref is older than 5 s, none older than a day.
    now_ms = max(timestamps(table).values()) + 10_000
    rules = retention_policy(table, TABLE, "0s", None, now_ms)
    assert rules == RetentionPolicy(now_ms, 1, 5000)

    result = expire_snapshots(table, TABLE, rules, clock=lambda: now_ms / 1000)

    assert result.plan.remove_refs == ["b_old", "t_old", "t_prop"]
    assert result.to_dict()["refs_removed"] == ["b_old", "t_old", "t_prop"]
    # main keeps its head although it too is older than 5 s; t_keep and b_keep keep m1.
    assert set(result.plan.expire) == {m2, b1}
    table = catalog.load_table(TABLE)
    assert set(table.metadata.refs) == {MAIN_BRANCH, "t_keep", "b_keep"}
    assert table.metadata.refs[MAIN_BRANCH].snapshot_id == m3
    assert b_keep == m1
    assert snapshot_ids(table) == {m1, m3}
    b1_only = {f for f in b1_files if f not in table_references(table).all()}
    assert b1_only and not any(local_path(f).exists() for f in b1_only)
    assert_reachable_files_exist(table)


def test_young_unreferenced_snapshots_stay_and_ref_removal_alone_commits(
    catalog: SqlCatalog,
) -> None:
    table = new_table(catalog)
    m1 = append(table, 0)
    table.manage_snapshots().create_branch(m1, "old").commit()
    o1 = append(table, 100, branch="old")
    set_retention(table, "old", max_ref_age_ms=1)
    m2 = append(table, 200)
    now_ms = max(timestamps(table).values()) + 1000
    # A cut-off before every snapshot: nothing is old, but the branch is past its age.
    cutoff = min(timestamps(table).values()) - 1

    result = expire_snapshots(table, TABLE, policy(cutoff), clock=lambda: now_ms / 1000)

    assert result.plan.remove_refs == ["old"]
    assert result.plan.expire == []
    table = catalog.load_table(TABLE)
    assert set(table.metadata.refs) == {MAIN_BRANCH}
    assert snapshot_ids(table) == {m1, o1, m2}  # o1: unreferenced now, but young
    assert result.to_dict()["files_deleted"] == 0
    assert_reachable_files_exist(table)


# --- 4. table properties when no flag is given -----------------------------------------------


def test_table_properties_apply_when_no_flag_is_given(catalog: SqlCatalog) -> None:
    table = new_table(catalog)
    ids = [append(table, 100 * i) for i in range(5)]
    ts = timestamps(table)
    now_ms = max(ts.values()) + 1000

    defaults = retention_policy(table, TABLE, None, None, now_ms)
    assert defaults == RetentionPolicy(now_ms - DEFAULT_MAX_SNAPSHOT_AGE_MS, 1, None)
    assert (
        expire_snapshots(
            table, TABLE, defaults, dry_run=True, clock=lambda: now_ms / 1000
        ).plan.expire
        == []
    )

    # min-snapshots-to-keep alone decides when every snapshot is older than max-snapshot-age.
    with table.transaction() as tx:
        tx.set_properties({MIN_SNAPSHOTS_PROPERTY: "3", MAX_SNAPSHOT_AGE_PROPERTY: "1"})
    rules = retention_policy(table, TABLE, None, None, now_ms)
    assert rules == RetentionPolicy(now_ms - 1, 3, None)
    dry = expire_snapshots(table, TABLE, rules, dry_run=True, clock=lambda: now_ms / 1000)
    assert dry.plan.expire == sorted(ids[:2])
    assert snapshot_ids(table) == set(ids)

    # Flags win over the properties.
    flags = retention_policy(table, TABLE, "0s", 1, now_ms)
    assert flags == RetentionPolicy(now_ms, 1, None)
    dry = expire_snapshots(table, TABLE, flags, dry_run=True, clock=lambda: now_ms / 1000)
    assert dry.plan.expire == sorted(ids[:4])

    # max-snapshot-age-ms keeps everything at least as young as the second snapshot.
    with table.transaction() as tx:
        tx.set_properties(
            {MIN_SNAPSHOTS_PROPERTY: "1", MAX_SNAPSHOT_AGE_PROPERTY: str(now_ms - ts[ids[1]])}
        )
    rules = retention_policy(table, TABLE, None, None, now_ms)
    assert rules == RetentionPolicy(ts[ids[1]], 1, None)

    result = expire_snapshots(table, TABLE, rules, clock=lambda: now_ms / 1000)

    assert result.plan.expire == [ids[0]]
    assert snapshot_ids(catalog.load_table(TABLE)) == set(ids[1:])


@pytest.mark.parametrize(
    ("properties", "message"),
    [
        ({MAX_SNAPSHOT_AGE_PROPERTY: "five days"}, MAX_SNAPSHOT_AGE_PROPERTY),
        ({MIN_SNAPSHOTS_PROPERTY: "0"}, MIN_SNAPSHOTS_PROPERTY),
        ({MAX_REF_AGE_PROPERTY: "-1"}, MAX_REF_AGE_PROPERTY),
    ],
)
def test_bad_retention_properties_are_config_errors(
    catalog: SqlCatalog, properties: dict[str, str], message: str
) -> None:
    table = new_table(catalog, properties)
    with pytest.raises(ConfigError, match=message):
        retention_policy(table, TABLE, None, None, 0)


def test_retain_last_below_one_is_a_usage_error(catalog: SqlCatalog) -> None:
    table = new_table(catalog)
    with pytest.raises(UsageError, match="--retain-last"):
        retention_policy(table, TABLE, "1d", 0, 0)
    with pytest.raises(UsageError, match="--older-than"):
        retention_policy(table, TABLE, "soon", 1, 0)


# --- 5. dry run ------------------------------------------------------------------------------

COMPARED = (
    "snapshots_expired",
    "expired_snapshot_ids",
    "refs_removed",
    "snapshots_retained",
    "refused_outside_table_location",
    "failed",
)


@pytest.mark.parametrize("delete_metadata", [False, True], ids=["plain", "metadata-deletion"])
def test_dry_run_changes_nothing_and_predicts_the_real_run(
    catalog: SqlCatalog, delete_metadata: bool
) -> None:
    properties = (
        {
            TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED: "true",
            TableProperties.METADATA_PREVIOUS_VERSIONS_MAX: "2",
        }
        if delete_metadata
        else {}
    )
    table = new_table(catalog, properties)
    m1 = append(table, 0)
    for i in range(1, 5):
        append(table, 100 * i)
    table.manage_snapshots().create_tag(m1, "old", max_ref_age_ms=1).commit()
    _, table = run_compaction(catalog, TABLE)
    clock = after_every_snapshot(table)
    rules = policy(int(clock() * 1000))
    files, ids, location = disk_files(table), snapshot_ids(table), table.metadata_location

    dry = expire_snapshots(table, TABLE, rules, dry_run=True, clock=clock).to_dict()

    table = catalog.load_table(TABLE)
    assert disk_files(table) == files
    assert snapshot_ids(table) == ids
    assert table.metadata_location == location
    assert set(table.metadata.refs) == {MAIN_BRANCH, "old"}
    assert dry["dry_run"] is True
    assert dry["snapshots_expired"] == 5 and dry["refs_removed"] == ["old"]

    real = expire_snapshots(table, TABLE, rules, clock=clock).to_dict()

    assert real["dry_run"] is False
    assert {key: real[key] for key in COMPARED} == {key: dry[key] for key in COMPARED}
    assert_dry_run_predicts(dry, real)
    assert real["files_deleted"] == len(set(files) - set(disk_files(catalog.load_table(TABLE))))


# --- 6. metadata.json files ------------------------------------------------------------------


def metadata_jsons(table: Table) -> set[str]:
    return {str(p) for p in local_path(table.metadata.location).glob("metadata/*.metadata.json")}


def kept_metadata(table: Table) -> set[str]:
    return {str(local_path(entry.metadata_file)) for entry in table.metadata.metadata_log} | {
        str(local_path(table.metadata_location))
    }


def test_old_metadata_files_go_when_the_table_says_so(catalog: SqlCatalog) -> None:
    table = new_table(
        catalog,
        {
            TableProperties.METADATA_DELETE_AFTER_COMMIT_ENABLED: "true",
            TableProperties.METADATA_PREVIOUS_VERSIONS_MAX: "2",
        },
    )
    for i in range(4):
        append(table, 100 * i)
    # compactor's own commits (compaction, expiry) do not delete metadata files as they commit.
    _, table = run_compaction(catalog, TABLE)
    assert len(metadata_jsons(table)) > len(kept_metadata(table))
    # A metadata file younger than the log's oldest entry may be a commit in flight.
    in_flight = local_path(table.metadata.location) / "metadata" / "99999-in-flight.metadata.json"
    in_flight.write_bytes(local_path(table.metadata_location).read_bytes())
    before = metadata_jsons(table)
    clock = after_every_snapshot(table)

    result = expire_snapshots(table, TABLE, policy(int(clock() * 1000)), clock=clock)

    table = catalog.load_table(TABLE)
    assert len(table.metadata.metadata_log) == 2
    assert metadata_jsons(table) == kept_metadata(table) | {str(in_flight)}
    gone = before - metadata_jsons(table)
    assert len(gone) == 2
    reported = {str(local_path(ref.location)) for ref in result.report.by_kind[METADATA_KIND]}
    assert reported == gone
    assert result.to_dict()["deleted"][METADATA_KIND]["files"] == 2
    assert_same_contents(
        scan_rows(table), table.scan(snapshot_id=table.metadata.current_snapshot_id).to_arrow()
    )


def test_metadata_files_stay_without_the_property(catalog: SqlCatalog) -> None:
    table = new_table(catalog, {TableProperties.METADATA_PREVIOUS_VERSIONS_MAX: "2"})
    for i in range(4):
        append(table, 100 * i)
    _, table = run_compaction(catalog, TABLE)
    before = metadata_jsons(table)
    assert len(before) > len(kept_metadata(table))
    clock = after_every_snapshot(table)

    result = expire_snapshots(table, TABLE, policy(int(clock() * 1000)), clock=clock)

    assert result.to_dict()["snapshots_expired"] == 4
    assert METADATA_KIND not in result.to_dict()["deleted"]
    table = catalog.load_table(TABLE)
    assert before < metadata_jsons(table)  # all still there, plus the expiry's own


# --- 8. nothing outside the table location ---------------------------------------------------


def write_parquet(path: Path, start: int) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(batch(start), path)
    return path.as_uri()


def test_files_outside_the_table_location_are_refused(catalog: SqlCatalog, tmp_path: Path) -> None:
    table = new_table(catalog)
    append(table, 0)
    location = local_path(table.metadata.location)
    outside = tmp_path / "elsewhere" / "imported.parquet"
    sibling = location.parent / (location.name + "_old") / "data" / "imported.parquet"
    table.add_files([write_parquet(outside, 1000), write_parquet(sibling, 2000)])
    table.overwrite(batch(5000))  # a delete and an append: nothing of before survives
    rows = scan_rows(table)
    clock = after_every_snapshot(table)

    result = expire_snapshots(table, TABLE, policy(int(clock() * 1000)), clock=clock)

    summary = result.to_dict()
    assert summary["snapshots_expired"] == 3
    assert summary["refused_outside_table_location"] == 2
    assert sorted(result.report.outside_location) == sorted([outside.as_uri(), sibling.as_uri()])
    assert outside.exists() and sibling.exists()
    assert summary["deleted"]["data_files"]["files"] == 1  # the first append's, inside
    assert all(
        str(local_path(ref.location)).startswith(str(location) + "/")
        for refs in result.report.by_kind.values()
        for ref in refs
    )
    table = catalog.load_table(TABLE)
    assert_same_contents(rows, scan_rows(table))


# --- 10. the CLI -----------------------------------------------------------------------------

CLI_TABLE = "db.events"


@pytest.fixture
def cli_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A COMPACTOR_HOME whose embedded catalog holds ``db.events``: four appends, compacted."""
    for name in list(os.environ):
        if name.upper().startswith(("PYICEBERG_", "COMPACTOR_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path))
    catalog = embedded(tmp_path)
    create_events_table(catalog, CLI_TABLE, commits=4, rows_per_commit=100, days=1)
    run_compaction(catalog, CLI_TABLE)
    return tmp_path


def test_cli_expire_json_reports_what_it_deleted(cli_home: Path) -> None:
    warehouse = cli_home / "warehouse"
    before = {str(p): p.stat().st_size for p in warehouse.rglob("*") if p.is_file()}
    table = embedded(cli_home).load_table(CLI_TABLE)
    current = table.metadata.current_snapshot_id
    rows = scan_rows(table)

    result = compactor(cli_home, "expire", "--table", CLI_TABLE, "--older-than", "0s", "--json")

    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    assert report["table"] == CLI_TABLE and report["dry_run"] is False
    assert report["snapshots_expired"] == 4
    assert report["snapshots_retained"] == 1
    assert report["refs_removed"] == []
    for kind in ("data_files", "manifests", "manifest_lists"):
        assert report["deleted"][kind]["files"] > 0
        assert report["deleted"][kind]["bytes"] > 0
    assert report["files_deleted"] == sum(k["files"] for k in report["deleted"].values())
    assert report["bytes_deleted"] == sum(k["bytes"] for k in report["deleted"].values())
    after = {str(p): p.stat().st_size for p in warehouse.rglob("*") if p.is_file()}
    vanished = {path: size for path, size in before.items() if path not in after}
    assert report["files_deleted"] == len(vanished)
    assert report["bytes_deleted"] == sum(vanished.values())
    table = embedded(cli_home).load_table(CLI_TABLE)
    assert snapshot_ids(table) == {current}
    assert_same_contents(rows, scan_rows(table))


@pytest.mark.parametrize(
    ("args", "culprits"),
    [
        (("--older-than", "garbage"), ("--older-than", "garbage")),
        (("--retain-last", "0"), ("--retain-last",)),
    ],
    ids=["garbage-age", "retain-none"],
)
def test_cli_expire_bad_flags_exit_2_with_one_error_line(
    cli_home: Path, args: tuple[str, ...], culprits: tuple[str, ...]
) -> None:
    table = embedded(cli_home).load_table(CLI_TABLE)
    ids, location = snapshot_ids(table), table.metadata_location

    result = compactor(cli_home, "expire", "--table", CLI_TABLE, *args)

    assert_one_error_line(result, 2, *culprits)
    table = embedded(cli_home).load_table(CLI_TABLE)
    assert snapshot_ids(table) == ids and table.metadata_location == location


# --- explicit snapshot ids (Spark's snapshot_ids) ------------------------------------------


def test_explicit_snapshot_ids_are_expired_whatever_their_age(catalog: SqlCatalog) -> None:
    table = new_table(catalog)
    ids = [append(table, 100 * i) for i in range(4)]
    table.manage_snapshots().create_tag(ids[1], "kept").commit()
    kept = {sid: table.scan(snapshot_id=sid).to_arrow() for sid in (ids[1], ids[3])}
    young = policy(cutoff_ms=0)  # nothing is old enough to go by age

    result = expire_snapshots(table, TABLE, replace(young, snapshot_ids=frozenset(ids[::2])))

    assert sorted(result.plan.expire) == sorted(ids[::2])
    table = catalog.load_table(TABLE)
    assert snapshot_ids(table) == {ids[1], ids[3]}
    for sid, rows in kept.items():
        assert_same_contents(rows, table.scan(snapshot_id=sid).to_arrow())
    assert_reachable_files_exist(table)
    assert_java_reads_same(table)


@pytest.mark.parametrize("which", ["current", "tag", "unknown"])
def test_an_explicit_snapshot_a_ref_holds_or_the_table_lacks_is_refused(
    catalog: SqlCatalog, which: str
) -> None:
    table = new_table(catalog)
    ids = [append(table, 100 * i) for i in range(3)]
    table.manage_snapshots().create_tag(ids[0], "kept").commit()
    wanted = {"current": ids[2], "tag": ids[0], "unknown": 12345}[which]
    before = table.metadata_location, disk_files(table)
    rules = replace(policy(cutoff_ms=0), snapshot_ids=frozenset([wanted]))

    with pytest.raises(UsageError, match=rf"^table {TABLE}: snapshot_ids: {wanted} "):
        expire_snapshots(table, TABLE, rules)

    table = catalog.load_table(TABLE)
    assert (table.metadata_location, disk_files(table)) == before


def test_snapshot_ids_on_the_command_line(tmp_path: Path) -> None:
    table = create_events_table(embedded(tmp_path), "db.events", commits=3, rows_per_commit=20)
    first = table.metadata.snapshots[0].snapshot_id

    bad = compactor(tmp_path, "expire", "--table", "db.events", "--snapshot-ids", "1,x")
    dry = compactor(
        tmp_path,
        "expire",
        "--table",
        "db.events",
        "--snapshot-ids",
        str(first),
        "--dry-run",
        "--json",
    )

    assert_one_error_line(bad, 2, "snapshot", "'x'")
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["expired_snapshot_ids"] == [first]
    cleaned = compactor(
        tmp_path, "expire", "--table", "db.events", "--clean-expired-metadata", "--json"
    )
    assert cleaned.returncode == 0, cleaned.stderr
    assert json.loads(cleaned.stdout)["removed_spec_ids"] == []  # one spec, in use


# --- unused partition specs and schemas (Spark's clean_expired_metadata) --------------------


def _evolved_table(catalog: SqlCatalog) -> Table:
    """Written under spec 0 and schema 0, then overwritten under spec 1 and schema 1."""
    table = new_table(catalog)
    table.append(batch(0))
    with table.update_spec() as spec:
        spec.add_identity("id")
    with table.update_schema() as schema:
        schema.add_column("note", StringType())
    table = catalog.load_table(TABLE)
    rows = batch(500).append_column("note", pa.array(["n"] * 50, pa.large_string()))
    table.overwrite(rows.cast(table.schema().as_arrow()))
    return catalog.load_table(TABLE)


@pytest.mark.parametrize("dry_run", [True, False])
def test_clean_expired_metadata_removes_specs_and_schemas_nothing_retained_uses(
    catalog: SqlCatalog, dry_run: bool
) -> None:
    table = _evolved_table(catalog)
    assert [s.spec_id for s in table.metadata.partition_specs] == [0, 1]
    assert [s.schema_id for s in table.metadata.schemas] == [0, 1]
    rows = scan_rows(table)
    rules = replace(policy(cutoff_ms=1 << 62), clean_expired_metadata=True)

    result = expire_snapshots(
        table, TABLE, rules, dry_run=dry_run, clock=after_every_snapshot(table)
    )

    summary = result.to_dict()
    assert (summary["removed_spec_ids"], summary["removed_schema_ids"]) == ([0], [0])
    table = catalog.load_table(TABLE)
    kept = ([0, 1], [0, 1]) if dry_run else ([1], [1])
    assert [s.spec_id for s in table.metadata.partition_specs] == kept[0]
    assert [s.schema_id for s in table.metadata.schemas] == kept[1]
    assert_same_contents(rows, scan_rows(table))
    assert_java_reads_same(table)


def test_without_clean_expired_metadata_specs_and_schemas_stay(catalog: SqlCatalog) -> None:
    table = _evolved_table(catalog)

    result = expire_snapshots(
        table, TABLE, policy(cutoff_ms=1 << 62), clock=after_every_snapshot(table)
    )

    assert result.plan.expire and result.to_dict()["removed_spec_ids"] == []
    table = catalog.load_table(TABLE)
    assert len(table.metadata.partition_specs) == len(table.metadata.schemas) == 2


def test_a_spec_a_retained_snapshot_uses_is_kept(catalog: SqlCatalog) -> None:
    table = _evolved_table(catalog)
    first = table.metadata.snapshots[0].snapshot_id
    table.manage_snapshots().create_tag(first, "before-evolution").commit()
    rules = replace(policy(cutoff_ms=1 << 62), clean_expired_metadata=True)

    result = expire_snapshots(table, TABLE, rules, clock=after_every_snapshot(table))

    assert (result.plan.remove_spec_ids, result.plan.remove_schema_ids) == ([], [])
    table = catalog.load_table(TABLE)
    assert len(table.metadata.partition_specs) == len(table.metadata.schemas) == 2
    assert_java_reads_same(table)
