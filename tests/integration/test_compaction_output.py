"""The files compaction writes: column metrics that prune scans, and sizes near the target."""

from __future__ import annotations

import math
import random
import zlib
from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import (
    BinaryType,
    DoubleType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
)

from compactor.daemon.scheduling import NOOP
from compactor.daemon.service import compaction_outcome
from compactor.options.defaults import MAX_OUTPUT_GROWTH, MIN_SHARE
from compactor.sizes import parse_size

from support.encoding import read_varint, unzigzag
from support.rows import assert_same_rows, scan_rows
from support.runs import compact_and_verify, run_compaction
from support.tables import (
    FIELD_IDS,
    IMPORTED,
    append_rows,
    list_files,
    live_data_files,
    local_path,
    new_data_files,
    read_data_file,
)

SCHEMA = Schema(
    NestedField(1, "event_id", LongType(), required=False),
    NestedField(2, "region", StringType(), required=False),
    NestedField(3, "note", StringType(), required=False),
    NestedField(4, "payload", BinaryType(), required=False),
)
SPEC = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "region"))
REGION_OFFSET = {"a": 0, "b": 1_000_000}


@pytest.mark.usefixtures("file_kind")
@pytest.mark.parametrize("file_kind", [FIELD_IDS, IMPORTED], indirect=True)
def test_filtered_scan_prunes_by_new_metrics(catalog: Catalog) -> None:
    """Clustered appends compact into files with disjoint event_id ranges that scans can skip
    (the appends' files with field ids, or imported without them)."""
    table = catalog.create_table("db.t", SCHEMA, partition_spec=SPEC)
    rng = random.Random(9)
    rows = 250
    for commit in range(8):
        columns: dict[str, list] = {"event_id": [], "region": [], "note": [], "payload": []}
        for region, offset in REGION_OFFSET.items():
            for i in range(commit * rows, (commit + 1) * rows):
                columns["event_id"].append(offset + i)
                columns["region"].append(region)
                columns["note"].append(None if i % 10 == 0 else f"note-{i}")
                columns["payload"].append(rng.randbytes(500))
        append_rows(table, pa.table(columns, schema=table.schema().as_arrow()))
    before = catalog.load_table("db.t")

    _, after, _ = compact_and_verify(catalog, "db.t", target_file_size="256KiB")

    added = new_data_files(before, after)
    in_a = sorted(
        (f for f in added if f.partition[0] == "a"),
        key=lambda f: from_bytes(LongType(), f.lower_bounds[1]),
    )
    assert len(in_a) >= 3
    # Metrics are populated for every column and agree with the file's contents.
    for data_file in added:
        contents = read_data_file(after, data_file)
        for field_id in (1, 2, 3, 4):
            assert data_file.value_counts[field_id] == data_file.record_count
            assert data_file.column_sizes[field_id] > 0
            assert field_id in data_file.null_value_counts
        assert data_file.null_value_counts[3] == contents.column("note").null_count
        assert data_file.null_value_counts[1] == 0
        ids = contents.column("event_id").to_pylist()
        assert from_bytes(LongType(), data_file.lower_bounds[1]) == min(ids)
        assert from_bytes(LongType(), data_file.upper_bounds[1]) == max(ids)
        assert data_file.lower_bounds[2] == data_file.upper_bounds[2]
    assert sum(f.null_value_counts[3] for f in added) == 2 * 8 * rows // 10
    # Rows were written in commit order, so the ranges within a partition are disjoint.
    for previous, current in zip(in_a, in_a[1:], strict=False):
        assert from_bytes(LongType(), previous.upper_bounds[1]) < from_bytes(
            LongType(), current.lower_bounds[1]
        )

    row_filter = "region = 'a' and event_id < 300"
    tasks = list(after.scan(row_filter=row_filter).plan_files())
    assert 1 <= len(tasks) < len(in_a)
    assert {t.file.file_path for t in tasks} <= {f.file_path for f in in_a[:2]}
    assert sorted(scan_rows(after, row_filter).column("event_id").to_pylist()) == list(range(300))


def _mixed_rows(rng: random.Random, start: int, approx_bytes: int) -> dict[str, list]:
    """Rows that compress unevenly: random bytes next to repetitive text."""
    columns: dict[str, list] = {"event_id": [], "region": [], "note": [], "payload": []}
    size, i = 0, start
    while size < approx_bytes:
        payload = rng.randbytes(rng.randint(0, 600))
        note = f"word{rng.randint(0, 50)} " * rng.randint(1, 80)
        columns["event_id"].append(i)
        columns["region"].append("a")
        columns["note"].append(note)
        columns["payload"].append(payload)
        size += len(payload) + len(note) // 3 + 8
        i += 1
    return columns


def _ten_megabytes_of_small_files(catalog: Catalog, properties: dict[str, str]) -> None:
    """``db.t``: ~10 MB of appends in one partition, every file under 75% of 2 MiB."""
    table = catalog.create_table("db.t", SCHEMA, partition_spec=SPEC, properties=properties)
    rng = random.Random(10)
    start = 0
    while sum(f.file_size_in_bytes for f in live_data_files(table).values()) < 10 * 10**6:
        columns = _mixed_rows(rng, start, 1 << 20)
        start += len(columns["event_id"])
        table.append(pa.table(columns, schema=table.schema().as_arrow()))
    inputs = live_data_files(table)
    assert all(f.file_size_in_bytes < 0.75 * parse_size("2MiB") for f in inputs.values())


# pyiceberg's own append warns that it ignores the row group size property; compactor honours it.
@pytest.mark.filterwarnings("ignore:Parquet writer option:UserWarning")
@pytest.mark.parametrize(
    ("row_group_size", "max_group_size"),
    [(None, None), ("524288", None), (None, "6MiB")],
    ids=["default-row-groups", "small-row-groups", "two-groups"],
)
def test_output_files_reach_the_target(
    catalog: Catalog, row_group_size: str | None, max_group_size: str | None
) -> None:
    """~10 MB of small files in one partition, target 2 MiB: every output file but the last
    of each group is within 10% of the target."""
    properties = {"write.parquet.row-group-size-bytes": row_group_size} if row_group_size else {}
    _ten_megabytes_of_small_files(catalog, properties)
    target = parse_size("2MiB")

    # One worker: the group is cut by max_group_size only (see the test below).
    overrides = {"target_file_size": "2MiB", "parallelism": 1}
    if max_group_size:
        overrides["max_group_size"] = max_group_size
    result, after, _ = compact_and_verify(catalog, "db.t", **overrides)

    groups = result.committed
    assert len(groups) == (2 if max_group_size else 1)
    for group_result in groups:
        sizes = [f.file_size_in_bytes for f in group_result.data_files]
        assert len(sizes) >= 2
        for size in sizes[:-1]:
            assert abs(size - target) <= 0.1 * target, (sizes, target)
        assert sizes[-1] <= 1.1 * target, (sizes, target)
        for data_file in group_result.data_files:
            assert local_path(data_file.file_path).stat().st_size == data_file.file_size_in_bytes


@pytest.mark.filterwarnings("ignore:Parquet writer option:UserWarning")
def test_a_group_too_large_for_one_core_is_cut_in_write_order(catalog: Catalog) -> None:
    """With two workers and one 10 MB group, each worker writes half: whole target files,
    inputs in write order, and no more output files than one stream would write plus one."""
    _ten_megabytes_of_small_files(catalog, {})
    target = parse_size("2MiB")

    result, after, _ = compact_and_verify(catalog, "db.t", target_file_size="2MiB", parallelism=2)

    first, second = sorted(result.plan.groups, key=lambda g: g.files[0].data_sequence_number)
    assert max(f.data_sequence_number for f in first.files) < min(
        f.data_sequence_number for f in second.files
    )
    assert first.input_bytes >= 2 * target and second.input_bytes >= target
    written = [f for g in result.committed for f in g.data_files]
    assert len(written) <= math.ceil(sum(g.input_bytes for g in result.plan.groups) / target) + 1
    for group_result in result.committed:
        sizes = [f.file_size_in_bytes for f in group_result.data_files]
        for size in sizes[:-1]:
            assert abs(size - target) <= 0.1 * target, (sizes, target)


def _compressible_appends(catalog: Catalog, properties: dict[str, str], appends: int) -> None:
    """``db.t``: ``appends`` commits of 30,000 rows that take ~4x fewer bytes written than in
    memory (sequential ids, notes of a few words, short random payloads)."""
    table = catalog.create_table("db.t", SCHEMA, partition_spec=SPEC, properties=properties)
    rng = random.Random(11)
    for k in range(appends):
        ids = range(k * 30_000, (k + 1) * 30_000)
        columns = {
            "event_id": list(ids),
            "region": ["a"] * len(ids),
            "note": [f"word{rng.randint(0, 50)} " * rng.randint(1, 20) for _ in ids],
            "payload": [rng.randbytes(24) for _ in ids],
        }
        table.append(pa.table(columns, schema=table.schema().as_arrow()))


def _row_groups(data_file: DataFile) -> list[tuple[int, float]]:
    """(written bytes, bytes in memory as the writer holds them) of each row group of
    ``data_file``."""
    parquet = pq.ParquetFile(local_path(data_file.file_path))
    metadata, rows = parquet.metadata, parquet.read()
    per_row = rows.nbytes / rows.num_rows
    groups = (metadata.row_group(g) for g in range(metadata.num_row_groups))
    return [
        (sum(g.column(c).total_compressed_size for c in range(g.num_columns)), g.num_rows * per_row)
        for g in groups
    ]


@pytest.mark.filterwarnings("ignore:Parquet writer option:UserWarning")
def test_row_groups_close_at_the_tables_row_group_size_in_written_bytes(
    catalog: Catalog,
) -> None:
    """``write.parquet.row-group-size-bytes`` counts bytes written, as Iceberg Java reads it:
    rows that take ~4x fewer bytes written than in memory make row groups of its size on disk
    (not of its size in memory, ~4x smaller on disk); files still roll at the target."""
    row_group = 256 * 1024
    _compressible_appends(catalog, {"write.parquet.row-group-size-bytes": str(row_group)}, 6)
    target = parse_size("2MiB")

    result, _, _ = compact_and_verify(catalog, "db.t", target_file_size="2MiB", parallelism=1)

    (group,) = result.committed
    sizes = [f.file_size_in_bytes for f in group.data_files]
    assert len(sizes) >= 2
    for size in sizes[:-1]:
        assert abs(size - target) <= 0.1 * target, (sizes, target)
    groups = [g for f in group.data_files for g in _row_groups(f)[:-1]]  # a file's last fills it
    # The writer's first row group is of the property's size in memory: it measures the rest.
    for written, in_memory in groups[1:]:
        assert 0.75 * row_group <= written <= 1.25 * row_group, groups
        assert in_memory > 2 * written, groups


@pytest.mark.filterwarnings("ignore:Parquet writer option:UserWarning")
def test_the_memory_limit_caps_a_row_groups_rows_before_the_tables_row_group_size(
    catalog: Catalog,
) -> None:
    """At the least --memory-limit (one worker, 16 MiB shares) rows that would write 8 MiB,
    ~30 MiB in memory, are not held at once: row groups close at the memory share first."""
    _compressible_appends(catalog, {"write.parquet.row-group-size-bytes": str(8 << 20)}, 6)

    result, _ = run_compaction(
        catalog, "db.t", target_file_size="64MiB", memory_limit="304MiB", parallelism=1
    )

    ((data_file,),) = [g.data_files for g in result.committed]
    groups = _row_groups(data_file)
    assert len(groups) >= 2
    for written, in_memory in groups:
        assert in_memory <= 1.05 * MIN_SHARE, groups
        assert written < (8 << 20) / 2, groups


@pytest.mark.filterwarnings("ignore:Parquet writer option:UserWarning")
def test_each_row_group_written_offers_the_processs_limit_to_hand_freed_pages_back(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After each row group it writes, a worker asks for the pages pyarrow freed to be handed
    back should its process be near the limit (compactor.rewrite.freed_memory): with the
    run's limit, once per row group."""
    from compactor.rewrite import parquet_output

    asked: list[int | None] = []
    monkeypatch.setattr(parquet_output, "hand_back_near", asked.append)
    _compressible_appends(catalog, {"write.parquet.row-group-size-bytes": str(8 << 20)}, 6)

    result, _ = run_compaction(
        catalog, "db.t", target_file_size="64MiB", memory_limit="304MiB", parallelism=1
    )

    ((data_file,),) = [g.data_files for g in result.committed]
    assert len(_row_groups(data_file)) >= 2
    assert asked == [parse_size("304MiB")] * len(_row_groups(data_file))


# --- output size -------------------------------------------------------------------------------

EVENTS = Schema(
    NestedField(1, "event_id", LongType(), required=False),
    NestedField(2, "user", StringType(), required=False),
    NestedField(3, "kind", StringType(), required=False),
    NestedField(4, "url", StringType(), required=False),
    NestedField(5, "at", TimestampType(), required=False),
    NestedField(6, "value", DoubleType(), required=False),
)


def _append_events(table: Table, appends: int, rows: int = 4000) -> None:
    """``appends`` commits of ``rows`` events, as a small application writes them."""
    rng = random.Random(4)
    for k in range(appends):
        start = datetime(2024, 1, 1) + timedelta(hours=k)
        data = {
            "event_id": list(range(k * rows, (k + 1) * rows)),
            "user": [f"user-{rng.randrange(5000)}" for _ in range(rows)],
            "kind": [rng.choice(["click", "view", "buy", "scroll"]) for _ in range(rows)],
            "url": [
                f"https://example.com/p/{rng.randrange(10**5)}?q={rng.random():.6f}"
                for _ in range(rows)
            ],
            "at": [start + timedelta(seconds=i) for i in range(rows)],
            "value": [rng.random() for _ in range(rows)],
        }
        table.append(pa.table(data, schema=table.schema().as_arrow()))


def _data_bytes(files: dict[str, DataFile]) -> int:
    return sum(f.file_size_in_bytes for f in files.values())


def test_compacting_small_appends_does_not_grow_the_data(catalog: Catalog) -> None:
    """Ten appends of a few thousand events compact into one file no larger than they were:
    high-cardinality columns (ids, URLs, timestamps, doubles) are written plain, not with a
    dictionary larger than their values; low-cardinality ones keep theirs."""
    _append_events(catalog.create_table("db.t", EVENTS), appends=10)
    before = catalog.load_table("db.t")

    _, after, _ = compact_and_verify(catalog, "db.t", target_file_size="64MiB")

    (added,) = new_data_files(before, after)
    assert added.file_size_in_bytes <= _data_bytes(live_data_files(before))
    metadata = pq.ParquetFile(local_path(added.file_path)).metadata
    chunks = {
        metadata.row_group(0).column(i).path_in_schema: metadata.row_group(0).column(i)
        for i in range(metadata.num_columns)
    }
    assert {name for name, chunk in chunks.items() if chunk.has_dictionary_page} == {
        "user",
        "kind",
    }


def _thrift_value(data: bytes, at: int, kind: int) -> tuple[object, int]:
    """One value of Thrift's compact protocol (the types a Parquet page header uses)."""
    if kind in (1, 2):  # bool, in the field header
        return kind == 1, at
    if kind == 3:
        return data[at], at + 1
    if kind in (4, 5, 6):  # zigzag varints
        raw, at = read_varint(data, at)
        return unzigzag(raw), at
    if kind == 7:
        return data[at : at + 8], at + 8
    if kind == 8:
        size, at = read_varint(data, at)
        return data[at : at + size], at + size
    if kind in (9, 10):
        size, item = data[at] >> 4, data[at] & 0x0F
        at += 1
        if size == 15:
            size, at = read_varint(data, at)
        items = []
        for _ in range(size):
            value, at = _thrift_value(data, at, item)
            items.append(value)
        return items, at
    if kind == 12:
        return _thrift_struct(data, at)
    raise AssertionError(f"Thrift type {kind} in a page header")


def _thrift_struct(data: bytes, at: int) -> tuple[dict[int, object], int]:
    fields: dict[int, object] = {}
    field_id = 0
    while header := data[at]:
        at += 1
        if header >> 4:  # the delta from the previous field id
            field_id += header >> 4
        else:  # the id in full, a zigzag varint
            raw, at = read_varint(data, at)
            field_id = unzigzag(raw)
        fields[field_id], at = _thrift_value(data, at, header & 0x0F)
    return fields, at + 1


def test_every_page_written_carries_the_crc_of_its_bytes(catalog: Catalog) -> None:
    """Each page header of an output file has the CRC-32 of the page's bytes as stored (the
    Parquet spec's page checksum, which parquet-java writes and can verify), read here with a
    parser of our own rather than the library that wrote it."""
    _append_events(catalog.create_table("db.t", EVENTS), appends=4)
    before = catalog.load_table("db.t")

    _, after, _ = compact_and_verify(catalog, "db.t", target_file_size="64MiB")

    (added,) = new_data_files(before, after)
    path = local_path(added.file_path)
    data, metadata = path.read_bytes(), pq.ParquetFile(path).metadata
    pages = 0
    for g in range(metadata.num_row_groups):
        for c in range(metadata.num_columns):
            chunk = metadata.row_group(g).column(c)
            at = (
                chunk.dictionary_page_offset
                if chunk.has_dictionary_page
                else chunk.data_page_offset
            )
            end = at + chunk.total_compressed_size
            while at < end:
                header, body = _thrift_struct(data, at)
                size = header[3]  # compressed_page_size
                assert isinstance(size, int) and 4 in header, (chunk.path_in_schema, header)
                assert header[4] & 0xFFFFFFFF == zlib.crc32(data[body : body + size])
                at, pages = body + size, pages + 1
    assert pages >= metadata.num_columns * metadata.num_row_groups


def test_a_rewrite_that_grows_the_data_is_not_committed(catalog: Catalog) -> None:
    """A file written compressed, in a table whose codec is now uncompressed, is left as it
    is: rewriting it alone would only make it larger. Its output is deleted; rows unchanged."""
    table = catalog.create_table("db.t", EVENTS)
    _append_events(table, appends=1)
    with table.transaction() as tx:
        tx.set_properties({"write.parquet.compression-codec": "uncompressed"})
    table = catalog.load_table("db.t")
    rows, files = scan_rows(table), list_files(local_path(table.location()) / "data")
    snapshot = table.current_snapshot()

    result, after = run_compaction(catalog, "db.t", rewrite_all=True)

    (grown,) = result.to_dict()["grown_groups"]
    assert (grown["input_files"], grown["output_files"]) == (1, 1)
    assert grown["output_bytes"] > grown["input_bytes"] * (1 + MAX_OUTPUT_GROWTH)
    assert result.snapshot_ids == []
    # For the daemon, nothing worth committing: not a conflict with a writer (no backoff).
    assert compaction_outcome(result) == NOOP
    assert after.current_snapshot() == snapshot
    assert_same_rows(rows, scan_rows(after))
    assert list_files(local_path(after.location()) / "data") == files


def test_a_group_that_grew_is_not_rewritten_again_until_its_inputs_change(
    catalog: Catalog,
) -> None:
    """Given a run's grown groups (as the daemon passes them on), the next run leaves the same
    files alone instead of rewriting them to grow again; once a file joins, the group is
    rewritten (and here committed: two files became one)."""
    table = catalog.create_table("db.t", EVENTS)
    _append_events(table, appends=1)
    with table.transaction() as tx:
        tx.set_properties({"write.parquet.compression-codec": "uncompressed"})
    first, table = run_compaction(catalog, "db.t", rewrite_all=True)
    assert len(first.grown_groups) == 1
    files = list_files(local_path(table.location()) / "data")

    again, table = run_compaction(
        catalog, "db.t", rewrite_all=True, grown_before=first.grown_inputs
    )

    assert (again.plan.groups, again.grown_groups, again.snapshot_ids) == ([], [], [])
    assert again.plan.skipped == {"groups_that_grew_when_last_rewritten": 1}
    assert again.grown_inputs == first.grown_inputs  # still remembered for the run after
    assert compaction_outcome(again) == NOOP
    assert list_files(local_path(table.location()) / "data") == files  # nothing was written

    _append_events(table, appends=1)
    rows = scan_rows(catalog.load_table("db.t"))
    joined, table = run_compaction(
        catalog, "db.t", rewrite_all=True, grown_before=first.grown_inputs
    )

    assert [len(g.files) for g in joined.plan.groups] == [2]
    assert len(joined.snapshot_ids) == 1 and joined.grown_inputs == frozenset()
    assert_same_rows(rows, scan_rows(table))


def test_a_rewrite_that_grows_but_merges_many_files_is_committed(catalog: Catalog) -> None:
    """Growth is accepted in exchange for at least halving the file count."""
    table = catalog.create_table("db.t", EVENTS)
    _append_events(table, appends=4, rows=1000)
    with table.transaction() as tx:
        tx.set_properties({"write.parquet.compression-codec": "uncompressed"})
    before = catalog.load_table("db.t")

    result, after, _ = compact_and_verify(catalog, "db.t", target_file_size="64MiB")

    assert result.to_dict()["grown_groups"] == []
    assert _data_bytes(live_data_files(after)) > _data_bytes(live_data_files(before))
