"""Manifest entries decoded for planning (``compactor.iceberg.manifest_decoder``).

Every entry must read back as pyiceberg reads it (``manifest_entries``), field by field and
with the same inherited values, but for the column metrics (kept only for the columns asked
for) and ``split_offsets``: data and delete manifests of format versions 1, 2 and 3, partition
values of many types (NaN, -0.0 and 0.0, null, void fields), v3 lineage and deletion vectors.
"""

from __future__ import annotations

import math
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    DATA_FILE_TYPE,
    MANIFEST_LIST_FILE_SCHEMAS,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, IdentityTransform, VoidTransform
from pyiceberg.typedef import Record
from pyiceberg.types import (
    BinaryType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    UUIDType,
)

from compactor.iceberg.manifest_decoder import METRIC_FIELD_IDS, planning_entries
from compactor.iceberg.pyiceberg_compat import manifest_entries, manifest_writer
from compactor.iceberg.value_keys import partition_key

SNAPSHOT_ID = 7_000_000_000_000_000_001
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "x", DoubleType()),
    NestedField(3, "f", FloatType()),
    NestedField(4, "name", StringType()),
    NestedField(5, "day", DateType()),
    NestedField(6, "price", DecimalType(9, 2)),
    NestedField(7, "u", UUIDType()),
    NestedField(8, "bin", BinaryType()),
    NestedField(9, "ts", TimestampType()),
)
SPEC = PartitionSpec(
    *[
        PartitionField(source, 1000 + i, transform, f"p{i}")
        for i, (source, transform) in enumerate(
            [
                (2, IdentityTransform()),
                (3, IdentityTransform()),
                (4, IdentityTransform()),
                (5, IdentityTransform()),
                (6, IdentityTransform()),
                (7, IdentityTransform()),
                (8, IdentityTransform()),
                (9, DayTransform()),
                (1, VoidTransform()),
            ]
        )
    ],
    spec_id=2,
)
PARTITIONS = [
    Record(math.nan, -0.0, "a", 19_000, Decimal("1.25"), uuid.UUID(int=7), b"\x00", 20_000, None),
    Record(-0.0, 0.0, "b", -1, Decimal("-0.01"), uuid.UUID(int=0), b"", 0, None),
    Record(0.0, math.nan, "", 0, Decimal("0.00"), None, None, None, None),
    Record(*[None] * 9),
]
OWN_FIELDS = ("split_offsets",)
NAMES = [f.name for f in DATA_FILE_TYPE[3].fields]
CASES = [
    (1, ManifestContent.DATA),
    (2, ManifestContent.DATA),
    (2, ManifestContent.DELETES),
    (3, ManifestContent.DATA),
    (3, ManifestContent.DELETES),
]


def _data_file(i: int, version: int, content: DataFileContent) -> DataFile:
    columns = range(1, 10 if i % 4 else 3)
    values: dict[str, Any] = {
        "content": content,
        "file_path": f"s3://bucket/t/data/file-{i:05d}-ü.parquet",
        "file_format": FileFormat.PARQUET,
        "partition": PARTITIONS[i % len(PARTITIONS)],
        "record_count": i * 1_000_003 % 2**40,
        "file_size_in_bytes": 4 + i * 7919,
        "column_sizes": {c: c * 100 + i for c in columns},
        "value_counts": {c: i for c in columns},
        "null_value_counts": {c: (i + c) % 3 for c in columns} if i % 5 else {},
        "nan_value_counts": {2: i % 2, 3: 0} if i % 3 else None,
        "lower_bounds": {c: bytes([c, i % 256]) for c in columns},
        "upper_bounds": {c: bytes([255 - c]) * 20 for c in columns} if i % 7 else {},
        "key_metadata": b"km" if i % 6 == 0 else None,
        "split_offsets": [4, 4 + i * 10] if i % 2 else None,
        "equality_ids": [1, 4] if content == DataFileContent.EQUALITY_DELETES else None,
        "sort_order_id": i % 2 if i % 3 else None,
    }
    if version == 3:
        dv = content == DataFileContent.POSITION_DELETES and i % 2 == 0
        values |= {
            "file_format": FileFormat.PUFFIN if dv else FileFormat.PARQUET,
            "first_row_id": i * 1000 if content == DataFileContent.DATA and i % 3 else None,
            "referenced_data_file": f"s3://bucket/t/data/target-{i}.parquet" if dv else None,
            "content_offset": 4 + i * 50 if dv else None,
            "content_size_in_bytes": 42 + i if dv else None,
        }
    data_file = DataFile.from_args(_table_format_version=3 if version == 3 else 2, **values)
    data_file.spec_id = SPEC.spec_id
    return data_file


def _manifest(tmp_path: Path, version: int, content: ManifestContent) -> ManifestFile:
    """A manifest of 40 entries: ADDED (some inheriting sequence numbers), EXISTING, DELETED."""
    kinds = (
        [DataFileContent.DATA]
        if content == ManifestContent.DATA
        else [DataFileContent.POSITION_DELETES, DataFileContent.EQUALITY_DELETES]
    )
    io = PyArrowFileIO()
    output = io.new_output(str(tmp_path / f"m-{version}-{content.name}.avro"))
    writer = manifest_writer(content, version, SPEC, SCHEMA, output, SNAPSHOT_ID, "deflate")
    with writer:
        for i in range(40):
            status = ManifestEntryStatus((i % 3 + 1) % 3)
            added = status == ManifestEntryStatus.ADDED
            writer.add_entry(
                ManifestEntry.from_args(
                    status=status,
                    snapshot_id=SNAPSHOT_ID if added else 100 + i,
                    sequence_number=None if added and i % 2 else i % 17,
                    file_sequence_number=None if added and i % 2 else i % 13,
                    data_file=_data_file(i, version, kinds[i % len(kinds)]),
                )
            )
    manifest = writer.to_manifest_file()
    manifest.sequence_number = manifest.min_sequence_number = 21
    return manifest


def _assert_same_partition(compact: Record, full: Record) -> None:
    assert partition_key(compact) == partition_key(full)  # every NaN one value, -0.0 not 0.0
    assert len(compact) == len(full)
    for i in range(len(full)):
        assert type(compact[i]) is type(full[i])


def _assert_decoded_as_pyiceberg(
    compact: ManifestEntry, full: ManifestEntry, metric_ids: frozenset[int]
) -> None:
    assert [compact[i] for i in range(4)] == [full[i] for i in range(4)]
    a, b = compact.data_file, full.data_file
    assert len(a) == len(b)
    assert a.spec_id == b.spec_id
    _assert_same_partition(a.partition, b.partition)
    for position, field in enumerate(DATA_FILE_TYPE[3].fields[: len(a)]):
        if field.name == "partition":
            continue
        if field.field_id in METRIC_FIELD_IDS:
            full_metrics = b[position]
            kept = (
                None
                if full_metrics is None or not metric_ids
                else {k: v for k, v in dict(full_metrics).items() if k in metric_ids}
            )
            assert a[position] == kept, field.name
        elif field.name in OWN_FIELDS:
            assert a[position] is None
        else:
            assert a[position] == b[position], field.name


@pytest.mark.parametrize(("version", "content"), CASES)
@pytest.mark.parametrize("metric_ids", [frozenset(), frozenset({2, 4})])
def test_entries_decode_as_pyiceberg_reads_them_without_metrics(
    tmp_path: Path, version: int, content: ManifestContent, metric_ids: frozenset[int]
) -> None:
    manifest = _manifest(tmp_path, version, content)
    io = PyArrowFileIO()
    full = manifest_entries(io, manifest, version)
    compact = planning_entries(io, manifest, version, metric_ids)
    assert len(compact) == len(full) > 0
    assert all(e.status != ManifestEntryStatus.DELETED for e in compact)
    for a, b in zip(compact, full, strict=True):
        _assert_decoded_as_pyiceberg(a, b, metric_ids)


def test_v3_data_files_inherit_first_row_ids_as_pyiceberg_entries_do(tmp_path: Path) -> None:
    written = _manifest(tmp_path, 3, ManifestContent.DATA)
    fields = [f.name for f in MANIFEST_LIST_FILE_SCHEMAS[3].fields]
    values = [written[i] if i < len(written) else None for i in range(len(fields))]
    values[fields.index("first_row_id")] = 5_000
    manifest = ManifestFile(*values)
    io = PyArrowFileIO()
    first_row_id = NAMES.index("first_row_id")
    full = [e.data_file[first_row_id] for e in manifest_entries(io, manifest, 3)]
    compact = [e.data_file[first_row_id] for e in planning_entries(io, manifest, 3)]
    assert compact == full
    assert 5_000 in compact  # inherited by a file without one


def test_metrics_of_a_v2_manifest_read_as_a_v3_table_are_kept_apart(tmp_path: Path) -> None:
    """A v2 manifest of a table upgraded to v3 reads with v3's fields (None), as pyiceberg's."""
    manifest = _manifest(tmp_path, 2, ManifestContent.DATA)
    io = PyArrowFileIO()
    full = manifest_entries(io, manifest, 3)
    compact = planning_entries(io, manifest, 3)
    assert len(compact[0].data_file) == len(full[0].data_file) == len(NAMES)
    for a, b in zip(compact, full, strict=True):
        _assert_decoded_as_pyiceberg(a, b, frozenset())
