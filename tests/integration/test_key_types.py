"""Column types as keys: of equality deletes, sorts, z-orders and partitions; judged by Java.

Equality deletes keyed on uuid, decimal and date columns, with null keys on both sides (a null
key deletes the rows whose key is null); uuid columns sorted (in Iceberg Java's order of
uuids), z-ordered and moved into an identity(uuid) partition spec; partition transforms whose
result type is not their source's (the bucket of a time, the truncation of binary). Iceberg
Java must read exactly the rows it read before the run.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import BucketTransform, TruncateTransform
from pyiceberg.typedef import Record
from pyiceberg.types import (
    BinaryType,
    DateType,
    DecimalType,
    IcebergType,
    LongType,
    NestedField,
    TimeType,
    UUIDType,
)

from support.deletes import commit_delete_files, write_equality_delete_file
from support.java_reader import java_read
from support.runs import compact_and_verify, run_compaction
from support.tables import (
    append_rows,
    assert_rows_match_partition,
    live_data_files,
    live_delete_files,
    read_data_file,
)

# Every test here holds on both read paths (compactor.rewrite.bulk_read and Iceberg's).
pytestmark = pytest.mark.usefixtures("read_path")

TABLE = "db.keys"
# An odd 128-bit multiplier: the uuids it spreads have either half's top bit set or not, where
# Java's order of uuids (two signed longs) and the order of their bytes disagree.
SPREAD = 0x9E3779B97F4A7C15F39CC0605CEDC835


def _uuid(n: int) -> uuid.UUID:
    return uuid.UUID(int=n * SPREAD % 2**128)


KEY_TYPES: dict[str, tuple[IcebergType, Callable[[int], Any]]] = {
    "uuid": (UUIDType(), lambda n: _uuid(n).bytes),
    "decimal": (DecimalType(9, 2), lambda n: Decimal(n * 137 - 500).scaleb(-2)),
    "date": (DateType(), lambda n: dt.date(1969, 12, 25) + dt.timedelta(days=n)),
}


def _create(catalog: Catalog, *columns: tuple[str, IcebergType]) -> Table:
    """A format-2 table of an ``id`` and ``columns``, all optional."""
    fields = [
        NestedField(i, name, kind, required=False) for i, (name, kind) in enumerate(columns, 2)
    ]
    schema = Schema(NestedField(1, "id", LongType(), required=False), *fields)
    return catalog.create_table(TABLE, schema, properties={"format-version": "2"})


def _append(table: Table, rows: list[dict[str, Any]]) -> Table:
    append_rows(table, pa.Table.from_pylist(rows, table.schema().as_arrow()))
    return table.refresh()


def _assert_java_reads_the_same_rows(table: Table, before_id: int) -> int:
    """Java reads the same rows of the current snapshot as of ``before_id``; returns how many."""
    current = table.metadata.current_snapshot_id
    assert current is not None and current != before_id
    java = java_read(table, [before_id, current])
    before, after = java.read(before_id), java.read(current)
    assert after.rows == before.rows
    return before.row_count


@pytest.mark.usefixtures("file_kind")
@pytest.mark.parametrize("kind", list(KEY_TYPES))
def test_equality_deletes_on_each_key_type_null_keys_included(
    catalog: Catalog, java_reader: object, read_path: str, kind: str
) -> None:
    key_type, value = KEY_TYPES[kind]
    table = _create(catalog, ("k", key_type))

    def rows(first: int) -> list[dict[str, Any]]:  # every fourth key null, others of ten values
        return [
            {"id": i, "k": None if i % 4 == 0 else value(i % 10)} for i in range(first, first + 40)
        ]

    for first in (0, 40, 80):
        table = _append(table, rows(first))
    delete = write_equality_delete_file(
        table, ["k"], [(value(3),), (None,)], spec_id=0, partition=Record()
    )
    table = commit_delete_files(table, [delete])
    table = _append(table, rows(120))  # the deleted keys again, newer than the delete: they stay
    before_id = table.metadata.current_snapshot_id
    assert before_id is not None
    stored = sum(f.record_count for f in live_data_files(table).values())

    result, after = run_compaction(catalog, TABLE)

    assert result.to_dict()["failed_groups"] == []
    # The file newer than the delete has none to apply: read in bulk when bulk reads are on.
    assert result.to_dict()["bulk_read_files"] == (1 if read_path == "bulk" else 0)
    assert live_delete_files(after) == {}
    # Of the 120 rows older than the delete, 30 have a null key and 12 the deleted one.
    assert result.to_dict()["deleted_rows_applied"] == 42
    assert _assert_java_reads_the_same_rows(after, before_id) == stored - 42


def _uuid_table(catalog: Catalog, uuid_of: Callable[[int], uuid.UUID]) -> Table:
    """Six files of 50 rows: ids, uuids (``uuid_of(id)``, one in seven null) and longs."""
    table = _create(catalog, ("u", UUIDType()), ("x", LongType()))
    for first in range(0, 300, 50):
        table = _append(
            table,
            [
                {"id": i, "u": None if i % 7 == 0 else uuid_of(i).bytes, "x": i * i % 97}
                for i in range(first, first + 50)
            ],
        )
    return table


def _java_order(value: uuid.UUID) -> tuple[int, int]:
    """``java.util.UUID.compareTo``'s order: the two halves as signed longs."""
    return (
        int.from_bytes(value.bytes[:8], "big", signed=True),
        int.from_bytes(value.bytes[8:], "big", signed=True),
    )


def test_a_uuid_column_sorts_in_javas_order(catalog: Catalog, java_reader: object) -> None:
    _uuid_table(catalog, _uuid)
    written = {_uuid(n) for n in range(300)}
    assert sorted(written, key=_java_order) != sorted(written, key=lambda u: u.bytes)

    _, table, _ = compact_and_verify(catalog, TABLE, strategy="sort", sort_order="u")

    (data_file,) = live_data_files(table).values()
    values = read_data_file(table, data_file).column("u").to_pylist()
    nulls = values.count(None)
    assert nulls > 0 and values[:nulls] == [None] * nulls
    assert values[nulls:] == sorted(values[nulls:], key=_java_order)


def test_uuids_sharing_their_first_bytes_zorder(catalog: Catalog, java_reader: object) -> None:
    """As time-ordered (version 7) uuids written close together do: z-order takes the bytes
    after the prefix the group's bounds share."""
    _uuid_table(catalog, lambda n: uuid.UUID(bytes=b"\x01\x9a\x3c" + _uuid(n).bytes[3:]))
    compact_and_verify(catalog, TABLE, strategy="zorder", zorder="u, x")


@pytest.mark.parametrize(
    ("column", "transform", "partitions"),
    [
        ("u", None, 5),  # identity: four uuids and null
        ("t", BucketTransform(2), 3),  # two buckets and null: an int from a time
        ("b", TruncateTransform(1), 4),  # three first bytes and null: binary
    ],
    ids=["identity-uuid", "bucket-time", "truncate-binary"],
)
def test_output_spec_id_partitions_by_a_column_of_each_key_type(
    catalog: Catalog,
    java_reader: object,
    column: str,
    transform: BucketTransform | TruncateTransform | None,
    partitions: int,
) -> None:
    table = _create(catalog, ("u", UUIDType()), ("t", TimeType()), ("b", BinaryType()))
    for first in range(0, 240, 40):
        rows = [
            {
                "id": i,
                "u": None if i % 5 == 0 else _uuid(i % 4).bytes,
                "t": None if i % 5 == 0 else dt.time(i % 24, i % 60),
                "b": None if i % 5 == 0 else b"abc"[i % 3 :] + bytes([i % 256]),
            }
            for i in range(first, first + 40)
        ]
        table = _append(table, rows)
    with table.update_spec() as update:
        if transform is None:
            update.add_identity(column)
        else:
            update.add_field(column, transform, "p")
    table = table.refresh()
    before_id = table.metadata.current_snapshot_id
    assert before_id is not None

    result, after = run_compaction(catalog, TABLE, output_spec_id=1)

    assert result.to_dict()["failed_groups"] == []
    live = list(live_data_files(after).values())
    assert {f.spec_id for f in live} == {1}
    assert len({tuple(f.partition) for f in live}) == partitions
    for data_file in live:
        assert_rows_match_partition(after, data_file)
    assert _assert_java_reads_the_same_rows(after, before_id) == 240
