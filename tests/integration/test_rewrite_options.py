"""Spark's rewrite_data_files options: min/max-file-size, rewrite-all, max-files-to-rewrite and
rewrite-job-order select and order the groups a run rewrites."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType

import compactor
from compactor.errors import UsageError

from support.java_reader import JavaReader, assert_java_reads_same
from support.rows import assert_same_rows, scan_rows
from support.runs import compact_and_verify
from support.tables import (
    FIELD_IDS,
    IMPORTED,
    append_rows,
    live_data_files,
    unmapped_snapshots,
)

# Every test here holds on both read paths (compactor.rewrite.bulk_read and Iceberg's).
pytestmark = pytest.mark.usefixtures("read_path")

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType(), required=True),
    NestedField(3, "pad", StringType(), required=False),
)
SPEC = PartitionSpec(
    PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region")
)
SMALL = {"target_file_size": "1MiB", "allow_small_target": True, "min_input_files": 2}
# Files per partition: each append writes one file per region it holds.
FILES = {"a": 2, "b": 3, "c": 5}


def _table(catalog: Catalog) -> Table:
    """Partitions a, b, c with 2, 3 and 5 small files; c's files are the largest."""
    table = catalog.create_table("db.t", SCHEMA, partition_spec=SPEC)
    next_id = 0
    for region, count in FILES.items():
        for _ in range(count):
            rows = 40 * (3 if region == "c" else 1)
            append_rows(
                table,
                pa.table(
                    {
                        "id": range(next_id, next_id + rows),
                        "region": [region] * rows,
                        "pad": [f"{region}-{i:06d}" * 8 for i in range(rows)],
                    },
                    schema=table.schema().as_arrow(),
                ),
            )
            next_id += rows
    return table


def _regions(plan: compactor.Plan) -> list[str]:
    return [g.partition_path.removeprefix("region=") for g in plan.groups]


@pytest.mark.parametrize(
    ("order", "expected"),
    [
        ("most-fragmented", ["c", "b", "a"]),
        ("files-asc", ["a", "b", "c"]),
        ("files-desc", ["c", "b", "a"]),
        ("bytes-asc", ["a", "b", "c"]),
        ("bytes-desc", ["c", "b", "a"]),
    ],
)
def test_rewrite_job_order_orders_the_groups(catalog: Catalog, order: str, expected: list) -> None:
    plan = compactor.plan(_table(catalog), **SMALL, rewrite_job_order=order, parallelism=1)
    assert _regions(plan) == expected
    assert [g.group_id for g in plan.groups] == [0, 1, 2]


def test_max_files_to_rewrite_takes_the_groups_that_fit_in_job_order(catalog: Catalog) -> None:
    table = _table(catalog)

    plan = compactor.plan(table, **SMALL, max_files_to_rewrite=7, parallelism=1)

    # c (5 files) fits, b (3) would make 8, a (2) makes 7.
    assert _regions(plan) == ["c", "a"]
    assert plan.skipped["groups_beyond_max_files_to_rewrite"] == 1
    result = compactor.compact(table, **SMALL, max_files_to_rewrite=7, parallelism=1)
    assert sum(len(g.files) for g in result.committed_groups) == 7


def test_min_and_max_file_size_choose_the_candidates(catalog: Catalog) -> None:
    table = _table(catalog)
    by_region: dict[str, list[int]] = {}
    for f in live_data_files(table).values():
        by_region.setdefault(f.partition[0], []).append(f.file_size_in_bytes)
    small = max(by_region["a"] + by_region["b"])
    large = min(by_region["c"])
    assert small < large

    # Only files below min_file_size are candidates: c's larger files are left alone.
    plan = compactor.plan(table, **SMALL, min_file_size=str(large), parallelism=1)
    assert sorted(_regions(plan)) == ["a", "b"]
    # Nothing is small under a 1 KiB target, but files above max_file_size are candidates.
    plan = compactor.plan(
        table,
        target_file_size="1KiB",
        allow_small_target=True,
        min_input_files=2,
        min_file_size="0",
        max_file_size=str(large - 1),
        parallelism=1,
    )
    assert sorted(f.size for g in plan.groups for f in g.files) == sorted(by_region["c"])


@pytest.mark.usefixtures("file_kind")
@pytest.mark.parametrize("file_kind", [FIELD_IDS, IMPORTED], indirect=True)
def test_rewrite_all_rewrites_a_compacted_table_again_with_the_same_rows(
    catalog: Catalog, java_reader: JavaReader
) -> None:
    _table(catalog)
    compact_and_verify(catalog, "db.t")
    table = catalog.load_table("db.t")
    assert compactor.plan(table, **SMALL).groups == []
    before, files = scan_rows(table), set(live_data_files(table))

    result = compactor.compact(table, **{**SMALL, "min_input_files": 5}, rewrite_all=True)

    # One file per partition, each rewritten alone despite min_input_files.
    assert sorted(g.partition_path for g in result.committed_groups) == [
        "region=a",
        "region=b",
        "region=c",
    ]
    after = catalog.load_table("db.t")
    assert not files & set(live_data_files(after))
    assert_same_rows(before, scan_rows(after))
    unmapped = unmapped_snapshots(after)  # Java reads them, their rows not compared
    assert after.metadata.current_snapshot_id not in unmapped
    assert_java_reads_same(after, unmapped)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"min_file_size": "2MiB"}, r"^min_file_size: 2.0 MiB must be below the target"),
        ({"max_file_size": "1MiB"}, r"^max_file_size: 1.0 MiB must be above the target"),
        ({"max_files_to_rewrite": 0}, r"^max_files_to_rewrite: must be at least 1"),
        ({"rewrite_job_order": "random"}, r"^rewrite_job_order 'random': must be one of"),
    ],
)
def test_bad_values_are_usage_errors_naming_the_option(
    catalog: Catalog, options: dict, message: str
) -> None:
    table = _table(catalog)
    with pytest.raises(UsageError, match=message):
        compactor.plan(table, **{**SMALL, **options})


def test_the_command_line_takes_sparks_names(tmp_path: Path) -> None:
    help_text = subprocess.run(
        [str(Path(sys.executable).parent / "compactor"), "run", "--help"],
        env={"COLUMNS": "200", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
        stdin=subprocess.DEVNULL,
    ).stdout
    for flag in (
        "--min-file-size",
        "--max-file-size",
        "--rewrite-all",
        "--max-files-to-rewrite",
        "--rewrite-job-order",
    ):
        assert flag in help_text
