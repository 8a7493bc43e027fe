"""Manifests written by compactor's Avro encoder (``compactor.iceberg.manifest_avro``).

Each manifest is compared with what pyiceberg's own Avro writer (one block per entry, as
compactor wrote manifests before) makes of the same entries: the same header, the same encoded
entries, the same ManifestFile. pyiceberg reads back what was written, field by field, and
Iceberg Java reads tables whose every manifest the encoder rewrote, and their compactions.
"""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.avro.codecs import KNOWN_CODECS
from pyiceberg.avro.file import AvroOutputFile
from pyiceberg.catalog import Catalog
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import (
    DATA_FILE_TYPE,
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestFile,
    ManifestWriter,
)
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation, Summary
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    TruncateTransform,
    VoidTransform,
)
from pyiceberg.typedef import Record
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from compactor.commit.snapshot_writer import add_existing
from compactor.iceberg import pyiceberg_compat
from compactor.iceberg.delete_files import commit_manifests
from compactor.iceberg.pyiceberg_compat import (
    manifest_entries,
    manifest_writer,
    snapshot_manifests,
)

from support.deletes import commit_delete_files, write_equality_delete_file
from support.encoding import read_varint, unzigzag
from support.java_reader import JavaReader, java_read
from support.java_writer import read_expected, write_cdc_table
from support.runs import run_compaction
from support.tables import live_data_files

SNAPSHOT_ID = 7_000_000_000_000_000_001
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "flag", BooleanType()),
    NestedField(3, "n", IntegerType()),
    NestedField(4, "f", FloatType()),
    NestedField(5, "d", DoubleType()),
    NestedField(6, "price", DecimalType(9, 2)),
    NestedField(7, "cost", DecimalType(9, 2)),  # a second decimal_9_2 in the Avro schema
    NestedField(8, "big", DecimalType(38, 10)),
    NestedField(9, "day", DateType()),
    NestedField(10, "tm", TimeType()),
    NestedField(11, "ts", TimestampType()),
    NestedField(12, "tstz", TimestamptzType()),
    NestedField(13, "name", StringType()),
    NestedField(14, "u", UUIDType()),
    NestedField(15, "fx", FixedType(4)),
    NestedField(16, "bin", BinaryType()),
)
# Every field's source column by name, with its transform: identities of every type, a void
# field (always null), and transforms whose result type is not their source's.
SPEC_FIELDS = [
    *((name, IdentityTransform()) for name in [f.name for f in SCHEMA.fields]),
    ("d", VoidTransform()),
    ("name", BucketTransform(4)),
    ("name", TruncateTransform(2)),
    ("ts", DayTransform()),
]
SPEC = PartitionSpec(
    *[
        PartitionField(SCHEMA.find_field(name).field_id, 1000 + i, transform, f"p{i}")
        for i, (name, transform) in enumerate(SPEC_FIELDS)
    ],
    spec_id=3,
)
# Partition values in SPEC's order (dates, times and timestamps as pyiceberg holds them).
PARTITIONS = [
    Record(
        *[7, True, -5, 1.5, -0.25, Decimal("12.34"), Decimal("-0.01")],
        *[Decimal("-1234567890123456789012345678.0123456789"), 19_000, 3_600_000_000],
        *[1_700_000_000_123_456, -1, "naïve 日本", uuid.UUID(int=2**127 + 5), b"\x00\xffab"],
        *[b"", None, 3, "na", 19_000],
    ),
    Record(*[None] * len(SPEC_FIELDS)),
    Record(
        *[-(2**63), False, 2**31 - 1, float("inf"), float("-inf"), Decimal("0.00")],
        *[Decimal("9999999.99"), Decimal("0E-10"), -1, 0, 0, 2**62, "", uuid.UUID(int=0)],
        *[b"\x00" * 4, b"\x01" * 300, None, 0, "", -1],
    ),
]
# The data file fields each format version stores.
STORED = {
    1: [f.name for f in DATA_FILE_TYPE[1].fields if f.name != "block_size_in_bytes"],
    2: [f.name for f in DATA_FILE_TYPE[2].fields],
    3: [f.name for f in DATA_FILE_TYPE[3].fields],
}
POSITIONS = {f.name: i for i, f in enumerate(DATA_FILE_TYPE[3].fields)}


def _data_file(i: int, version: int, content: DataFileContent) -> DataFile:
    """A file with stats of every kind, some empty, some null, and lineage fields for v3."""
    columns = range(1, 1 + len(SCHEMA.fields) if i % 4 else 3)
    values: dict[str, Any] = {
        "content": content,
        "file_path": f"s3://bucket/warehouse/db/t/data/p={i}/file-{i:05d}-ü.parquet",
        "file_format": FileFormat.PARQUET,
        "partition": PARTITIONS[i % len(PARTITIONS)],
        "record_count": i * 1_000_003 % 2**40,
        "file_size_in_bytes": 4 + i * 7919,
        "column_sizes": {c: c * 100 + i for c in columns},
        "value_counts": {c: i for c in columns},
        "null_value_counts": {c: (i + c) % 3 for c in columns} if i % 5 else {},
        "nan_value_counts": {4: i % 2, 5: 0} if i % 3 else None,
        "lower_bounds": {c: bytes([c, i % 256]) * (i % 3) for c in columns},
        "upper_bounds": {c: bytes([255 - c]) * 20 for c in columns} if i % 7 else {},
        "key_metadata": b"km" if i % 6 == 0 else None,
        "split_offsets": [4, 4 + i * 10] if i % 2 else None,
        "equality_ids": [1, 13] if content == DataFileContent.EQUALITY_DELETES else None,
        "sort_order_id": i % 2 if i % 3 else None,
    }
    if version == 3:
        dv = content == DataFileContent.POSITION_DELETES and i % 2 == 0
        values |= {
            "file_format": FileFormat.PUFFIN if dv else FileFormat.PARQUET,
            "first_row_id": i * 1000 if content == DataFileContent.DATA and i % 3 else None,
            "referenced_data_file": f"s3://bucket/data/target-{i}.parquet" if dv else None,
            "content_offset": 4 + i * 50 if dv else None,
            "content_size_in_bytes": 42 + i if dv else None,
        }
    data_file = DataFile.from_args(_table_format_version=3 if version == 3 else 2, **values)
    data_file.spec_id = SPEC.spec_id
    return data_file


def _entries(count: int, version: int, content: ManifestContent) -> list[ManifestEntry]:
    kinds = (
        [DataFileContent.DATA]
        if content == ManifestContent.DATA
        else [DataFileContent.POSITION_DELETES, DataFileContent.EQUALITY_DELETES]
    )
    entries = []
    for i in range(count):
        status = ManifestEntryStatus((i % 3 + 1) % 3)  # ADDED, DELETED, EXISTING, ...
        added = status == ManifestEntryStatus.ADDED
        entries.append(
            ManifestEntry.from_args(
                status=status,
                snapshot_id=SNAPSHOT_ID if added else 100 + i,
                sequence_number=None if added and i % 2 else i % 17,
                file_sequence_number=None if added and i % 2 else i % 13,
                data_file=_data_file(i, version, kinds[i % len(kinds)]),
            )
        )
    return entries


def _reference(writer: ManifestWriter) -> ManifestWriter:
    """``writer`` writing as compactor did before: pyiceberg's Avro writer, a block per entry."""

    class Reference(type(writer)):  # type: ignore[misc,valid-type]
        def new_writer(self) -> AvroOutputFile[ManifestEntry]:
            schema = self._with_partition(self.version)
            record = schema if self.version == 3 else self._with_partition(2)
            return AvroOutputFile[ManifestEntry](
                output_file=self._output_file,
                file_schema=schema,
                record_schema=record,
                schema_name="manifest_entry",
                metadata=self._meta,
            )

    writer.__class__ = Reference
    return writer


def _write(
    io: FileIO,
    path: Path,
    version: int,
    content: ManifestContent,
    entries: list[ManifestEntry],
    codec: str = "deflate",
    reference: bool = False,
) -> ManifestFile:
    writer = manifest_writer(
        content, version, SPEC, SCHEMA, io.new_output(str(path)), SNAPSHOT_ID, codec
    )
    if reference:
        _reference(writer)
    with writer:
        for entry in entries:
            writer.add_entry(entry)
    return writer.to_manifest_file()


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """An Avro long (zigzag-encoded) and the position after it."""
    value, pos = read_varint(data, pos)
    return unzigzag(value), pos


def _container(path: Path) -> tuple[list[tuple[str, str]], list[tuple[int, bytes]]]:
    """An Avro file's header metadata, in order, and its blocks: (entries, decompressed bytes)."""
    data = path.read_bytes()
    assert data[:4] == b"Obj\x01"
    meta: list[tuple[str, str]] = []
    count, pos = _varint(data, 4)
    while count:
        for _ in range(count):
            strings = []
            for _ in range(2):
                size, pos = _varint(data, pos)
                strings.append(data[pos : pos + size].decode())
                pos += size
            meta.append((strings[0], strings[1]))
        count, pos = _varint(data, pos)
    sync, pos = data[pos : pos + 16], pos + 16
    codec = KNOWN_CODECS[dict(meta)["avro.codec"]]  # type: ignore[index]
    blocks = []
    while pos < len(data):
        count, pos = _varint(data, pos)
        size, pos = _varint(data, pos)
        block, pos = data[pos : pos + size], pos + size
        assert data[pos : pos + 16] == sync
        pos += 16
        blocks.append((count, codec.decompress(block) if codec else block))
    return meta, blocks


def _read(io: FileIO, manifest: ManifestFile, version: int) -> list[ManifestEntry]:
    if version < 3:
        return manifest.fetch_manifest_entry(io, discard_deleted=False)
    return manifest_entries(io, manifest, version, discard_deleted=False)


def _value(data_file: DataFile, name: str) -> Any:
    value = data_file[POSITIONS[name]] if POSITIONS[name] < len(data_file) else None
    return dict(value) if name.endswith(("_counts", "_sizes", "_bounds")) and value else value


def _assert_reads_back(written: ManifestEntry, read: ManifestEntry, version: int) -> None:
    assert read.status == written.status
    assert read.snapshot_id == written.snapshot_id
    if version > 1 and written.sequence_number is not None:
        assert read.sequence_number == written.sequence_number
        assert read.file_sequence_number == written.file_sequence_number
    for name in STORED[version]:
        assert _value(read.data_file, name) == _value(written.data_file, name), name


CASES = [
    (1, ManifestContent.DATA),
    (2, ManifestContent.DATA),
    (2, ManifestContent.DELETES),
    (3, ManifestContent.DATA),
    (3, ManifestContent.DELETES),
]


@pytest.mark.parametrize(("version", "content"), CASES)
def test_entries_read_back_as_written_and_as_pyiceberg_wrote_them(
    tmp_path: Path, version: int, content: ManifestContent, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SPEC has a fixed partition field, encoded as the Avro spec says; compactor refuses tables
    # partitioned on a fixed column (tests/integration/test_fixed_partitions.py), not this encoding.
    monkeypatch.setattr(pyiceberg_compat, "refuse_fixed_partitions", lambda *_: None)
    io = PyArrowFileIO()
    entries = _entries(600, version, content)
    manifest = _write(io, tmp_path / "new.avro", version, content, entries)
    expected = _write(io, tmp_path / "old.avro", version, content, entries, reference=True)

    # The same ManifestFile (counts, sequence numbers, partition summaries), its real length.
    assert manifest.manifest_length == (tmp_path / "new.avro").stat().st_size
    assert [manifest[i] for i in range(2, len(manifest))] == [
        expected[i] for i in range(2, len(expected))
    ]
    assert manifest.added_files_count + manifest.existing_files_count > 0
    assert manifest.deleted_files_count > 0
    # The same header and the same encoded entries, many to a block.
    meta, blocks = _container(tmp_path / "new.avro")
    old_meta, old_blocks = _container(tmp_path / "old.avro")
    assert meta == old_meta
    assert dict(meta)["format-version"] == str(version)
    if version > 1:
        assert dict(meta)["content"] == content.name.lower()
    assert [count for count, _ in old_blocks] == [1] * len(entries)
    assert 1 < len(blocks) < len(entries) / 10
    assert sum(count for count, _ in blocks) == len(entries)
    assert b"".join(b for _, b in blocks) == b"".join(b for _, b in old_blocks)

    read = _read(io, manifest, version)
    assert len(read) == len(entries)
    for written, back in zip(entries, read, strict=True):
        _assert_reads_back(written, back, version)
    # Inherited values too: what pyiceberg reads equals what it reads of its own writer's file.
    reference = _read(io, expected, version)
    for back, old in zip(read, reference, strict=True):
        assert back._data[:4] == old._data[:4]
        names = list(POSITIONS) if version == 3 else STORED[2]
        assert [_value(back.data_file, n) for n in names] == [
            _value(old.data_file, n) for n in names
        ]


@pytest.mark.parametrize(
    ("codec", "avro_codec"),
    [("null", "null"), ("gzip", "deflate"), ("deflate", "deflate"), ("zstd", "zstandard")],
)
def test_the_table_codec_compresses_the_blocks(tmp_path: Path, codec: str, avro_codec: str) -> None:
    io = PyArrowFileIO()
    entries = _entries(200, 2, ManifestContent.DATA)
    manifest = _write(io, tmp_path / "m.avro", 2, ManifestContent.DATA, entries, codec)
    meta, blocks = _container(tmp_path / "m.avro")
    assert dict(meta)["avro.codec"] == avro_codec
    assert sum(count for count, _ in blocks) == len(entries)
    for written, back in zip(entries, _read(io, manifest, 2), strict=True):
        _assert_reads_back(written, back, 2)


def test_an_unknown_codec_is_refused(tmp_path: Path) -> None:
    entries = _entries(1, 2, ManifestContent.DATA)
    with pytest.raises(ValueError, match="Unsupported codec: lzo"):
        _write(PyArrowFileIO(), tmp_path / "m.avro", 2, ManifestContent.DATA, entries, "lzo")


def test_nothing_is_written_when_the_with_body_raises_or_adds_no_entry(
    tmp_path: Path,
) -> None:
    io = PyArrowFileIO()
    path = tmp_path / "m.avro"
    writer = manifest_writer(
        ManifestContent.DATA, 2, SPEC, SCHEMA, io.new_output(str(path)), SNAPSHOT_ID, "deflate"
    )
    with pytest.raises(RuntimeError, match="stop"), writer:
        writer.add_entry(_entries(1, 2, ManifestContent.DATA)[0])
        raise RuntimeError("stop")
    assert not path.exists()
    writer = manifest_writer(
        ManifestContent.DATA, 2, SPEC, SCHEMA, io.new_output(str(path)), SNAPSHOT_ID, "deflate"
    )
    with pytest.raises(ValueError, match="empty manifest"), writer:
        pass
    assert not path.exists()


def test_v2_entries_must_have_sequence_numbers_unless_added(tmp_path: Path) -> None:
    entry = _entries(2, 2, ManifestContent.DATA)[1]  # DELETED
    entry.sequence_number = None
    with pytest.raises(ValueError, match="sequence number"):
        _write(PyArrowFileIO(), tmp_path / "m.avro", 2, ManifestContent.DATA, [entry])


# --- Iceberg Java -----------------------------------------------------------------------------

JAVA_SCHEMA = Schema(*[f for f in SCHEMA.fields if f.name not in ("u", "fx")])
# Iceberg Java reads no manifest with an identity(fixed) partition that pyiceberg (or this
# encoder, which writes the same bytes) writes, and pyiceberg cannot partition by uuid.
JAVA_SPEC = PartitionSpec(
    *[
        PartitionField(JAVA_SCHEMA.find_field(name).field_id, 1000 + i, transform, f"p{i}")
        for i, (name, transform) in enumerate(
            [
                *((n, IdentityTransform()) for n in ("flag", "n", "f", "price", "cost", "day")),
                *((n, IdentityTransform()) for n in ("tm", "tstz", "bin")),
                ("d", VoidTransform()),
                ("ts", HourTransform()),
                ("name", TruncateTransform(2)),
                ("id", BucketTransform(2)),
            ]
        )
    ]
)


def _rows(table: Table, first: int, count: int) -> pa.Table:
    def row(i: int) -> dict[str, Any]:
        if i % 4 == 3:
            return {"id": i}
        return {
            "id": i,
            "flag": i % 2 == 0,
            "n": i % 3,
            "f": [1.5, -2.0][i % 2],
            "d": i / 4,
            "price": Decimal(i % 3).scaleb(-2),
            "cost": Decimal("-3.50"),
            "big": Decimal(i).scaleb(-10),
            "day": dt.date(1969, 12, 30) + dt.timedelta(days=i % 3),
            "tm": dt.time(i % 2, 30),
            "ts": dt.datetime(2024, 1, 1, i % 3),
            "tstz": dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
            "name": ["alpha", "béta", ""][i % 3],
            "bin": [b"", b"\x00\xff"][i % 2],
        }

    rows = [row(i) for i in range(first, first + count)]
    return pa.Table.from_pylist(rows, table.schema().as_arrow())


def _rewrite_manifests(table: Table) -> Table:
    """A snapshot listing every live entry of the head again, in manifests this encoder wrote."""
    metadata = table.metadata
    head = table.current_snapshot()
    assert head is not None
    version = metadata.format_version
    snapshot_id = metadata.new_snapshot_id()
    manifests = []
    for i, manifest in enumerate(snapshot_manifests(table.io, head, version)):
        live = manifest_entries(table.io, manifest, version)
        if not live:
            continue
        path = table.location_provider().new_metadata_location(f"{uuid.uuid4()}-r{i}.avro")
        with manifest_writer(
            manifest.content,
            version,
            metadata.specs()[manifest.partition_spec_id],
            metadata.schema(),
            table.io.new_output(path),
            snapshot_id,
            "deflate",
        ) as writer:
            add_existing(writer, live)
        manifests.append(writer.to_manifest_file())
    return commit_manifests(table, snapshot_id, manifests, Summary(Operation.REPLACE))


def _java_sees_every_file(table: Table) -> None:
    """Java reads every manifest of the head with pyiceberg's count of entries by status."""
    head = table.current_snapshot()
    assert head is not None
    java = {m.path: m for m in java_read(table, []).manifests}
    for manifest in snapshot_manifests(table.io, head, table.metadata.format_version):
        read = java[manifest.manifest_path]
        assert (read.added, read.existing, read.deleted) == (
            manifest.added_files_count,
            manifest.existing_files_count,
            manifest.deleted_files_count,
        )


@pytest.mark.parametrize("version", [1, 2])
def test_java_reads_manifests_rewritten_by_the_encoder_and_by_compaction(
    catalog: Catalog, java_reader: JavaReader, version: int
) -> None:
    table = catalog.create_table(
        "db.t", JAVA_SCHEMA, partition_spec=JAVA_SPEC, properties={"format-version": str(version)}
    )
    for first in range(0, 48, 12):
        table.append(_rows(table, first, 12))
    table = catalog.load_table("db.t")
    if version == 2:  # an equality delete manifest (equality_ids) from the encoder
        data_file = next(iter(live_data_files(table).values()))
        delete_file = write_equality_delete_file(
            table, ["id", "name"], [(0, "alpha")], spec_id=0, partition=data_file.partition
        )
        table = commit_delete_files(table, [delete_file])
    rows = java_read(table, []).current.rows

    table = _rewrite_manifests(table)
    assert java_read(table, []).current.rows == rows
    _java_sees_every_file(table)

    result, table = run_compaction(catalog, "db.t", min_input_files=2)
    assert result.to_dict()["rewritten_files"] > 0
    assert java_read(table, []).current.rows == rows
    _java_sees_every_file(table)


def test_java_reads_v3_manifests_rewritten_by_the_encoder_with_their_lineage(
    catalog: Catalog, tmp_path: Path, java_reader: JavaReader
) -> None:
    """first_row_id, and deletion vectors' referenced_data_file and blob offsets and sizes."""
    location = tmp_path / "dv"
    table = catalog.register_table(("db", "dv"), write_cdc_table("dv", location, seed=1))
    before = java_read(table, [])
    assert before.current.rows == read_expected(location).rows
    assert before.live_files()["deletion_vectors"] > 1

    table = _rewrite_manifests(table)
    after = java_read(table, [])
    assert after.current.rows == before.current.rows
    assert after.lineage() == before.lineage()
    assert after.live_files() == before.live_files()
    _java_sees_every_file(table)

    result, table = run_compaction(catalog, "db.dv")
    assert result.to_dict()["rewritten_delete_files"] == before.live_files()["deletion_vectors"]
    compacted = java_read(table, [])
    assert compacted.current.rows == before.current.rows
    assert compacted.lineage() == before.lineage()
    _java_sees_every_file(table)
