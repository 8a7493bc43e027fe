"""Manifest rewrite planning: when a group of manifests is in order, how partitions are ordered,
and how entries are split, on manifest-list records made up in memory."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pyiceberg.conversions import to_bytes
from pyiceberg.manifest import ManifestContent, ManifestFile, PartitionFieldSummary
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import DayTransform, IdentityTransform, VoidTransform
from pyiceberg.typedef import Record
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestampType

from compactor.iceberg.value_keys import partition_sort_key, value_sort_key
from compactor.planning.manifest_groups import (
    first_field_ranges,
    overlapping,
    rewrite_reasons,
    split_evenly,
)

TARGET = 8 << 20
SCHEMA = Schema(
    NestedField(1, "region", StringType()),
    NestedField(2, "x", DoubleType()),
    NestedField(3, "ts", TimestampType()),
    NestedField(4, "id", LongType()),
)
BY_REGION = PartitionSpec(PartitionField(1, 1000, IdentityTransform(), "region"))


def _summary(kind: Any, lower: Any, upper: Any, null: bool = False, nan: bool = False) -> Any:
    return PartitionFieldSummary.from_args(
        contains_null=null,
        contains_nan=nan,
        lower_bound=None if lower is None else to_bytes(kind, lower),
        upper_bound=None if upper is None else to_bytes(kind, upper),
    )


def _manifest(
    length: int = 5_000,
    live: int = 1,
    deleted: int = 0,
    partitions: list[Any] | None = None,
    n: int = 0,
) -> ManifestFile:
    return ManifestFile.from_args(
        manifest_path=f"file:///t/metadata/m{n}.avro",
        manifest_length=length,
        partition_spec_id=0,
        content=ManifestContent.DATA,
        sequence_number=1,
        min_sequence_number=1,
        added_snapshot_id=1,
        added_files_count=live,
        existing_files_count=0,
        deleted_files_count=deleted,
        added_rows_count=live,
        existing_rows_count=0,
        deleted_rows_count=deleted,
        partitions=partitions or [],
    )


def _regions(*ranges: tuple[str, str]) -> list[ManifestFile]:
    return [
        _manifest(partitions=[_summary(StringType(), lo, hi)], n=n)
        for n, (lo, hi) in enumerate(ranges)
    ]


def test_many_small_manifests_are_out_of_order() -> None:
    manifests = [_manifest(n=n) for n in range(40)]
    (reason,) = rewrite_reasons(manifests, TARGET, [None] * 40)
    assert reason.startswith("40 manifests where 1 would hold")


def test_what_a_rewrite_writes_is_in_order() -> None:
    # ceil(bytes / target) manifests of about the target: a second run leaves them alone.
    total = int(2.6 * TARGET)
    count = math.ceil(total / TARGET)
    manifests = [_manifest(total // count, live=50_000, n=n) for n in range(count)]
    assert rewrite_reasons(manifests, TARGET, [None] * count) == []
    assert rewrite_reasons([_manifest(10, n=0)], TARGET, [None]) == []  # one tiny manifest


def test_an_oversized_manifest_is_split_unless_it_holds_one_entry() -> None:
    big = _manifest(2 * TARGET, live=90_000)
    assert rewrite_reasons([big], TARGET, [None]) == ["1 over 150% of the target size 8.0 MiB"]
    assert rewrite_reasons([_manifest(2 * TARGET, live=1)], TARGET, [None]) == []


def test_a_manifest_without_live_entries_is_dropped() -> None:
    manifests = [_manifest(TARGET, live=80_000), _manifest(4_000, live=0, deleted=3, n=1)]
    assert rewrite_reasons(manifests, TARGET, [None, None]) == ["1 without a live entry"]


def test_overlapping_partition_ranges_are_out_of_order() -> None:
    manifests = _regions(("a", "m"), ("c", "z"))
    ranges = first_field_ranges(BY_REGION, SCHEMA, manifests)
    big = [_manifest(TARGET, live=80_000, n=n) for n in range(2)]
    assert rewrite_reasons(big, TARGET, ranges) == ["partition ranges overlap"]


def test_ranges_meeting_at_one_value_are_clustered() -> None:
    # A partition large enough to span manifests: "m" ends one and starts the next.
    ranges = first_field_ranges(
        BY_REGION, SCHEMA, _regions(("m", "z"), ("a", "m"), ("m", "m"), ("z", "z"))
    )
    assert not overlapping(ranges)
    assert overlapping(first_field_ranges(BY_REGION, SCHEMA, _regions(("a", "c"), ("b", "b"))))


def test_nulls_sort_first_and_nan_last_in_a_manifests_range() -> None:
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "x"))
    kind = DoubleType()
    manifests = [
        _manifest(partitions=[_summary(kind, 1.0, 5.0, null=True)], n=0),  # null .. 5.0
        _manifest(partitions=[_summary(kind, 5.0, 9.0, nan=True)], n=1),  # 5.0 .. NaN
        _manifest(partitions=[_summary(kind, None, None, nan=True)], n=2),  # NaN only
    ]
    ranges = first_field_ranges(spec, SCHEMA, manifests)
    assert ranges[0] is not None and ranges[0][0] == value_sort_key(None)
    assert not overlapping(ranges)  # each meets the next at one value


def test_an_unpartitioned_or_void_first_field_uses_the_next_field() -> None:
    unpartitioned = first_field_ranges(PartitionSpec(), SCHEMA, _regions(("a", "z"), ("a", "z")))
    assert unpartitioned == [None, None] and not overlapping(unpartitioned)
    spec = PartitionSpec(
        PartitionField(4, 1000, VoidTransform(), "id_void"),
        PartitionField(3, 1001, DayTransform(), "ts_day"),
    )
    day = DayTransform().result_type(TimestampType())
    manifests = [
        _manifest(partitions=[_summary(LongType(), None, None, null=True), _summary(day, lo, hi)])
        for lo, hi in ((1, 3), (3, 5), (4, 9))
    ]
    ranges = first_field_ranges(spec, SCHEMA, manifests)
    assert not overlapping(ranges[:2]) and overlapping(ranges)


def test_partition_order_follows_java() -> None:
    values = [float("nan"), 1.5, None, 0.0, -0.0, float("-inf"), float("inf")]
    ordered = sorted(values, key=value_sort_key)
    assert ordered[0] is None and math.isnan(ordered[-1])
    assert [math.copysign(1, v) for v in ordered[2:4]] == [-1, 1]  # -0.0 before 0.0
    assert ordered[1] == float("-inf") and ordered[-2] == float("inf")
    tuples = [Record("b", 1), Record("a", 2), Record(None, 9), Record("a", 1)]
    assert sorted(tuples, key=partition_sort_key) == [
        Record(None, 9),
        Record("a", 1),
        Record("a", 2),
        Record("b", 1),
    ]


@pytest.mark.parametrize(("count", "parts"), [(10, 3), (7, 7), (7, 10), (0, 2), (100_001, 4)])
def test_entries_split_into_runs_differing_by_at_most_one(count: int, parts: int) -> None:
    sizes = split_evenly(count, parts)
    assert sum(sizes) == count
    assert len(sizes) == min(parts, count)
    assert not sizes or max(sizes) - min(sizes) <= 1
