"""Compaction keeps rows identical across partition transforms and partition spec evolution."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    TruncateTransform,
)
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestampType

from support.runs import compact_and_verify
from support.tables import (
    FIELD_IDS,
    IMPORTED,
    append_rows,
    assert_rows_match_partition,
    files_by_partition,
    live_data_files,
    new_data_files,
)

# Every row test here runs with bulk reading on and off, on files with field ids and, for a few
# of its cases, on imported files without them.
pytestmark = pytest.mark.usefixtures("read_path", "file_kind")

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "ts", TimestampType(), required=False),
    NestedField(3, "category", StringType(), required=False),
    NestedField(4, "name", StringType(), required=False),
    NestedField(5, "value", DoubleType(), required=False),
)
START = dt.datetime(2026, 3, 1, 22, 0, 0)
CATEGORIES = ("alpha", "beta", "gamma")
APPENDS = 4
ROWS = 300


def batch(commit: int, rows: int = ROWS) -> pa.Table:
    """Rows spread over 3 categories, 4 hours across a day boundary and several name prefixes."""
    ids = range(commit * rows, (commit + 1) * rows)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "ts": pa.array(
                [
                    None if i % 53 == 0 else START + dt.timedelta(seconds=(i * 37) % 14400)
                    for i in ids
                ],
                pa.timestamp("us"),
            ),
            "category": [None if i % 41 == 0 else CATEGORIES[i % 3] for i in ids],
            "name": [f"{'abcd'[i % 4]}{'xy'[i % 2]}-name-{i}" for i in ids],
            "value": [float("nan") if i % 31 == 0 else i / 3 for i in ids],
        },
        schema=SCHEMA.as_arrow(),
    )


def spec(*fields: PartitionField) -> PartitionSpec:
    return PartitionSpec(*fields) if fields else UNPARTITIONED_PARTITION_SPEC


SPECS = {
    "unpartitioned": spec(),
    "identity": spec(PartitionField(3, 1000, IdentityTransform(), "category")),
    "day": spec(PartitionField(2, 1000, DayTransform(), "ts_day")),
    "hour": spec(PartitionField(2, 1000, HourTransform(), "ts_hour")),
    "bucket": spec(PartitionField(1, 1000, BucketTransform(4), "id_bucket")),
    "truncate": spec(PartitionField(4, 1000, TruncateTransform(1), "name_trunc")),
    "identity+bucket": spec(
        PartitionField(3, 1000, IdentityTransform(), "category"),
        PartitionField(1, 1001, BucketTransform(3), "id_bucket"),
    ),
}


# Imported files on a few specs: one add_files registers by its column bounds (day), one by
# where the file is (bucket), and no partition at all.
IMPORTED_SPECS = ("unpartitioned", "day", "identity+bucket")


@pytest.mark.parametrize(
    ("spec_name", "file_kind"),
    [pytest.param(name, FIELD_IDS, id=name) for name in SPECS]
    + [pytest.param(name, IMPORTED, id=f"{name}-imported") for name in IMPORTED_SPECS],
    indirect=["file_kind"],
)
def test_partition_transforms(catalog: Catalog, spec_name: str) -> None:
    table = catalog.create_table("db.t", SCHEMA, partition_spec=SPECS[spec_name])
    for commit in range(APPENDS):
        append_rows(table, batch(commit))
    before = catalog.load_table("db.t")
    partitions_before = files_by_partition(before)
    assert max(partitions_before.values()) == APPENDS  # every partition is fragmented

    _, after, _ = compact_and_verify(catalog, "db.t")

    # Every partition went down to one file, which holds only rows of that partition.
    partitions_after = files_by_partition(after)
    assert partitions_after.keys() == partitions_before.keys()
    assert set(partitions_after.values()) == {1}
    for data_file in new_data_files(before, after):
        assert data_file.spec_id == 0
        assert_rows_match_partition(after, data_file)


@pytest.mark.parametrize(
    ("format_version", "file_kind"),
    [
        pytest.param("1", FIELD_IDS, id="1"),
        pytest.param("2", FIELD_IDS, id="2"),
        pytest.param("2", IMPORTED, id="2-imported"),
    ],
    indirect=["file_kind"],
)
def test_partition_spec_evolution(catalog: Catalog, format_version: str) -> None:
    """Files written under four specs: each is compacted within its own spec and partition.

    (In v1 a removed partition field stays in the spec with a void transform.)
    """
    table = catalog.create_table("db.t", SCHEMA, properties={"format-version": format_version})
    commit = 0

    def append(times: int) -> None:
        nonlocal commit
        for _ in range(times):
            append_rows(table, batch(commit, 200))
            commit += 1

    append(3)  # spec 0: unpartitioned
    with table.update_spec() as update:
        update.add_identity("category")
    append(3)  # spec 1: category
    with table.update_spec() as update:
        update.add_field("ts", DayTransform(), "ts_day")
    append(3)  # spec 2: category, day(ts)
    with table.update_spec() as update:
        update.remove_field("category")
        update.add_field("id", BucketTransform(2), "id_bucket")
    append(3)  # spec 3: day(ts), bucket(id)

    before = catalog.load_table("db.t")
    assert {f.spec_id for f in live_data_files(before).values()} == {0, 1, 2, 3}
    voids = [f for f in before.spec().fields if str(f.transform) == "void"]
    assert len(voids) == (1 if format_version == "1" else 0)
    partitions_before = files_by_partition(before)

    _, after, _ = compact_and_verify(catalog, "db.t")

    # Old specs' files stay in their spec and partition; no partition keeps more than one file.
    partitions_after = files_by_partition(after)
    assert partitions_after.keys() == partitions_before.keys()
    assert set(partitions_after.values()) == {1}
    added = new_data_files(before, after)
    assert {f.spec_id for f in added} == {0, 1, 2, 3}
    for data_file in added:
        assert_rows_match_partition(after, data_file)
