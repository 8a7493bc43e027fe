"""Compaction run in-process with the suite's small defaults, and what every run must keep."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation

from compactor import __version__
from compactor.commit.snapshot_writer import SNAPSHOT_PROPERTY_TOOL
from compactor.compaction import RunResult, compact_table
from compactor.iceberg.catalogs import identifier_of
from compactor.iceberg.value_keys import partition_key
from compactor.options import resolve_options
from compactor.planning.planner import Plan, plan_rewrite
from compactor.planning.tasks import RewriteTask, plan_tasks

from support.java_reader import assert_java_reads_same
from support.rows import assert_same_rows, scan_rows
from support.tables import (
    assert_manifests_consistent,
    files_without_field_ids,
    live_data_files,
    records_by_partition,
)

# The read paths a test's compactions can take (the ``read_path`` fixture): the test's small
# files scanned together in bulk, each file streamed alone in bulk (as a large file is), each
# through the Iceberg read path (bulk reading off).
EVERY_READ_PATH = ["bulk", "streamed", "iceberg"]

# Small targets keep the suite fast; tests override single options where they need to.
DEFAULT_OPTIONS: dict[str, Any] = {
    "target_file_size": "1MiB",
    "allow_small_target": True,
    "min_input_files": 2,
    "parallelism": 2,
}


def run_compaction(
    catalog: Catalog,
    identifier: str,
    *,
    dry_run: bool = False,
    grown_before: frozenset[frozenset[str]] = frozenset(),
    **overrides: Any,
) -> tuple[RunResult, Table]:
    """Compact ``identifier`` with the suite's small defaults (overridable); reload the table."""
    table = catalog.load_table(identifier)
    opts = resolve_options(
        identifier, table.metadata.properties, **{**DEFAULT_OPTIONS, **overrides}
    )
    result = compact_table(table, opts, dry_run=dry_run, grown_before=grown_before)
    return result, catalog.load_table(identifier)


def compact_and_verify(
    catalog: Catalog, identifier: str, **overrides: Any
) -> tuple[RunResult, Table, pa.Table]:
    """Compact and check the invariants every successful run must keep.

    - the scan returns exactly the same multiset of rows;
    - exactly one new snapshot, a ``replace`` whose parent is the previous head, tagged with
      ``compactor.version``;
    - fewer live data files; per (spec, partition) record totals unchanged but for deletes;
    - every manifest tracks a single content type;
    - Iceberg's Java library reads every manifest, and the rows pyiceberg gets before and after
      (of a snapshot whose data files all carry field ids: see below).

    Returns the run result, the reloaded table and the rows scanned before compaction.
    """
    table = before = catalog.load_table(identifier)
    before_snapshot = table.current_snapshot()
    assert before_snapshot is not None
    before_rows = scan_rows(table)
    before_files = live_data_files(table)
    before_records = records_by_partition(table)
    before_snapshots = len(table.metadata.snapshots)

    result, table = run_compaction(catalog, identifier, **overrides)

    snapshot = table.current_snapshot()
    assert snapshot is not None
    summary = result.to_dict()
    assert summary["snapshot_id"] == snapshot.snapshot_id
    assert len(table.metadata.snapshots) == before_snapshots + 1
    assert snapshot.parent_snapshot_id == before_snapshot.snapshot_id
    assert snapshot.summary is not None
    assert snapshot.summary.operation == Operation.REPLACE
    assert snapshot.summary.additional_properties[SNAPSHOT_PROPERTY_TOOL] == __version__

    after_files = live_data_files(table)
    assert len(after_files) < len(before_files)
    assert summary["rewritten_files"] > 0
    assert summary["added_files"] > 0
    assert (
        len(after_files) == len(before_files) - summary["rewritten_files"] + summary["added_files"]
    )
    # Per partition, records only drop by the rows position deletes removed.
    expected_records = Counter(before_records)
    for group_result in result.committed:
        group = result.plan.group(group_result.task_id)
        expected_records[(group.spec_id, partition_key(group.partition))] -= (
            group_result.rows_deleted
        )
    assert records_by_partition(table) == +expected_records
    assert_manifests_consistent(table)
    assert_same_rows(before_rows, scan_rows(table))
    # The snapshot summary totals agree with the manifests.
    assert int(snapshot.summary.additional_properties["total-data-files"]) == len(after_files)
    assert int(snapshot.summary.additional_properties["total-records"]) == sum(
        f.record_count for f in after_files.values()
    )
    # An independent reader (Iceberg Java) reads every manifest and the same rows before and after.
    # Its generic reader reads files without field ids by column position, not through the name
    # mapping: a snapshot holding such files must be read, its rows are not compared (pyiceberg
    # read them through the mapping, and its rows before and after are the same).
    unmapped: dict[int | None, None] = {}
    if files_without_field_ids(before):
        unmapped[before_snapshot.snapshot_id] = None
    if files_without_field_ids(table):
        unmapped[snapshot.snapshot_id] = unmapped[None] = None
    assert_java_reads_same(
        table, unmapped, snapshot_ids=[snapshot.snapshot_id, before_snapshot.snapshot_id]
    )
    return result, table, before_rows


# What a dry run reports it would delete, and a real run that it deleted.
WOULD_DELETE = ("would_delete", "would_delete_files", "would_delete_bytes", "would_delete_paths")
DELETED = ("deleted", "files_deleted", "bytes_deleted", "deleted_paths")


def assert_dry_run_predicts(dry: dict[str, Any], real: dict[str, Any]) -> None:
    """The dry run deleted nothing and would delete exactly what the real run deleted."""
    assert [dry[key] for key in DELETED] == [{}, 0, 0, []]
    assert [real[key] for key in WOULD_DELETE] == [{}, 0, 0, []]
    assert [dry[key] for key in WOULD_DELETE] == [real[key] for key in DELETED]


def planned_tasks(table: Table, run_id: str, **options: Any) -> tuple[Plan, list[RewriteTask]]:
    """The plan of a run with ``options`` and its tasks, as the run would send them out."""
    resolved = resolve_options(identifier_of(table), table.metadata.properties, **options)
    plan, _ = plan_rewrite(table, identifier_of(table), resolved.plan)
    return plan, plan_tasks(plan, run_id, table.io.properties, resolved.execution)
