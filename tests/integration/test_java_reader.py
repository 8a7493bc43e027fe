"""Iceberg's Java library reads what compactor commits: rows of every snapshot, every manifest.

The reader (tests/support/java, see java_reader.py) is built once per session by the ``java_reader``
fixture; a failed build errors these tests rather than skipping them.
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.manifest import DataFileContent, ManifestContent, ManifestWriterV2
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampNanoType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from compactor.bench.sample import EVENTS_SCHEMA, events_batch
from compactor.commit import snapshot_writer

from support.deletes import (
    commit_delete_files,
    write_equality_delete_file,
    write_position_delete_file,
)
from support.java_reader import (
    JavaReader,
    JavaReadError,
    UnsupportedCanonicalType,
    assert_java_reads_same,
    canonical_rows,
    canonical_value,
    java_read,
)
from support.java_writer import read_expected, write_cdc_table
from support.rows import scan_rows
from support.runs import compact_and_verify, run_compaction
from support.tables import events_table, live_data_files, local_path, read_data_file


def _events(catalog: Catalog, *, format_version: str = "2", commits: int = 4) -> Table:
    return events_table(
        catalog,
        "db.ev",
        commits=commits,
        rows_per_commit=400,
        days=1,
        properties={"format-version": format_version},
    )


def _region_files(table: Table, region: str) -> list[Any]:
    files = [f for f in live_data_files(table).values() if f.partition[1] == region]
    return sorted(files, key=lambda f: f.file_path)


def _without_ids(data: pa.Table, ids: set[int]) -> pa.Table:
    return data.filter(pc.invert(pc.is_in(data["event_id"], pa.array(sorted(ids), pa.int64()))))


# --------------------------------------------------------------------------------------------
# Java reads the same rows as pyiceberg
# --------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("file_kind")
@pytest.mark.parametrize("format_version", ["1", "2"])
def test_java_reads_every_snapshot_through_compaction(
    catalog: Catalog, java_reader: JavaReader, format_version: str
) -> None:
    """Appends, a copy-on-write delete, a tag and a branch, then compaction: Java == pyiceberg."""
    table = _events(catalog, format_version=format_version)
    table.delete("event_id < 150")
    table = catalog.load_table("db.ev")
    first = table.metadata.snapshots[0].snapshot_id
    table.manage_snapshots().create_tag(first, "first-commit").commit()
    table.manage_snapshots().create_branch(table.metadata.current_snapshot_id, "audit").commit()
    table = catalog.load_table("db.ev")

    _, after, before_rows = compact_and_verify(catalog, "db.ev")

    java = assert_java_reads_same(after)
    compacted = after.metadata.current_snapshot_id
    parent = after.current_snapshot().parent_snapshot_id
    assert java.current_snapshot_id == compacted
    assert java.rows(compacted) == java.rows(parent) == java.rows()
    assert java.read().row_count == before_rows.num_rows == 4 * 400 - 150
    assert java.read(first).row_count == 400
    assert java.refs["first-commit"].type == "tag"
    assert java.refs["audit"].read.rows == java.rows(parent)
    # Every manifest of every snapshot was read, once.
    expected = {m.manifest_path for s in after.metadata.snapshots for m in s.manifests(after.io)}
    assert {m.path for m in java.manifests} == expected
    assert len(java.manifests) == len(expected)
    assert {m.path for m in java.manifests} >= set(java.snapshots[compacted].manifests)
    replaced = sum(m.deleted for m in java.manifests if compacted in m.snapshots)
    assert replaced > 0  # the rewritten files, as DELETED entries of the replace snapshot


@pytest.mark.usefixtures("file_kind")
def test_java_applies_position_and_equality_deletes(
    catalog: Catalog, java_reader: JavaReader
) -> None:
    """Deletes committed with the suite's helpers: Java applies them with its own semantics.

    An equality delete applies only to data files with a lower sequence number, so rows with
    a deleted key appended again afterwards are live again. pyiceberg cannot read equality
    deletes, so the expected rows are built by hand.
    """
    table = _events(catalog, commits=3)
    base_id = table.metadata.current_snapshot_id
    base = scan_rows(table)
    eu, us = _region_files(table, "eu"), _region_files(table, "us")
    eu_ids = read_data_file(table, eu[0]).column("event_id").to_pylist()
    pos_gone = {eu_ids[p] for p in (0, 2, 5)}
    victims = set(sorted(read_data_file(table, us[1]).column("event_id").to_pylist())[:4])
    deletes = [
        write_position_delete_file(table, {eu[0]: [0, 2, 5]}),
        write_equality_delete_file(
            table,
            ["event_id"],
            [(v,) for v in sorted(victims)],
            spec_id=us[1].spec_id,
            partition=us[1].partition,
        ),
    ]
    table = commit_delete_files(table, deletes, operation=Operation.OVERWRITE)
    deleted_id = table.metadata.current_snapshot_id
    after_deletes = _without_ids(base, pos_gone | victims)
    assert after_deletes.num_rows == base.num_rows - 7

    java = assert_java_reads_same(table, expected={deleted_id: after_deletes})
    assert java.read(deleted_id).row_count == base.num_rows - 7
    assert {m.content for m in java.manifests} == {"data", "deletes"}

    # Two of the deleted keys come back in a newer file: the equality delete must not hide them.
    back = base.filter(pc.is_in(base["event_id"], pa.array(sorted(victims)[:2], pa.int64())))
    table.append(back)
    table = catalog.load_table("db.ev")
    readded_id = table.metadata.current_snapshot_id
    with_back = pa.concat_tables([after_deletes, back])

    result, after = run_compaction(catalog, "db.ev")

    compacted = after.metadata.current_snapshot_id
    assert compacted != readded_id and result.committed
    java = assert_java_reads_same(
        after,
        expected={
            base_id: base,
            deleted_id: after_deletes,
            readded_id: with_back,
            compacted: with_back,
        },
    )
    assert java.read(compacted).row_count == base.num_rows - 5


def test_java_reads_old_snapshots_in_their_schema(
    catalog: Catalog, java_reader: JavaReader
) -> None:
    """After a rename and an added column, each snapshot is read (and compared) in its schema."""
    table = _events(catalog, commits=2)
    old = table.metadata.current_snapshot_id
    with table.update_schema() as update:
        update.rename_column("payload", "body")
        update.add_column("note", StringType())
    table = catalog.load_table("db.ev")
    batch = events_batch(2, 400, 1).rename_columns(EVENTS_SCHEMA.column_names[:-1] + ["body"])
    batch = batch.append_column("note", pa.array(["n"] * 400))
    table.append(batch.cast(table.schema().as_arrow()))
    table = catalog.load_table("db.ev")
    table.manage_snapshots().create_branch(old, "old").commit()

    _, after, _ = compact_and_verify(catalog, "db.ev")

    java = assert_java_reads_same(after)
    assert java.read(old).columns[-1] == "payload"
    assert java.read().columns[-2:] == ("body", "note")
    # A branch is read in the table's current schema: same rows, the new column null.
    assert java.refs["old"].read.columns == java.read().columns
    assert java.refs["old"].read.row_count == java.read(old).row_count == 800


def test_java_reads_every_parquet_codec(catalog: Catalog, java_reader: JavaReader) -> None:
    """The trimmed Hadoop classpath decodes every codec pyiceberg writes but brotli."""
    table = catalog.create_table("db.codecs", EVENTS_SCHEMA)
    codecs = ["zstd", "snappy", "gzip", "lz4", "uncompressed"]
    for commit, codec in enumerate(codecs):
        with table.transaction() as transaction:
            transaction.set_properties({"write.parquet.compression-codec": codec})
        table = catalog.load_table("db.codecs")
        table.append(events_batch(commit, 40, 1))
    written = {
        pq.ParquetFile(local_path(path)).metadata.row_group(0).column(0).compression
        for path in live_data_files(table)
    }
    assert written == {"ZSTD", "SNAPPY", "GZIP", "LZ4", "UNCOMPRESSED"}

    _, after, _ = compact_and_verify(catalog, "db.codecs")

    java = assert_java_reads_same(after)
    assert java.read().row_count == 40 * len(codecs)


# --------------------------------------------------------------------------------------------
# Every type the canonical form covers
# --------------------------------------------------------------------------------------------

TYPES_SCHEMA = Schema(
    NestedField(1, "b", BooleanType()),
    NestedField(2, "i32", IntegerType()),
    NestedField(3, "i64", LongType()),
    NestedField(4, "f32", FloatType()),
    NestedField(5, "f64", DoubleType()),
    NestedField(6, "dec", DecimalType(38, 10)),
    NestedField(7, "d", DateType()),
    NestedField(8, "t", TimeType()),
    NestedField(9, "ts", TimestampType()),
    NestedField(10, "tstz", TimestamptzType()),
    NestedField(11, "s", StringType()),
    NestedField(12, "u", UUIDType()),
    NestedField(13, "fx", FixedType(4)),
    NestedField(14, "bin", BinaryType()),
    NestedField(
        15,
        "st",
        StructType(NestedField(16, "x", IntegerType()), NestedField(17, "y", StringType())),
    ),
    NestedField(18, "ls", ListType(19, DoubleType(), element_required=False)),
    NestedField(20, "mp", MapType(21, StringType(), 22, LongType(), value_required=False)),
)
FLOATS = (0.1, -0.0, 0.0, math.nan, math.inf, -math.inf, 1e300, 5e-324, 123456.789, 1 / 3)
STRINGS = ("", 'q"uote\\', "tab\t\n\x01\x7f", "zß", "日本語", "🧊-ice")


def _types_rows(n: int) -> Iterator[dict[str, Any]]:
    epoch = dt.datetime(1970, 1, 1)
    for i in range(n):
        if i % 11 == 10:
            yield {f.name: None for f in TYPES_SCHEMA.fields}
            continue
        yield {
            "b": i % 2 == 0,
            "i32": (-(2**31), 2**31 - 1, i)[i % 3],
            "i64": (-(2**63), 2**63 - 1, i * 10**12)[i % 3],
            "f32": FLOATS[i % len(FLOATS)],
            "f64": FLOATS[(i + 3) % len(FLOATS)] * (1 if i % 2 else -1),
            "dec": Decimal(f"{'-' if i % 2 else ''}{i:027d}{i % 10}.{i * 7919 % 10**10:010d}"),
            "d": dt.date(1, 1, 1) + dt.timedelta(days=i * 50_000 % 3_652_000),
            "t": (epoch + dt.timedelta(microseconds=i * 9_876_543_211 % 86_400_000_000)).time(),
            "ts": epoch + dt.timedelta(seconds=i * 86_413 - 10**9, microseconds=i),
            "tstz": dt.datetime(1995, 6, 1, tzinfo=dt.UTC) + dt.timedelta(hours=i * 7, seconds=i),
            "s": STRINGS[i % len(STRINGS)] + str(i),
            "u": uuid.UUID(int=i * 0x1000193 + 7).bytes,
            "fx": i.to_bytes(4, "big"),
            "bin": bytes(range(i % 7)) * 3,
            "st": None if i % 5 == 0 else {"x": None if i % 4 == 0 else i, "y": STRINGS[i % 6]},
            "ls": [] if i % 7 == 0 else [FLOATS[(i + k) % len(FLOATS)] for k in range(i % 4)],
            "mp": {} if i % 8 == 0 else {f"k{i}": i, "z": None, "a\u00e9": -i},
        }


def test_java_reads_every_type_like_pyiceberg(catalog: Catalog, java_reader: JavaReader) -> None:
    """The canonical row form agrees across the two languages for every supported type."""
    table = catalog.create_table("db.types", TYPES_SCHEMA)
    arrow = table.schema().as_arrow()
    for start in (0, 60):
        rows = list(_types_rows(start + 60))[start:]
        table.append(pa.Table.from_pylist(rows, schema=arrow))

    _, after, _ = compact_and_verify(catalog, "db.types")

    java = assert_java_reads_same(after)
    assert java.read().row_count == 120
    # The edge cases really are in the data Java read.
    text = "\n".join(java.rows())
    tiny = "0." + "0" * 323 + "5"  # 5e-324, the smallest double
    for fragment in ('"NaN"', '"-Infinity"', ",-0,", tiny, "\\ud83e\\uddca", '"0001-01-01"'):
        assert fragment in text, fragment


def test_canonical_form() -> None:
    """The Python half of the canonical form, on values whose text is known."""
    assert canonical_value(DoubleType(), math.nan) == '"NaN"'
    assert canonical_value(DoubleType(), -0.0) == "-0"
    assert canonical_value(DoubleType(), 0.1) == "0.1"
    assert canonical_value(DoubleType(), 1e21) == "1000000000000000000000"
    assert canonical_value(FloatType(), float(pa.array([0.1], pa.float32())[0].as_py())) == (
        "0.10000000149011612"
    )
    assert canonical_value(DecimalType(9, 2), Decimal("1.50")) == '"1.50"'
    assert canonical_value(StringType(), "é\n") == '"\\u00e9\\n"'
    assert canonical_value(TimestampType(), dt.datetime(2026, 1, 2, 3, 4, 5)) == (
        '"2026-01-02T03:04:05.000000"'
    )
    tz = dt.timezone(dt.timedelta(hours=2))
    assert canonical_value(TimestamptzType(), dt.datetime(2026, 1, 2, 3, 4, 5, 6, tz)) == (
        '"2026-01-02T01:04:05.000006+00:00"'
    )
    struct = StructType(NestedField(1, "a", IntegerType()), NestedField(2, "b", BinaryType()))
    assert canonical_value(struct, {"b": b"\x00\xff", "a": None}) == '{"a":null,"b":"00ff"}'
    mp = MapType(1, StringType(), 2, LongType())
    assert canonical_value(mp, [("b", 2), ("a", 1)]) == '[["a",1],["b",2]]'
    with pytest.raises(UnsupportedCanonicalType, match="timestamp_ns"):
        canonical_value(TimestampNanoType(), dt.datetime(2026, 1, 1))
    schema = Schema(NestedField(1, "a", LongType()), NestedField(2, "b", StringType()))
    data = pa.table({"b": ["x", "x"], "a": [1, 1]})
    assert canonical_rows(data, schema) == {'[1,"x"]': 2}


# --------------------------------------------------------------------------------------------
# The reader fails when Java cannot read the table, and the comparison when rows differ
# --------------------------------------------------------------------------------------------


def test_java_fails_on_a_missing_data_file(catalog: Catalog, java_reader: JavaReader) -> None:
    table = _events(catalog, commits=2)
    victim = sorted(live_data_files(table))[0]
    local_path(victim).unlink()

    with pytest.raises(JavaReadError) as failure:
        java_read(table)

    assert failure.value.returncode != 0
    assert victim.rsplit("/", 1)[1] in str(failure.value)
    assert "NotFound" in failure.value.stderr


class _PyicebergDeleteManifestWriter(ManifestWriterV2):
    """A delete manifest with pyiceberg 0.12's own schema: equality_ids as list<long>."""

    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


def test_java_fails_on_equality_ids_written_as_longs(
    catalog: Catalog, java_reader: JavaReader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The spec types equality_ids list<int>: Java cannot read pyiceberg 0.12's list<long>."""

    def pyiceberg_writer(content: ManifestContent, format_version: int, *args: Any) -> Any:
        assert content == ManifestContent.DELETES and format_version == 2
        return _PyicebergDeleteManifestWriter(*args)

    monkeypatch.setattr(snapshot_writer, "manifest_writer", pyiceberg_writer)
    table = _events(catalog, commits=2)
    target = _region_files(table, "eu")[0]
    first_id = read_data_file(table, target).column("event_id")[0].as_py()
    delete = write_equality_delete_file(
        table, ["event_id"], [(first_id,)], spec_id=target.spec_id, partition=target.partition
    )
    table = commit_delete_files(table, [delete], operation=Operation.OVERWRITE)

    with pytest.raises(JavaReadError, match="reading manifest .*ClassCastException") as failure:
        java_read(table)

    assert "java.lang.Long" in failure.value.stderr
    assert "java.lang.Integer" in failure.value.stderr


def test_comparison_fails_when_rows_differ(catalog: Catalog, java_reader: JavaReader) -> None:
    table = _events(catalog, commits=2)
    rows = scan_rows(table)
    one_less = rows.slice(1)

    with pytest.raises(AssertionError, match="rows differ"):
        assert_java_reads_same(table, expected={None: one_less})
    with pytest.raises(AssertionError, match="not in the table"):
        assert_java_reads_same(table, expected={12345: rows})


# --------------------------------------------------------------------------------------------
# Row lineage (format v3): _row_id and _last_updated_sequence_number as Java reads them
# --------------------------------------------------------------------------------------------

ROW_ID_FIELD_ID = 2147483540  # MetadataColumns.ROW_ID
LAST_UPDATED_FIELD_ID = 2147483539  # MetadataColumns.LAST_UPDATED_SEQUENCE_NUMBER


@pytest.fixture(scope="module")
def dv_location(tmp_path_factory: pytest.TempPathFactory, java_reader: JavaReader) -> Path:
    """java_writer's format-v3 "dv" table (appends, then deletion vectors), written once."""
    location = tmp_path_factory.mktemp("lineage") / "dv"
    write_cdc_table("dv", location, seed=0)
    return location


def _register_dv(catalog: Catalog, location: Path) -> Table:
    table = catalog.register_table(("db", "dv"), read_expected(location).metadata_location)
    assert table.format_version == 3
    return table


def _file_rows(uri: str, schema: Schema) -> list[str]:
    """The canonical row at each position of one data file (read as a file, not a dataset)."""
    data = pq.ParquetFile(local_path(uri)).read().to_pylist()
    return [
        "[" + ",".join(canonical_value(f.field_type, row[f.name]) for f in schema.fields) + "]"
        for row in data
    ]


def _field_ids(uri: str) -> set[int]:
    """The top-level field ids of one Parquet file."""
    schema = pq.read_schema(local_path(uri))
    return {int(f.metadata[b"PARQUET:field_id"]) for f in schema if f.metadata}


def _live_data_entries(table: Table) -> list[Any]:
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return [
        entry
        for manifest in snapshot.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
        if entry.data_file.content == DataFileContent.DATA
    ]


def test_java_reports_row_lineage_of_every_live_row(catalog: Catalog, dv_location: Path) -> None:
    """Every live row of every snapshot has a unique row id and a sequence number in range."""
    table = _register_dv(catalog, dv_location)
    java = java_read(table)
    plain = java_read(table, lineage=False)  # the same table read without the lineage columns
    current = table.current_snapshot()
    assert current is not None

    lineage = java.lineage()
    assert lineage.total() == java.read().row_count > 0
    # The rows with lineage are the rows Java reads without it, and the writer's model.
    assert Counter({row: n for (row, _, _), n in lineage.items()}) == plain.rows()
    assert java.rows() == plain.rows() == read_expected(dv_location).rows
    assert plain.read().lineage is None
    ids = [row_id for (_, row_id, _), n in lineage.items() for _ in range(n)]
    assert None not in ids and len(set(ids)) == len(ids)
    sequences = {seq for _, _, seq in lineage}
    assert sequences <= set(range(1, current.sequence_number + 1)), sequences
    assert len(sequences) >= 3  # rows of several commits, each with its own
    assert java.next_row_id == table.metadata.next_row_id
    assert java.next_row_id is not None and max(ids) < java.next_row_id

    # Every snapshot: lineage for each row, ids stable from snapshot to snapshot.
    by_row = {row: (row_id, seq) for row, row_id, seq in lineage}
    for snapshot in table.metadata.snapshots:
        sid = snapshot.snapshot_id
        assert java.snapshots[sid].sequence_number == snapshot.sequence_number
        old = java.lineage(sid)
        assert Counter({row: n for (row, _, _), n in old.items()}) == plain.rows(sid)
        old_ids = [row_id for _, row_id, _ in old]
        assert None not in old_ids and len(set(old_ids)) == old.total() == len(old_ids)
        assert {seq for _, _, seq in old} <= set(range(1, snapshot.sequence_number + 1))
        for row, row_id, seq in old:
            if row in by_row:
                assert by_row[row] == (row_id, seq), (sid, row)
    assert java.lineage(current.snapshot_id) == lineage


def test_java_row_lineage_inherits_first_row_id_plus_position(
    catalog: Catalog, dv_location: Path
) -> None:
    """Files without lineage columns: row id = the file's first row id + position, and the
    sequence number the file's; each file's ids lie in the range its snapshot assigned."""
    table = _register_dv(catalog, dv_location)
    java = java_read(table, snapshot_ids=[])
    by_row = {row: (row_id, seq) for row, row_id, seq in java.lineage()}
    schema = table.schema()
    ranges = []
    seen = 0
    for entry in _live_data_entries(table):
        f = entry.data_file
        assert not {ROW_ID_FIELD_ID, LAST_UPDATED_FIELD_ID} & _field_ids(f.file_path)
        live = [
            (pos, row) for pos, row in enumerate(_file_rows(f.file_path, schema)) if row in by_row
        ]
        assert live, f.file_path
        seen += len(live)
        firsts = {by_row[row][0] - pos for pos, row in live}
        assert len(firsts) == 1, (f.file_path, firsts)  # consecutive by position, gaps for deletes
        first = firsts.pop()
        assert {by_row[row][1] for _, row in live} == {entry.sequence_number}
        added_by = table.snapshot_by_id(entry.snapshot_id)
        assert added_by is not None and added_by.first_row_id is not None
        assert added_by.sequence_number == entry.sequence_number
        assert added_by.first_row_id <= first
        assert first + f.record_count <= added_by.first_row_id + added_by.added_rows
        ranges.append((first, first + f.record_count))
    assert seen == java.read().row_count  # every live row is in exactly one live file
    ranges.sort()
    assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:], strict=False))  # disjoint


def test_java_row_lineage_prefers_a_files_own_lineage_columns(
    catalog: Catalog, java_reader: JavaReader, tmp_path: Path
) -> None:
    """A data file with _row_id and _last_updated_sequence_number columns: Java reports the
    file's values, and inherits only where a value is null."""
    location = tmp_path / "dv"
    write_cdc_table("dv", location, seed=3)
    table = _register_dv(catalog, location)
    before = java_read(table, snapshot_ids=[])
    by_row = {row: (row_id, seq) for row, row_id, seq in before.lineage()}
    schema = table.schema()
    # A data file with deletes (its live positions have gaps), rewritten in place, same rows.
    target = next(
        e.data_file
        for e in _live_data_entries(table)
        if 4
        <= sum(row in by_row for row in _file_rows(e.data_file.file_path, schema))
        < e.data_file.record_count
    )
    path = local_path(target.file_path)
    data = pq.ParquetFile(path).read()
    n = data.num_rows
    row_ids = [10_000_000 + pos if pos % 3 == 0 else None for pos in range(n)]
    sequences = [7_000 + pos if pos % 2 == 0 else None for pos in range(n)]
    for name, field_id, values in (
        ("_row_id", ROW_ID_FIELD_ID, row_ids),
        ("_last_updated_sequence_number", LAST_UPDATED_FIELD_ID, sequences),
    ):
        field = pa.field(name, pa.int64(), metadata={b"PARQUET:field_id": str(field_id).encode()})
        data = data.append_column(field, pa.array(values, pa.int64()))
    pq.write_table(data, path)
    assert {ROW_ID_FIELD_ID, LAST_UPDATED_FIELD_ID} <= _field_ids(target.file_path)

    after = java_read(table, snapshot_ids=[])
    assert after.rows() == before.rows()
    expected = Counter(before.lineage())
    rows = _file_rows(target.file_path, schema)
    explicit = inherited = 0
    for pos, row in enumerate(rows):
        if row not in by_row:
            continue  # deleted by a deletion vector: still deleted, by position
        row_id, seq = by_row[row]
        expected[(row, row_id, seq)] -= 1
        new = (
            row,
            row_ids[pos] if row_ids[pos] is not None else row_id,
            sequences[pos] if sequences[pos] is not None else seq,
        )
        expected[new] += 1
        explicit += row_ids[pos] is not None
        inherited += row_ids[pos] is None
    assert explicit and inherited
    assert after.lineage() == +expected


def test_java_reports_no_row_lineage_below_v3(
    catalog: Catalog, java_reader: JavaReader, dv_location: Path
) -> None:
    table = _events(catalog, format_version="2", commits=2)
    java = java_read(table)
    assert java.read().lineage is None and java.next_row_id is None
    with pytest.raises(ValueError, match="format v2 has no row lineage"):
        java.lineage()
    with pytest.raises(ValueError, match="format v2"):
        java.lineage(table.metadata.snapshots[0].snapshot_id)
    # Forced on, Java inherits nothing: files of a v2 table have no first row id.
    forced = java_read(table, snapshot_ids=[], lineage=True)
    assert forced.lineage() == Counter({(row, None, None): n for row, n in java.rows().items()})

    v3 = java_read(_register_dv(catalog, dv_location), snapshot_ids=[], lineage=False)
    with pytest.raises(ValueError, match="lineage=False"):
        v3.lineage()
