"""Float values in partitions and equality keys compare as Iceberg Java compares them.

Java compares floats by their canonical bits: every NaN is one value whatever its payload, and
-0.0 and 0.0 are two. These tests build tables with NaN and signed-zero partitions (NaN
partition files are written with pyiceberg's writer and fast append, as Spark commits them:
pyiceberg's ``append`` cannot split rows into a NaN partition) and equality deletes of NaN with
another payload, and judge the runs by what Iceberg Java's reader reads.
"""

from __future__ import annotations

import math
import struct
import uuid
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import write_file
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import (
    PartitionField,
    PartitionFieldValue,
    PartitionKey,
    PartitionSpec,
)
from pyiceberg.schema import Schema
from pyiceberg.table import Table, WriteTask
from pyiceberg.transforms import BucketTransform, IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import DoubleType, FloatType, LongType, NestedField

from compactor import compaction
from compactor.commit.committer import commit_replace
from compactor.errors import CommitConflictError
from compactor.iceberg import delete_files
from compactor.iceberg.value_keys import (
    CANONICAL_NAN_BITS_32,
    CANONICAL_NAN_BITS_64,
    FloatBits,
    canonical_array,
    float_bits,
    partition_key,
    same_partition,
    value_key,
)
from compactor.maintain.delete_rewrite import rewrite_position_deletes

from support.deletes import (
    commit_delete_files,
    write_equality_delete_file,
    write_position_delete_file,
)
from support.java_reader import JavaReader, assert_java_reads_same, java_read
from support.runs import compact_and_verify, run_compaction
from support.tables import (
    FIELD_IDS,
    IMPORTED,
    append_rows,
    assert_rows_match_partition,
    live_data_files,
    live_delete_files,
)

# Every test here holds on both read paths (compactor.rewrite.bulk_read and Iceberg's).
pytestmark = pytest.mark.usefixtures("read_path")

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "x", DoubleType(), required=False),
)
BY_X = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "x"))
TABLE = "db.floats"
# The NaNs x86 computes for 0.0 / 0.0 (sign bit set), as double and as float.
NEGATIVE_NAN_BITS = 0xFFF8000000000000
NEGATIVE_NAN_BITS_32 = 0xFFC00000


def double(bits: int) -> float:
    """The double with the IEEE 754 bit pattern ``bits``."""
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


def raw_bits(value: float) -> int:
    """``value``'s bit pattern as stored (NaN payloads kept)."""
    return struct.unpack("<Q", struct.pack("<d", value))[0]


def rows(first: int, xs: list[float | None]) -> pa.Table:
    """Rows ``id = first, first + 1, ...`` with the given ``x`` values."""
    ids = pa.array(range(first, first + len(xs)), pa.int64())
    return pa.table({"id": ids, "x": pa.array(xs, pa.float64())}, schema=SCHEMA.as_arrow())


def append_file(table: Table, data: pa.Table, partition_value: float) -> DataFile:
    """Append ``data`` as one data file in partition ``x = partition_value`` (pyiceberg's
    writer and fast append); returns the file."""
    spec, schema = table.spec(), table.schema()
    key = PartitionKey([PartitionFieldValue(spec.fields[0], partition_value)], spec, schema)
    task = WriteTask(uuid.uuid4(), 0, schema, data.to_batches(), partition_key=key)
    (data_file,) = write_file(table.io, table.metadata, iter([task]))
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        append.append_data_file(data_file)
    return data_file


def nan_files(table: Table) -> list[DataFile]:
    """The live data files of partition ``x = NaN``, by path."""
    live = live_data_files(table).values()
    return sorted(
        (f for f in live if f.partition[0] is not None and math.isnan(f.partition[0])),
        key=lambda f: f.file_path,
    )


def java_rows(table: Table, snapshot_id: int) -> Counter[str]:
    """The rows Iceberg Java reads of ``snapshot_id`` (its deletes applied by Java)."""
    read = java_read(table, [snapshot_id]).snapshots[snapshot_id].read
    assert read is not None
    return read.rows


# --------------------------------------------------------------------------------------------
# The keys themselves
# --------------------------------------------------------------------------------------------


def test_every_nan_is_one_key_and_signed_zeros_are_two() -> None:
    nans = [math.nan, double(NEGATIVE_NAN_BITS), double(0x7FF0000000000001), -math.nan]
    assert len({raw_bits(n) for n in nans}) >= 3, "the NaNs must differ in their bits"
    assert {float_bits(n) for n in nans} == {CANONICAL_NAN_BITS_64}
    assert len({value_key(n) for n in nans}) == 1
    assert value_key(-0.0) != value_key(0.0)
    assert float_bits(-0.0) == -(1 << 63) and float_bits(0.0) == 0  # Java's long
    assert value_key(1.5) == FloatBits(float_bits(1.5)) and float_bits(1.5) == raw_bits(1.5)
    # A float key is never another type's value, nor is None.
    assert value_key(0.0) != 0 and value_key(None) is None and value_key("a") == "a"


def test_partition_keys_follow_java_where_records_do_not() -> None:
    a, b = Record(math.nan, "a", None), Record(double(NEGATIVE_NAN_BITS), "a", None)
    assert a != b  # pyiceberg's Record equality: NaN is not NaN
    assert same_partition(a, b) and hash(partition_key(a)) == hash(partition_key(b))
    assert Record(-0.0) == Record(0.0)  # ... and -0.0 is 0.0
    assert not same_partition(Record(-0.0), Record(0.0))
    assert same_partition(None, Record())
    assert not same_partition(Record(None), Record(0.0))
    nested_a, nested_b = Record(1, Record(math.nan)), Record(1, Record(double(NEGATIVE_NAN_BITS)))
    assert same_partition(nested_a, nested_b)
    assert not same_partition(Record(1, Record(-0.0)), Record(1, Record(0.0)))
    assert len({partition_key(Record(math.nan)) for _ in range(3)}) == 1


@pytest.mark.parametrize(
    ("kind", "floats", "signed", "nan_bits", "negative_nan"),
    [
        (pa.float64(), np.float64, np.int64, CANONICAL_NAN_BITS_64, NEGATIVE_NAN_BITS),
        (pa.float32(), np.float32, np.int32, CANONICAL_NAN_BITS_32, NEGATIVE_NAN_BITS_32),
    ],
)
def test_canonical_arrays_fold_nans_and_keep_signed_zeros_and_nulls(
    kind: pa.DataType, floats: type, signed: type, nan_bits: int, negative_nan: int
) -> None:
    unsigned = np.dtype(signed).str.replace("i", "u")
    patterns = np.array([nan_bits, negative_nan, nan_bits + 1], dtype=unsigned)
    nans = pa.array(patterns.view(floats), kind)
    values = pa.concat_arrays([nans, pa.array([-0.0, 0.0, None, 1.5], kind)])

    canonical = canonical_array(values)

    assert canonical.type == pa.from_numpy_dtype(np.dtype(signed))
    as_signed = np.array([nan_bits], unsigned).view(signed)[0]
    negative_zero, one_and_a_half = np.array([-0.0, 1.5], floats).view(signed)
    assert canonical.to_pylist() == [
        as_signed,
        as_signed,
        as_signed,
        negative_zero,
        0,
        None,
        one_and_a_half,
    ]
    # Sliced and chunked arrays give the same keys.
    assert canonical_array(values.slice(1)).to_pylist() == canonical.to_pylist()[1:]
    chunked = pa.chunked_array([values.slice(0, 4), values.slice(4)])
    assert canonical_array(chunked).to_pylist() == canonical.to_pylist()
    assert canonical_array(pa.array([1, 2])).to_pylist() == [1, 2]


# --------------------------------------------------------------------------------------------
# Planning: deletes in a NaN partition, NaN partitions compacted
# --------------------------------------------------------------------------------------------


def _nan_table(catalog: Catalog, files: int = 3, kind: str = FIELD_IDS) -> Table:
    """``files`` files of 10 rows in partition x = NaN, 2 files in x = 1.0; of ``kind``."""
    table = catalog.create_table(
        TABLE, SCHEMA, partition_spec=BY_X, properties={"format-version": "2"}
    )
    for number in range(files + 2):
        x = math.nan if number < files else 1.0
        if kind == IMPORTED:
            append_rows(table, rows(10 * number, [x] * 10))
        else:
            append_file(table, rows(10 * number, [x] * 10), x)
    return catalog.load_table(TABLE)


def test_deletes_in_a_nan_partition_are_applied_not_dropped(
    catalog: Catalog, java_reader: JavaReader, file_kind: str
) -> None:
    """A partition-scoped position delete (naming two files, as Spark writes them) and an
    equality delete in partition x = NaN: applied by the rewrite, their rows stay deleted."""
    table = _nan_table(catalog, kind=file_kind)
    first, second, third = nan_files(table)
    position = write_position_delete_file(table, {first: [2], second: [3, 4]})
    equality = write_equality_delete_file(
        table, ["id"], [(25,)], spec_id=0, partition=third.partition
    )
    table = commit_delete_files(table, [position, equality])
    parent = table.current_snapshot().snapshot_id
    before = java_rows(table, parent)
    assert before.total() == 50 - 4  # Java applies both deletes

    result, after = run_compaction(catalog, TABLE, rewrite_all=True)

    assert result.to_dict()["deleted_rows_applied"] == 4
    assert live_delete_files(after) == {}
    assert len(nan_files(after)) == 1  # the partition's rows were rewritten together
    current = after.current_snapshot().snapshot_id
    assert java_rows(after, current) == before


def test_rewrite_deletes_merges_the_position_deletes_of_a_nan_partition(
    catalog: Catalog, java_reader: JavaReader
) -> None:
    table = _nan_table(catalog, files=2)
    first, second = nan_files(table)
    for positions in ([0, 1], [2, 3]):
        delete_file = write_position_delete_file(table, {first: positions, second: positions})
        table = commit_delete_files(table, [delete_file])
    before = java_rows(table, table.current_snapshot().snapshot_id)
    assert before.total() == 40 - 8

    result = rewrite_position_deletes(table, TABLE)

    summary = result.to_dict()
    assert summary["skipped"] == {}
    assert summary["files_removed"] == 2 and summary["files_added"] == 1
    after = catalog.load_table(TABLE)
    assert len(live_delete_files(after)) == 1
    assert java_rows(after, after.current_snapshot().snapshot_id) == before


def test_several_files_of_a_nan_partition_are_compacted(catalog: Catalog, file_kind: str) -> None:
    _nan_table(catalog, files=4, kind=file_kind)

    _, after, _ = compact_and_verify(catalog, TABLE)

    assert len(nan_files(after)) == 1
    assert sum(f.record_count for f in nan_files(after)) == 40


# --------------------------------------------------------------------------------------------
# Equality deletes: NaN of any payload, signed zeros apart
# --------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("file_kind")
def test_an_equality_delete_of_nan_matches_nan_of_any_payload(
    catalog: Catalog, java_reader: JavaReader
) -> None:
    """Deletes of x = NaN (0xfff8...) and y = NaN (0xffc00000) against data NaNs written as
    Java's canonical NaN; a delete of -0.0 leaves 0.0 alone."""
    schema = Schema(*SCHEMA.fields, NestedField(3, "y", FloatType(), required=False))
    table = catalog.create_table(TABLE, schema, properties={"format-version": "2"})
    xs, ys = [math.nan, 1.0, -0.0, 0.0], [1.0, math.nan, 2.0, 3.0]
    for commit in range(2):
        ids = range(20 * commit, 20 * commit + 20)
        append_rows(
            table,
            pa.table(
                {
                    "id": pa.array(ids, pa.int64()),
                    "x": pa.array([xs[i % 4] for i in ids], pa.float64()),
                    "y": pa.array([ys[i % 4] for i in ids], pa.float32()),
                },
                schema=schema.as_arrow(),
            ),
        )
    data_file = next(iter(live_data_files(table).values()))
    with table.io.new_input(data_file.file_path).open() as stream:
        stored = pq.read_table(stream)
    assert raw_bits(stored.column("x")[0].as_py()) == CANONICAL_NAN_BITS_64
    x_keys = pa.table({"x": pa.array([double(NEGATIVE_NAN_BITS), -0.0], pa.float64())})
    y_nan = np.array([NEGATIVE_NAN_BITS_32], np.uint32).view(np.float32)
    y_keys = pa.table({"y": pa.array(y_nan, pa.float32())})
    written = [
        delete_files.write_equality_delete_file(table, keys, spec_id=0, partition=Record())
        for keys in (x_keys, y_keys)
    ]
    with table.io.new_input(written[0].file_path).open() as stream:
        x_stored = pq.read_table(stream).column("x").combine_chunks()
    assert x_stored.view(pa.uint64())[0].as_py() == NEGATIVE_NAN_BITS
    table = commit_delete_files(table, written)
    parent = table.current_snapshot().snapshot_id
    before = java_rows(table, parent)
    assert before.total() == 40 - 30  # Java: each NaN is every NaN; -0.0 is not 0.0

    result, after = run_compaction(catalog, TABLE)

    assert result.to_dict()["deleted_rows_applied"] == 30
    assert live_delete_files(after) == {}
    assert java_rows(after, after.current_snapshot().snapshot_id) == before


# --------------------------------------------------------------------------------------------
# --output-spec-id: one partition per value, one file per partition
# --------------------------------------------------------------------------------------------


def _unpartitioned_then_by_x(catalog: Catalog, batches: list[pa.Table]) -> Table:
    """Files of spec 0 (unpartitioned), then the spec becomes identity(x) (spec 1)."""
    table = catalog.create_table(TABLE, SCHEMA, properties={"format-version": "2"})
    for batch in batches:
        append_rows(table, batch)
    with table.update_spec() as update:
        update.add_identity("x")
    return catalog.load_table(TABLE)


@pytest.mark.usefixtures("file_kind")
def test_output_spec_files_zero_under_zero_and_negative_zero_under_negative_zero(
    catalog: Catalog, java_reader: JavaReader
) -> None:
    table = _unpartitioned_then_by_x(
        catalog, [rows(0, [-0.0, 0.0, 0.0, -0.0] * 5), rows(20, [0.0, -0.0] * 10)]
    )

    result, after = run_compaction(catalog, TABLE, output_spec_id=1)

    assert result.to_dict()["failed_groups"] == []
    live = list(live_data_files(after).values())
    assert sorted(float_bits(f.partition[0]) for f in live) == [-(1 << 63), 0]
    for data_file in live:
        assert_rows_match_partition(after, data_file)
    # Java reads x from the partition value: 20 rows of 0.0 and 20 of -0.0, as written.
    current = after.current_snapshot().snapshot_id
    rows_read = java_rows(after, current)
    assert sum(n for row, n in rows_read.items() if row.endswith(",0]")) == 20
    assert sum(n for row, n in rows_read.items() if row.endswith(",-0]")) == 20
    assert_java_reads_same(after, snapshot_ids=[current, table.current_snapshot().snapshot_id])


@pytest.mark.usefixtures("file_kind")
def test_output_spec_writes_one_file_per_nan_partition(
    catalog: Catalog, java_reader: JavaReader
) -> None:
    """4 files of 100 rows, half of them NaN (two payloads): one file per partition."""
    xs = [math.nan, 2.0, double(NEGATIVE_NAN_BITS), 2.0] * 25
    table = _unpartitioned_then_by_x(catalog, [rows(100 * n, xs) for n in range(4)])

    result, after = run_compaction(catalog, TABLE, output_spec_id=1)

    assert result.to_dict()["failed_groups"] == []
    assert len(live_data_files(after)) == 2
    assert sum(f.record_count for f in nan_files(after)) == 200
    for data_file in live_data_files(after).values():
        assert_rows_match_partition(after, data_file)
    current = after.current_snapshot().snapshot_id
    assert_java_reads_same(after, snapshot_ids=[current, table.current_snapshot().snapshot_id])


# --------------------------------------------------------------------------------------------
# The committer's checks against concurrent commits
# --------------------------------------------------------------------------------------------


def test_a_concurrent_position_delete_in_a_nan_partition_refuses_its_group(
    catalog: Catalog, java_reader: JavaReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _nan_table(catalog)
    first, second, _ = nan_files(table)

    def delete_first(table: Table, *args: object, **kwargs: object):
        other = catalog.load_table(TABLE)
        position = write_position_delete_file(other, {first: [0], second: [1]})
        commit_delete_files(other, [position])
        return commit_replace(table, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(compaction, "commit_replace", delete_first)
    result, after = run_compaction(catalog, TABLE)

    refused = result.to_dict()["failed_groups"]
    assert len(refused) == 1 and refused[0]["kind"] == "conflict"
    assert "position delete" in refused[0]["reason"]
    assert {f.file_path for f in nan_files(after)} >= {first.file_path, second.file_path}
    assert len(live_data_files(after)) == 3 + 1  # the x = 1.0 group was committed
    current = after.current_snapshot().snapshot_id
    assert java_rows(after, current).total() == 50 - 2


def test_a_concurrent_equality_delete_in_a_nan_partition_refuses_the_move(
    catalog: Catalog, java_reader: JavaReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Moved into spec 1, the rows of x = NaN would escape a delete scoped to spec 0's NaN."""
    table = _nan_table(catalog, files=2)
    with table.update_spec() as update:
        update.add_field("id", BucketTransform(2), "id_bucket")
    victim = nan_files(catalog.load_table(TABLE))[0]

    def delete_first(table: Table, *args: object, **kwargs: object):
        other = catalog.load_table(TABLE)
        equality = write_equality_delete_file(
            other, ["id"], [(3,)], spec_id=0, partition=victim.partition
        )
        commit_delete_files(other, [equality])
        return commit_replace(table, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(compaction, "commit_replace", delete_first)
    with pytest.raises(CommitConflictError, match="equality delete .* for the partition of input"):
        run_compaction(catalog, TABLE, output_spec_id=1)

    after = catalog.load_table(TABLE)
    assert victim.file_path in live_data_files(after)
    assert {f.spec_id for f in live_data_files(after).values()} == {0}
    current = after.current_snapshot().snapshot_id
    assert java_rows(after, current).total() == 40 - 1


@pytest.mark.usefixtures("file_kind")
def test_double_partition_values_keep_every_bit_through_a_rewrite(
    catalog: Catalog, java_reader: JavaReader
) -> None:
    """Iceberg Java takes an identity-partitioned column's values from the manifest: a value
    rounded on the way through compactor would change the rows every engine reads."""
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "x", DoubleType(), required=False),
    )
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "x"))
    table = catalog.create_table("db.doubles", schema, partition_spec=spec)
    values = [0.1, 1.7976931348623157e308, 5e-324, -2.5]
    for start in (0, 10):
        ids = list(range(start, start + len(values)))
        append_rows(table, pa.table({"id": ids, "x": values}, schema.as_arrow()))
    before = java_read(table).rows()

    result, after = run_compaction(catalog, "db.doubles", rewrite_all=True)

    assert len(result.committed_groups) == len(values)
    assert java_read(after).rows() == before
    partitions = {struct.pack("<d", f.partition[0]) for f in live_data_files(after).values()}
    assert partitions == {struct.pack("<d", v) for v in values}
    assert_java_reads_same(after)
