"""Planning reads data manifests without column metrics; the plan and the commit are unchanged.

Each planned input's data file must be the one pyiceberg reads from the manifest (every field,
partition values NaN, -0.0, 0.0 and null kept apart, files added by ``add_files`` and files
with field ids) but for its column metrics and split offsets; its sequence numbers and the
delete files that apply to it are as before. The commit records each rewritten file as the
manifest holds it, metrics included.
"""

from __future__ import annotations

import math
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import write_file
from pyiceberg.manifest import DATA_FILE_TYPE, DataFile, DataFileContent, ManifestEntryStatus
from pyiceberg.partitioning import PartitionField, PartitionFieldValue, PartitionKey, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table, WriteTask
from pyiceberg.table.snapshots import Operation
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import DoubleType, LongType, NestedField

from compactor.iceberg.manifest_decoder import METRIC_FIELD_IDS
from compactor.iceberg.pyiceberg_compat import manifest_entries, snapshot_manifests
from compactor.iceberg.value_keys import partition_key
from compactor.options import resolve_options
from compactor.planning.planner import InputFile, plan_rewrite

from support.deletes import commit_delete_files, write_position_delete_file
from support.runs import run_compaction
from support.tables import live_entries

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "x", DoubleType(), required=False),
)
BY_X = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "x"))
PARTITION = [f.name for f in DATA_FILE_TYPE[3].fields].index("partition")
NOT_KEPT = {
    i
    for i, f in enumerate(DATA_FILE_TYPE[3].fields)
    if f.field_id in METRIC_FIELD_IDS or f.name == "split_offsets"
}


def _rows(first: int, xs: list[float | None]) -> pa.Table:
    ids = pa.array(range(first, first + len(xs)), pa.int64())
    return pa.table({"id": ids, "x": pa.array(xs, pa.float64())}, schema=SCHEMA.as_arrow())


def _append(table: Table, data: pa.Table, partition_value: float | None) -> DataFile:
    """``data`` as one data file of partition ``x = partition_value`` (a fast append)."""
    spec, schema = table.spec(), table.schema()
    key = PartitionKey([PartitionFieldValue(spec.fields[0], partition_value)], spec, schema)
    task = WriteTask(uuid.uuid4(), 0, schema, data.to_batches(), partition_key=key)
    (data_file,) = write_file(table.io, table.metadata, iter([task]))
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        append.append_data_file(data_file)
    return data_file


def _plan(table: Table) -> list[InputFile]:
    identifier = ".".join(table.name())
    options = resolve_options(
        identifier,
        table.metadata.properties,
        rewrite_all=True,
        target_file_size="1MiB",
        allow_small_target=True,
    )
    plan, _ = plan_rewrite(table, identifier, options.plan)
    return [f for g in plan.groups for f in g.files]


def _assert_as_the_manifest_holds_them(table: Table, planned: list[InputFile]) -> None:
    live = {e.data_file.file_path: e for e in live_entries(table)}
    assert {f.path for f in planned} == {
        p for p, e in live.items() if e.data_file.content == DataFileContent.DATA
    }
    for f in planned:
        entry = live[f.path]
        full, compact = entry.data_file, f.data_file
        assert len(compact) == len(full) and compact.spec_id == full.spec_id
        assert partition_key(compact.partition) == partition_key(full.partition)
        for i in range(len(full)):
            if i in NOT_KEPT:
                assert compact[i] is None
            elif i != PARTITION:
                assert compact[i] == full[i], DATA_FILE_TYPE[3].fields[i].name
        assert f.data_sequence_number == entry.sequence_number
        assert f.file_sequence_number == entry.file_sequence_number
        assert (f.size, f.record_count) == (full.file_size_in_bytes, full.record_count)


def test_partitions_nan_signed_zeros_and_null_plan_from_the_manifests(catalog: Catalog) -> None:
    table = catalog.create_table("db.floats", SCHEMA, partition_spec=BY_X)
    for n, x in enumerate([math.nan, -0.0, 0.0, None, math.nan, -0.0]):
        _append(table, _rows(10 * n, [x] * 3), x)
    table.refresh()
    planned = _plan(table)
    _assert_as_the_manifest_holds_them(table, planned)
    keys = {partition_key(f.data_file.partition) for f in planned}
    assert len(keys) == 4  # NaN, -0.0, 0.0 and null: four partitions, as Java counts them


def test_imported_and_written_files_with_deletes_plan_and_commit_as_before(
    catalog: Catalog, tmp_path: Path
) -> None:
    table = catalog.create_table("db.mixed", SCHEMA, properties={"format-version": "2"})
    paths = []
    for n in range(3):  # files without field ids, added by add_files
        path = tmp_path / f"imported-{n}.parquet"
        pq.write_table(_rows(100 * n, [1.5, None, 2.5]), path)
        paths.append(path.as_uri())
    table.add_files(paths)
    table.append(_rows(1000, [0.5, 0.25]))
    table.append(_rows(2000, [0.5]))
    table.refresh()
    target = next(e.data_file for e in live_entries(table) if e.data_file.file_path == paths[1])
    commit_delete_files(table, [write_position_delete_file(table, {target: [0]})])
    table.refresh()
    full = {e.data_file.file_path: e.data_file for e in live_entries(table)}

    planned = _plan(table)
    _assert_as_the_manifest_holds_them(table, planned)
    with_deletes = {f.path: [d.file_path for d in f.delete_files] for f in planned}
    assert [p for p, deletes in with_deletes.items() if deletes] == [paths[1]]

    run_compaction(catalog, "db.mixed", rewrite_all=True)
    table.refresh()
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary.operation == Operation.REPLACE
    removed = {
        e.data_file.file_path: e.data_file
        for m in snapshot_manifests(table.io, snapshot, 2)
        if m.added_snapshot_id == snapshot.snapshot_id
        for e in manifest_entries(table.io, m, 2, discard_deleted=False)
        if e.status == ManifestEntryStatus.DELETED and e.data_file.content == DataFileContent.DATA
    }
    assert removed.keys() == {f.path for f in planned}
    for path, data_file in removed.items():  # metrics and all, as the manifest held them
        assert data_file == full[path]
