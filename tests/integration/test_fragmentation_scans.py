"""Fragmentation scored on real tables of a SQLite catalog: what the daemon's scanner reads.

What the scanner reads is counted independently of the scanner's own bookkeeping.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.io.pyarrow import PyArrowFile
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

from compactor.daemon.fragmentation import MANIFESTS, SUMMARY, Fragmentation, FragmentationScanner
from compactor.daemon.fragmentation import due_reasons as fragmentation_due_reasons
from compactor.daemon.jobfiles import CompactAction
from compactor.options.defaults import MIN_FILE_SIZE_RATIO
from compactor.planning.health import table_health

from support.deletes import commit_delete_files, write_position_delete_file
from support.tables import live_data_files, live_delete_files

MiB = 1 << 20


def due_reasons(found: Fragmentation, **section: Any) -> list[str]:
    """Why a compact section with these settings finds the table due (none: not due)."""
    return fragmentation_due_reasons(found, CompactAction(every="1m", **section))


TABLE = "db.frag"
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType(), required=True),
)
BY_REGION = PartitionSpec(
    PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region")
)


@pytest.fixture
def manifest_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Paths of the manifests opened for reading from storage, in order, however they are reached."""
    reads: list[str] = []
    original = PyArrowFile.open

    def counting(self: PyArrowFile, *args: Any, **kwargs: Any) -> Any:
        name = self.location.rsplit("/", 1)[-1]
        if name.endswith(".avro") and not name.startswith("snap-"):
            reads.append(self.location)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PyArrowFile, "open", counting)
    return reads


def region_table(catalog: Catalog, appends: dict[str, int]) -> Table:
    """``TABLE`` (v2) partitioned by region; each append writes one file into one region."""
    table = catalog.create_table(
        TABLE, SCHEMA, partition_spec=BY_REGION, properties={"format-version": "2"}
    )
    next_id, rows = 0, 20
    for region, count in appends.items():
        for _ in range(count):
            rows += 15  # every file a different size
            table.append(
                pa.table(
                    {
                        "id": pa.array(range(next_id, next_id + rows), pa.int64()),
                        "region": pa.array([region] * rows),
                    },
                    schema=SCHEMA.as_arrow(),
                )
            )
            next_id += rows
    return catalog.load_table(TABLE)


def manifest_paths(table: Table) -> set[str]:
    snapshot = table.current_snapshot()
    assert snapshot is not None
    return {m.manifest_path for m in snapshot.manifests(table.io)}


def append_region(table: Table, region: str, first_id: int) -> None:
    table.append(
        pa.table(
            {"id": pa.array(range(first_id, first_id + 10), pa.int64()), "region": [region] * 10},
            schema=SCHEMA.as_arrow(),
        )
    )


def test_scanner_counts_agree_with_table_health_and_the_manifests(catalog: Catalog) -> None:
    table = region_table(catalog, {"eu": 4, "us": 3, "ap": 1})
    eu_file = next(f for f in live_data_files(table).values() if f.partition[0] == "eu")
    table = commit_delete_files(
        table,
        [
            write_position_delete_file(table, {eu_file: [0]}),
            write_position_delete_file(table, {eu_file: [1]}),
        ],
    )
    data = live_data_files(table)
    sizes = sorted(f.file_size_in_bytes for f in data.values())
    # A target whose small-file threshold falls inside the range of file sizes.
    target = int(sizes[len(sizes) // 2] / MIN_FILE_SIZE_RATIO) + 1
    small = int(target * MIN_FILE_SIZE_RATIO)
    expected_small = [f for f in data.values() if f.file_size_in_bytes < small]
    assert 0 < len(expected_small) < len(data)

    section = CompactAction(every="1m", min_small_files=1)
    found = FragmentationScanner().scan(table, TABLE, target, section)
    health = table_health(table, TABLE, target, section.min_input_files)

    assert found.source == MANIFESTS
    assert found.snapshot_id == table.current_snapshot().snapshot_id
    assert (found.data_files, found.small_files, found.files_under_target) == (
        health.data_files,
        health.small_files,
        health.files_under_target,
    )
    assert (found.data_bytes, found.small_bytes, found.bytes_under_target) == (
        health.data_bytes,
        health.small_bytes,
        health.bytes_under_target,
    )
    assert (found.delete_files, found.partitions) == (health.delete_files, len(health.partitions))
    assert found.data_files == len(data) == 8
    assert found.files_under_target == len(expected_small)
    assert found.bytes_under_target == sum(f.file_size_in_bytes for f in expected_small)
    assert found.delete_files == len(live_delete_files(table)) == 2
    assert found.partitions == 3
    assert found.score == (found.small_files or 0) + 2


def test_rescanning_an_unchanged_snapshot_reads_no_manifest(
    catalog: Catalog, manifest_reads: list[str]
) -> None:
    region_table(catalog, {"eu": 3, "us": 2})
    scanner = FragmentationScanner()
    section = CompactAction(every="1m", min_small_files=1, min_input_files=2)
    table = catalog.load_table(TABLE)
    manifest_reads.clear()
    first = scanner.scan(table, TABLE, MiB, section)
    assert first.manifests_read == len(manifest_reads) == len(manifest_paths(table)) == 5
    manifest_reads.clear()

    again = scanner.scan(catalog.load_table(TABLE), TABLE, MiB, section)

    assert manifest_reads == []
    assert again.snapshot_id == first.snapshot_id
    assert again.data_files == first.data_files
    assert again.small_files == first.small_files == 5
    assert again.manifests_read == 0


def test_after_an_append_the_scanner_reads_only_the_new_manifests(
    catalog: Catalog, manifest_reads: list[str]
) -> None:
    table = region_table(catalog, {"eu": 3, "us": 2})
    scanner = FragmentationScanner()
    section = CompactAction(every="1m", min_small_files=1, min_input_files=2)
    first = scanner.scan(table, TABLE, MiB, section)
    before = manifest_paths(table)

    for round_number in range(3):
        append_region(table, "ap", 10_000 + 10 * round_number)
        table = catalog.load_table(TABLE)
        new = manifest_paths(table) - before
        assert len(new) == 1  # a fast append writes one manifest
        manifest_reads.clear()

        found = scanner.scan(table, TABLE, MiB, section)

        assert sorted(manifest_reads) == sorted(new)
        assert found.manifests_read == len(new)
        assert found.data_files == first.data_files + round_number + 1
        before = manifest_paths(table)

    # The three appended ap files are now worth merging too.
    assert found.small_files == 5 + 3


def test_a_delete_commit_is_read_as_its_one_new_manifest(
    catalog: Catalog, manifest_reads: list[str]
) -> None:
    table = region_table(catalog, {"eu": 3})
    scanner = FragmentationScanner()
    section = CompactAction(every="1m", min_small_files=1)
    scanner.scan(table, TABLE, MiB, section)
    before = manifest_paths(table)
    eu_file = next(iter(live_data_files(table).values()))
    table = commit_delete_files(table, [write_position_delete_file(table, {eu_file: [0]})])
    manifest_reads.clear()

    found = scanner.scan(catalog.load_table(TABLE), TABLE, MiB, section)

    new = manifest_paths(table) - before
    assert sorted(manifest_reads) == sorted(new) and len(new) == 1
    assert found.manifests_read == 1
    assert found.delete_files == 1


def test_a_table_below_every_threshold_is_scored_from_its_summary(
    catalog: Catalog, manifest_reads: list[str]
) -> None:
    table = region_table(catalog, {"eu": 3, "us": 2})  # 5 data files, no delete files
    summary = table.current_snapshot().summary.additional_properties
    manifest_reads.clear()

    found = FragmentationScanner().scan(
        table, TABLE, MiB, CompactAction(every="1m", min_small_files=6, min_input_files=2)
    )

    assert manifest_reads == []
    assert found.source == SUMMARY
    assert found.manifests_read == 0
    assert found.data_files == 5
    assert found.data_bytes == int(summary["total-files-size"])
    assert found.delete_files == 0
    assert found.small_files is None and found.files_under_target is None
    assert due_reasons(found, min_small_files=6) == []


@pytest.mark.parametrize(
    "section",
    [
        {"min_small_files": 5},  # every data file might be a mergeable small file
        {"min_small_files": 100, "min_small_bytes": "1GB"},  # bytes are only in the manifests
    ],
    ids=["small files at the threshold", "byte threshold"],
)
def test_a_table_that_might_cross_a_threshold_is_scored_from_its_manifests(
    catalog: Catalog, manifest_reads: list[str], section: dict[str, Any]
) -> None:
    table = region_table(catalog, {"eu": 3, "us": 2})
    manifest_reads.clear()

    found = FragmentationScanner().scan(
        table, TABLE, MiB, CompactAction(every="1m", min_input_files=2, **section)
    )

    assert found.source == MANIFESTS
    assert found.manifests_read == len(manifest_reads) == 5
    assert found.small_files == 5


# min_input_files -> regions whose small files a rewrite would merge
MERGEABLE_REGIONS = {1: {"eu", "sa"}, 2: {"eu", "sa"}, 3: {"eu"}, 6: {"eu"}, 7: set()}


def test_small_files_count_only_partitions_with_min_input_files(
    catalog: Catalog,
) -> None:
    # eu: 6 small files; sa: 2; us and ap: 1 each (nothing to merge a lone file with).
    table = region_table(catalog, {"eu": 6, "sa": 2, "us": 1, "ap": 1})
    files = list(live_data_files(table).values())

    for min_input_files, regions in MERGEABLE_REGIONS.items():
        expected = [f for f in files if f.partition[0] in regions]
        section = CompactAction(every="1m", min_small_files=1, min_input_files=min_input_files)

        found = FragmentationScanner().scan(table, TABLE, MiB, section)

        assert found.files_under_target == len(files) == 10
        assert found.small_files == len(expected), min_input_files
        assert found.small_bytes == sum(f.file_size_in_bytes for f in expected)
        assert found.worst_partition == "region=eu"
        assert found.worst_partition_files_under_target == 6
        assert found.score == len(expected)
        assert bool(due_reasons(found, min_small_files=1)) == bool(expected)


def test_rescanning_the_same_snapshot_under_another_section_uses_that_section(
    catalog: Catalog,
) -> None:
    """One daemon, two job files whose [compact] sections both cover a table."""
    region_table(catalog, {"eu": 6, "us": 1})
    scanner = FragmentationScanner()
    strict = CompactAction(every="1m", min_small_files=100, min_input_files=2)
    eager = CompactAction(every="1m", min_small_files=1, min_input_files=2)

    assert scanner.scan(catalog.load_table(TABLE), TABLE, MiB, strict).source == SUMMARY
    found = scanner.scan(catalog.load_table(TABLE), TABLE, MiB, eager)

    assert found.small_files == 6
    assert due_reasons(found, min_small_files=1) != []
