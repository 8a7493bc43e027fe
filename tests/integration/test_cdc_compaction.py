"""CDC and merge-on-read tables written by Iceberg Java, compacted, and read back by Iceberg Java.

The tables come from an independent writer (tests/support/java_writer.py: Flink-style upserts with
equality and position deletes, Spark-style merge-on-read position deletes, equality deletes
under an all-void spec, a schema change between data and deletes, and a format-v3 table with
deletion vectors). After ``compactor run`` the rows Iceberg Java reads equal those its writer
expects, row for row; data files fall to one per partition and, as every data file was
rewritten, no delete file is left.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import BadRequestError
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

import compactor
from compactor import compaction
from compactor.commit.committer import commit_replace
from compactor.iceberg.delete_files import commit_delete_files, write_deletion_vectors
from compactor.iceberg.pyiceberg_compat import (
    delete_file_key,
    first_row_id,
    is_deletion_vector,
    manifest_entries,
    referenced_data_file,
    snapshot_manifests,
)
from compactor.planning.health import table_health
from compactor.planning.tasks import RewriteTask

from support.java_reader import JavaReader, java_read
from support.java_writer import read_expected, write_cdc_table
from support.runs import planned_tasks, run_compaction
from support.tables import live_data_files, live_delete_files

# Every test here holds on both read paths (compactor.rewrite.bulk_read and Iceberg's).
pytestmark = pytest.mark.usefixtures("read_path")

# scenario -> partitions of its current data (one output file each)
COMPACTED = {"upsert": 4, "merge-on-read": 3, "void-spec": 5, "schema-change": 1}


def _written(catalog: Catalog, tmp_path: Path, scenario: str) -> tuple[Table, Counter[str]]:
    location = tmp_path / scenario
    metadata_location = write_cdc_table(scenario, location, seed=1)
    table = catalog.register_table(("db", scenario.replace("-", "_")), metadata_location)
    return table, read_expected(location).rows


@pytest.mark.parametrize("scenario", sorted(COMPACTED))
def test_java_reads_the_same_rows_after_compaction(
    catalog: Catalog, tmp_path: Path, java_reader: JavaReader, scenario: str
) -> None:
    table, expected = _written(catalog, tmp_path, scenario)
    before = java_read(table, [])
    assert before.current.rows == expected
    data_before = len(live_data_files(table))
    deletes_before = live_delete_files(table)
    assert deletes_before

    result, after = run_compaction(catalog, f"db.{scenario.replace('-', '_')}")

    summary = result.to_dict()
    assert summary["failed_groups"] == [] and not result.plan.skipped, summary
    assert summary["rewritten_files"] == data_before
    # One file per partition of the data (a void spec's files form one more partition).
    assert len(live_data_files(after)) == COMPACTED[scenario]
    assert live_delete_files(after) == {}
    assert summary["rewritten_delete_files"] == len(deletes_before)
    # Files of an all-void spec are unpartitioned, as Java's location provider places them.
    assert not [p for p in live_data_files(after) if "=null/" in p]
    read = java_read(after, [after.current_snapshot().snapshot_id])
    assert read.current.rows == expected
    assert read.live_files() == Counter({"data": COMPACTED[scenario]})
    assert summary["deleted_rows_applied"] > 0


def test_a_format_v3_table_with_deletion_vectors_is_compacted_and_its_dvs_removed(
    catalog: Catalog, tmp_path: Path, java_reader: JavaReader
) -> None:
    table, expected = _written(catalog, tmp_path, "dv")
    before = java_read(table, [])
    assert before.current.rows == expected
    lineage = before.lineage()
    kinds_before = before.live_files()
    assert kinds_before["deletion_vectors"] > 1, kinds_before
    assert (
        table_health(table, "db.dv", 1 << 20).deletion_vectors == kinds_before["deletion_vectors"]
    )
    next_row_id = table.metadata.next_row_id

    result, after = run_compaction(catalog, "db.dv")

    summary = result.to_dict()
    assert summary["failed_groups"] == [] and not result.plan.skipped, summary
    assert summary["rewritten_files"] == kinds_before["data"]
    # Every DV is its own entry (several share a Puffin file): each is counted and removed.
    assert summary["rewritten_delete_files"] == kinds_before["deletion_vectors"]
    assert summary["deleted_rows_applied"] > 0
    read = java_read(after, [after.current_snapshot().snapshot_id])
    assert read.current.rows == expected
    # Row lineage kept: every row keeps its _row_id and _last_updated_sequence_number.
    assert read.lineage() == lineage
    assert read.live_files() == Counter({"data": 3})
    assert table_health(after, "db.dv", 1 << 20).deletion_vectors == 0
    # The replace snapshot takes its row ids from the table's next-row-id and advances it.
    snapshot = after.current_snapshot()
    assert snapshot.first_row_id == next_row_id
    assert after.metadata.next_row_id == next_row_id + snapshot.added_rows


def test_tasks_of_a_v3_table_carry_each_deletion_vector_through_json_exactly(
    catalog: Catalog, tmp_path: Path
) -> None:
    table, _ = _written(catalog, tmp_path, "dv")
    _, tasks = planned_tasks(table, "run000000001", min_input_files=2)
    dvs = [d for t in tasks for f in t.inputs for d in f.delete_files if is_deletion_vector(d)]
    # DVs of one commit share a Puffin file: each still reaches the one input it names.
    assert len({d.file_path for d in dvs}) < len(dvs)
    assert all(
        referenced_data_file(d) == f.path for t in tasks for f in t.inputs for d in f.delete_files
    )
    for task in tasks:
        again = RewriteTask.from_json(task.to_json())
        assert again.to_json() == task.to_json()
        for mine, theirs in zip(again.inputs, task.inputs, strict=True):
            assert first_row_id(mine.data_file) == first_row_id(theirs.data_file) is not None
            assert [delete_file_key(d) for d in mine.delete_files] == [
                delete_file_key(d) for d in theirs.delete_files
            ]


def _data_files_without_dv(table: Table) -> list[DataFile]:
    version = table.metadata.format_version
    entries = [
        e
        for m in snapshot_manifests(table.io, table.current_snapshot(), version)
        for e in manifest_entries(table.io, m, version)
    ]
    with_dv = {
        referenced_data_file(e.data_file) for e in entries if is_deletion_vector(e.data_file)
    }
    return sorted(
        (
            e.data_file
            for e in entries
            if e.data_file.content == 0 and e.data_file.file_path not in with_dv
        ),
        key=lambda f: f.file_path,
    )


def test_deletion_vectors_written_here_read_in_java_and_compact_with_lineage_kept(
    catalog: Catalog, tmp_path: Path, java_reader: JavaReader
) -> None:
    table, _ = _written(catalog, tmp_path, "dv")
    lineage_before = java_read(table, []).lineage()
    targets = _data_files_without_dv(table)[:2]
    assert len(targets) == 2
    deleted = {f: range(0, f.record_count, 3) for f in targets}
    table = commit_delete_files(table, write_deletion_vectors(table, deleted))

    read = java_read(table, [])
    # Java applies both DVs (one Puffin file); the rows left keep their lineage.
    removed = sum(len(r) for r in deleted.values())
    assert sum(read.lineage().values()) == sum(lineage_before.values()) - removed
    assert not read.lineage() - lineage_before

    result, after = run_compaction(catalog, "db.dv")
    assert result.to_dict()["failed_groups"] == []
    again = java_read(after, [])
    assert again.lineage() == read.lineage()
    assert again.live_files() == Counter({"data": 3})


def test_a_deletion_vector_committed_mid_run_refuses_the_group_of_its_data_file(
    catalog: Catalog, tmp_path: Path, java_reader: JavaReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    table, _ = _written(catalog, tmp_path, "dv")
    victim = _data_files_without_dv(table)[0]

    def dv_then_commit(table: Table, *args, **kwargs):
        other = catalog.load_table("db.dv")
        commit_delete_files(other, write_deletion_vectors(other, {victim: [0]}))
        return commit_replace(table, *args, **kwargs)

    monkeypatch.setattr(compaction, "commit_replace", dv_then_commit)
    expected_lineage_count = sum(java_read(table, []).lineage().values()) - 1
    result, after = run_compaction(catalog, "db.dv")

    summary = result.to_dict()
    refused = [g for g in summary["failed_groups"] if "deletion vector" in g["reason"]]
    assert len(refused) == 1 and victim.file_path in refused[0]["reason"], summary
    assert victim.file_path in live_data_files(after)  # its group was not committed
    read = java_read(after, [])
    assert sum(read.lineage().values()) == expected_lineage_count


def test_v3_outputs_carry_lineage_columns_through_a_second_compaction(
    catalog: Catalog, tmp_path: Path, java_reader: JavaReader
) -> None:
    table, expected = _written(catalog, tmp_path, "dv")
    lineage = java_read(table, []).lineage()
    _, first = run_compaction(catalog, "db.dv", target_file_size="8KiB", max_group_size="12KiB")
    outputs = [p for p in live_data_files(first) if "/compactor-" in p]
    assert len(outputs) >= 3
    for path in outputs:
        names = pq.read_schema(path.removeprefix("file://")).names
        assert names[-2:] == ["_row_id", "_last_updated_sequence_number"]

    result, second = run_compaction(catalog, "db.dv")

    assert result.to_dict()["rewritten_files"] >= len(outputs)
    assert not set(outputs) & set(live_data_files(second))
    read = java_read(second, [])
    assert read.current.rows == expected
    assert read.lineage() == lineage


def test_expire_and_orphans_after_a_v3_compaction_keep_what_the_table_reads(
    catalog: Catalog, tmp_path: Path, java_reader: JavaReader
) -> None:
    table, expected = _written(catalog, tmp_path, "dv")
    puffins = {p for p in live_delete_files(table)}
    _, after = run_compaction(catalog, "db.dv")
    lineage = java_read(after, []).lineage()
    newest = datetime.fromtimestamp(after.current_snapshot().timestamp_ms / 1000 + 1, UTC)

    expired = compactor.expire_snapshots(after, older_than=newest.isoformat(), retain_last=1)
    swept = compactor.remove_orphans(
        catalog.load_table("db.dv"), older_than="0s", allow_short_older_than=True
    )

    assert expired.to_dict()["files_deleted"] > 0
    assert swept.to_dict()["dry_run"] is False
    final = catalog.load_table("db.dv")
    assert len(final.metadata.snapshots) == 1
    read = java_read(final, [])
    assert read.current.rows == expected and read.lineage() == lineage
    # The DVs' Puffin files went with the snapshots that referenced them.
    assert not [p for p in puffins if Path(p.removeprefix("file://")).exists()]


def test_a_table_upgraded_from_v2_with_position_deletes_and_dvs_keeps_rows_and_lineage(
    catalog: Catalog, tmp_path: Path, java_reader: JavaReader
) -> None:
    table, expected = _written(catalog, tmp_path, "v2-to-v3")
    before = java_read(table, [])
    kinds = before.live_files()
    assert kinds["deletion_vectors"] and kinds["position_deletes"], kinds
    lineage = before.lineage()

    result, after = run_compaction(catalog, "db.v2_to_v3")

    assert result.to_dict()["failed_groups"] == []
    read = java_read(after, [])
    assert read.current.rows == expected
    assert read.lineage() == lineage
    assert read.live_files() == Counter({"data": 3})


def test_a_table_just_upgraded_to_v3_gets_row_ids_for_every_row(
    catalog: Catalog, tmp_path: Path, java_reader: JavaReader
) -> None:
    table, expected = _written(catalog, tmp_path, "v2-upgraded")
    # No v3 snapshot yet: Java reads no lineage at all.
    assert {(r, i) for r, i, _ in java_read(table, []).lineage()} == {(r, None) for r in expected}

    _, after = run_compaction(catalog, "db.v2_upgraded")

    read = java_read(after, [])
    assert read.current.rows == expected
    ids = [row_id for _, row_id, _ in read.lineage().elements()]
    assert None not in ids and len(set(ids)) == len(ids) == expected.total()
    snapshot = after.current_snapshot()
    assert snapshot.first_row_id == 0 and after.metadata.next_row_id == snapshot.added_rows
    assert max(ids) < after.metadata.next_row_id


def test_a_dv_overrides_position_delete_files_of_its_data_file_as_java_reads_it(
    catalog: Catalog, tmp_path: Path, java_reader: JavaReader
) -> None:
    table, _ = _written(catalog, tmp_path, "v2-to-v3")
    inputs = [f for g in compactor.plan(table, min_input_files=2).groups for f in g.files]
    victim = next(
        f
        for f in inputs
        if f.delete_files and not any(is_deletion_vector(d) for d in f.delete_files)
    )
    # A DV written without merging the file's older position deletes (a writer's bug): Java
    # ignores those position deletes, and so must the rewrite.
    table = commit_delete_files(table, write_deletion_vectors(table, {victim.data_file: [0]}))
    before = java_read(table, [])

    _, after = run_compaction(catalog, "db.v2_to_v3")

    read = java_read(after, [])
    assert read.current.rows == before.current.rows
    assert read.lineage() == before.lineage()


@pytest.mark.parametrize(
    "refusal",
    [
        # pyiceberg's SQL catalog, applying the run's snapshot to the table as it is now.
        ValueError(
            "Cannot add a snapshot with first row id smaller than the table's next-row-id 15 < 20"
        ),
        # Iceberg's REST catalog server (HTTP 400).
        BadRequestError(
            "ValidationException: Cannot add a snapshot, first-row-id is behind table "
            "next-row-id: 15 < 20"
        ),
    ],
    ids=["sql", "rest"],
)
def test_a_v3_snapshot_refused_for_its_row_ids_is_retried(
    catalog: Catalog,
    tmp_path: Path,
    java_reader: JavaReader,
    monkeypatch: pytest.MonkeyPatch,
    refusal: Exception,
) -> None:
    """Another branch's commit took the row ids the run's snapshot had chosen (pyiceberg cannot
    write that commit to a v3 table here; the catalogs' refusal of it is given as they word it,
    and nothing is applied). The run retries from the table's next-row-id."""
    table, expected = _written(catalog, tmp_path, "dv")
    lineage = java_read(table, []).lineage()
    next_row_id = table.metadata.next_row_id
    commit_table = catalog.commit_table
    refused: list[Exception] = []

    def refuse_once(committing: Table, requirements: tuple, updates: tuple):
        if not refused:
            refused.append(refusal)
            raise refusal
        return commit_table(committing, requirements, updates)

    monkeypatch.setattr(catalog, "commit_table", refuse_once)
    result, after = run_compaction(catalog, "db.dv")

    assert refused and [c.attempts for c in result.commits] == [2]
    snapshot = after.current_snapshot()
    assert snapshot.snapshot_id == result.snapshot_ids[-1]
    assert snapshot.first_row_id == next_row_id
    assert after.metadata.next_row_id == next_row_id + snapshot.added_rows
    read = java_read(after, [snapshot.snapshot_id])
    assert read.current.rows == expected
    assert read.lineage() == lineage
