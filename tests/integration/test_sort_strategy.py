"""Sort and z-order rewrites: the same rows, written in order, files with non-overlapping ranges.

Every row test runs on both read paths (bulk and Iceberg) and ends with Iceberg Java reading
the same rows (compact_and_verify); a sort by a renamed column and a z-order also run on
imported files (without field ids, read through the table's name mapping), on the bulk path.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.sorting import NullOrder, SortDirection, SortField, SortOrder
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    IdentityTransform,
    TruncateTransform,
    VoidTransform,
)
from pyiceberg.types import (
    BinaryType,
    DecimalType,
    DoubleType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
)

import compactor
from compactor.errors import UsageError
from compactor.planning.tasks import RewriteTask
from compactor.rewrite.task_runner import TaskCancelled, run_task

from support.runs import compact_and_verify, planned_tasks
from support.tables import (
    FIELD_IDS,
    IMPORTED,
    append_rows,
    live_data_files,
    local_path,
    read_data_file,
)

pytestmark = pytest.mark.usefixtures("read_path")

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "region", StringType(), required=True),
    NestedField(3, "x", DoubleType(), required=False),
    NestedField(4, "y", LongType(), required=False),
    NestedField(5, "name", StringType(), required=False),
    NestedField(6, "at", TimestampType(), required=False),
    NestedField(7, "pad", StringType(), required=False),
)
BY_REGION = PartitionSpec(
    PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region")
)
# Outputs of ~100 KiB: each group writes several files, whose ranges must not overlap.
SMALL = {"target_file_size": "100KiB", "allow_small_target": True, "min_input_files": 2}
COMMITS, ROWS = 12, 1250
START = datetime(2026, 1, 1)
# Both read paths on files with field ids; imported files on the bulk path, whose reading
# through the name mapping is compactor's own.
WITH_IMPORTED = pytest.mark.parametrize(
    ("read_path", "file_kind"),
    [
        pytest.param("bulk", FIELD_IDS, id="bulk"),
        pytest.param("iceberg", FIELD_IDS, id="iceberg"),
        pytest.param("bulk", IMPORTED, id="bulk-imported"),
    ],
    indirect=True,
)


def _rows(commit: int, rng: np.random.Generator, regions: tuple[str, ...]) -> dict[str, list]:
    n = ROWS
    x = rng.uniform(-1000, 1000, n)
    x[rng.random(n) < 0.05] = np.nan
    xs: list = x.tolist()
    ys: list = rng.integers(-(10**6), 10**6, n).tolist()
    names: list = [f"n{v:07d}" for v in rng.integers(0, 10**7, n)]
    for i in rng.choice(n, 30, replace=False):  # nulls in every sort column
        xs[i] = None
    for i in rng.choice(n, 30, replace=False):
        ys[i] = None
    for i in rng.choice(n, 30, replace=False):
        names[i] = None
    return {
        "id": list(range(commit * n, (commit + 1) * n)),
        "region": [regions[i % len(regions)] for i in range(n)],
        "x": xs,
        "y": ys,
        "name": names,
        "at": [START + timedelta(minutes=int(m)) for m in rng.integers(0, 60 * 24 * 4, n)],
        "pad": [f"{v:016x}" * 3 for v in rng.integers(0, 2**62, n)],
    }


def _table(
    catalog: Catalog,
    *,
    partitioned: bool = True,
    sort_order: SortOrder | None = None,
    evolve: bool = False,
) -> Table:
    """Tables of COMMITS appends of random rows; ``evolve`` renames ``y`` half-way."""
    kwargs = {"sort_order": sort_order} if sort_order else {}
    table = catalog.create_table(
        "db.t", SCHEMA, partition_spec=BY_REGION if partitioned else PartitionSpec(), **kwargs
    )
    rng = np.random.default_rng(7)
    regions = ("eu", "us") if partitioned else ("all",)
    for commit in range(COMMITS):
        if evolve and commit == COMMITS // 2:
            with table.update_schema() as update:
                update.rename_column("y", "why")
        rows = _rows(commit, rng, regions)
        if evolve and commit >= COMMITS // 2:
            rows["why"] = rows.pop("y")
        append_rows(table, pa.table(rows, schema=table.schema().as_arrow()))
    return table


def _bound(data_file: DataFile, field_id: int, kind: object, upper: bool) -> object:
    bounds = data_file.upper_bounds if upper else data_file.lower_bounds
    return from_bytes(kind, bounds[field_id])  # type: ignore[arg-type]


def _files_by_partition(table: Table) -> dict[tuple, list[DataFile]]:
    grouped: dict[tuple, list[DataFile]] = defaultdict(list)
    for f in live_data_files(table).values():
        grouped[tuple(f.partition)].append(f)
    return grouped


def _assert_ranges_do_not_overlap(
    table: Table, field_id: int, transform: Callable[[Any], Any] = lambda v: v
) -> int:
    """Within each partition, files' [lower, upper] on the (transformed) column touch at most;
    returns the number of files."""
    kind = table.schema().find_type(field_id)
    count = 0
    for files in _files_by_partition(table).values():
        ranges = sorted(
            (
                transform(_bound(f, field_id, kind, False)),
                transform(_bound(f, field_id, kind, True)),
            )
            for f in files
        )
        for (_, upper), (lower, _) in zip(ranges, ranges[1:], strict=False):
            assert upper <= lower, f"ranges overlap: {ranges}"
        count += len(files)
    return count


def _column_in_file_order(table: Table, data_file: DataFile, name: str) -> list:
    return read_data_file(table, data_file).column(name).to_pylist()


def test_sort_by_an_explicit_order_writes_sorted_non_overlapping_files(catalog: Catalog) -> None:
    _table(catalog)
    result, table, _ = compact_and_verify(
        catalog, "db.t", **SMALL, strategy="sort", sort_order="y DESC NULLS LAST, id"
    )
    files = _assert_ranges_do_not_overlap(table, field_id=4)
    assert files > len(_files_by_partition(table)), "each partition must write several files"
    for f in live_data_files(table).values():
        ys = _column_in_file_order(table, f, "y")
        values = [v for v in ys if v is not None]
        assert values == sorted(values, reverse=True)
        assert ys[len(values) :] == [None] * (len(ys) - len(values)), "nulls last"
        assert f.sort_order_id is None, "an order the table does not have"
    assert result.to_dict()["strategy"] == "sort"


def test_sort_by_the_tables_order_with_transforms_records_its_order_id(catalog: Catalog) -> None:
    order = SortOrder(
        SortField(source_id=6, transform=DayTransform(), direction=SortDirection.ASC),
        SortField(
            source_id=5,
            transform=TruncateTransform(4),
            direction=SortDirection.DESC,
            null_order=NullOrder.NULLS_FIRST,
        ),
        SortField(source_id=1, transform=IdentityTransform()),
    )
    _table(catalog, partitioned=False, sort_order=order)
    _, table, _ = compact_and_verify(catalog, "db.t", **SMALL, strategy="sort")
    order_id = table.metadata.default_sort_order_id
    assert order_id >= 1
    for f in live_data_files(table).values():
        assert f.sort_order_id == order_id
        rows = read_data_file(table, f).select(["at", "name", "id"]).to_pylist()
        keys = [
            (
                (r["at"].date() if r["at"] else None),
                r["name"][:4] if r["name"] is not None else None,
                r["id"],
            )
            for r in rows
        ]

        def key(k: tuple) -> tuple:
            day, prefix, ident = k
            # day ASC NULLS FIRST; name prefix DESC NULLS FIRST; id ASC.
            return (day is not None, day or START.date(), prefix is not None, _desc(prefix), ident)

        assert keys == sorted(keys, key=key)
    micros_per_day = 86_400_000_000
    _assert_ranges_do_not_overlap(table, field_id=6, transform=lambda v: v // micros_per_day)


def _desc(text: str | None) -> tuple:
    return tuple(-ord(c) for c in text or "") + (1,)


def test_sort_by_truncate_of_binary_and_decimal_columns_as_java_truncates(
    catalog: Catalog,
) -> None:
    """truncate[W] of a binary keeps its first W bytes; of a decimal, the unscaled value floored
    to a multiple of W (-0.05 truncates to -1.00 with W = 100 at scale 2), as Iceberg Java."""
    schema = Schema(
        NestedField(1, "id", LongType(), required=True),
        NestedField(2, "payload", BinaryType(), required=False),
        NestedField(3, "amount", DecimalType(10, 2), required=False),
    )
    order = SortOrder(
        SortField(source_id=2, transform=TruncateTransform(2)),
        SortField(source_id=3, transform=TruncateTransform(100), direction=SortDirection.DESC),
        SortField(source_id=1, transform=IdentityTransform()),
    )
    table = catalog.create_table("db.truncated", schema, sort_order=order)
    rng = np.random.default_rng(11)
    for commit in range(COMMITS):
        ids = range(commit * 200, (commit + 1) * 200)
        payloads = [
            None if i % 17 == 0 else bytes(rng.integers(0, 256, int(rng.integers(0, 5))).tolist())
            for i in ids
        ]
        amounts = [
            None if i % 13 == 0 else Decimal(int(rng.integers(-5000, 5000))) / 100 for i in ids
        ]
        table.append(
            pa.table(
                {"id": list(ids), "payload": payloads, "amount": amounts},
                schema=table.schema().as_arrow(),
            )
        )
    _, table, _ = compact_and_verify(catalog, "db.truncated", **SMALL, strategy="sort")

    def key(row: dict) -> tuple:
        prefix, amount = row["payload"], row["amount"]
        floor = None if amount is None else (int(amount * 100) // 100) * 100
        # payload prefix ASC NULLS FIRST; amount floor DESC NULLS LAST (Iceberg's default).
        return (
            prefix is not None,
            (prefix or b"")[:2],
            floor is None,
            -(floor or 0),
            row["id"],
        )

    for f in live_data_files(table).values():
        rows = read_data_file(table, f).to_pylist()
        assert rows == sorted(rows, key=key)
        assert f.sort_order_id == table.metadata.default_sort_order_id


def test_nans_and_nulls_in_the_sort_key_keep_every_row_in_order(catalog: Catalog) -> None:
    _table(catalog)
    _, table, before = compact_and_verify(
        catalog, "db.t", **SMALL, strategy="sort", sort_order="x ASC NULLS FIRST"
    )
    for f in live_data_files(table).values():
        xs = _column_in_file_order(table, f, "x")
        nulls = xs.count(None)
        assert xs[:nulls] == [None] * nulls
        rest = xs[nulls:]
        nans = sum(1 for v in rest if math.isnan(v))
        assert all(math.isnan(v) for v in rest[len(rest) - nans :]), "NaN sorts last"
        assert rest[: len(rest) - nans] == sorted(rest[: len(rest) - nans])
    assert pc.sum(pc.is_nan(before.column("x"))).as_py() > 0


@pytest.mark.usefixtures("file_kind")
@WITH_IMPORTED
def test_sort_after_a_schema_change_uses_the_current_names(catalog: Catalog) -> None:
    _table(catalog, evolve=True)
    _, table, _ = compact_and_verify(catalog, "db.t", **SMALL, strategy="sort", sort_order="why")
    _assert_ranges_do_not_overlap(table, field_id=4)


@pytest.mark.usefixtures("file_kind")
@WITH_IMPORTED
def test_zorder_clusters_both_columns_better_than_binpack(catalog: Catalog) -> None:
    def mean_box(table: Table) -> float:
        """The mean share of the (x, y) plane that a file's bounds cover."""
        files = list(live_data_files(table).values())
        schema = table.schema()
        shares = [1.0] * len(files)
        for field_id in (3, 4):
            kind = schema.find_type(field_id)
            lows = [float(_bound(f, field_id, kind, False)) for f in files]
            highs = [float(_bound(f, field_id, kind, True)) for f in files]
            whole = max(highs) - min(lows)
            shares = [s * (h - lo) / whole for s, h, lo in zip(shares, highs, lows, strict=True)]
        return sum(shares) / len(shares)

    _table(catalog, partitioned=False)
    _, binpacked, _ = compact_and_verify(catalog, "db.t", **SMALL)
    catalog.drop_table("db.t")
    _table(catalog, partitioned=False)
    _, zordered, _ = compact_and_verify(catalog, "db.t", **SMALL, strategy="zorder", zorder="x, y")

    assert len(live_data_files(zordered)) >= 4
    # Bin-packed files each cover nearly the whole plane; each z-ordered file, a run of the
    # z-curve, covers a few of its quadrants (files are cut by size, not at quadrant bounds).
    binpacked_box, zordered_box = mean_box(binpacked), mean_box(zordered)
    assert binpacked_box > 0.9 and zordered_box < 0.6 * binpacked_box, (binpacked_box, zordered_box)
    for f in live_data_files(zordered).values():
        assert f.sort_order_id is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"strategy": "sort"},
            "table db.t: has no sort order: give one with sort_order",
        ),
        (
            {"strategy": "sort", "sort_order": "nope DESC"},
            "table db.t: sort_order: no column 'nope' (columns: id, region, x, y, name, at, pad)",
        ),
        (
            {"strategy": "sort", "sort_order": "id SIDEWAYS"},
            "sort_order 'id SIDEWAYS': expected columns with optional ASC|DESC and NULLS",
        ),
        ({"sort_order": "id"}, "sort_order 'id': is only used with strategy 'sort'"),
        ({"strategy": "zorder"}, "strategy 'zorder': give the columns to interleave with zorder"),
        ({"strategy": "zorder", "zorder": "x, x"}, "zorder 'x, x': expected distinct column"),
        ({"strategy": "shuffle"}, "strategy 'shuffle': must be one of 'binpack', 'sort', 'zorder'"),
    ],
)
def test_bad_sort_settings_are_one_line_errors_and_change_nothing(
    catalog: Catalog, options: dict, message: str
) -> None:
    table = _table(catalog)
    before = table.current_snapshot()
    with pytest.raises(UsageError) as raised:
        compactor.compact(table, **SMALL, **options)
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)
    assert catalog.load_table("db.t").current_snapshot() == before


def test_a_bucket_sort_order_is_refused_with_one_line(catalog: Catalog) -> None:
    order = SortOrder(SortField(source_id=1, transform=BucketTransform(8)))
    table = _table(catalog, sort_order=order)
    with pytest.raises(UsageError, match=r"sort order field bucket\[8\]\(id\) cannot be sorted"):
        compactor.compact(table, **SMALL, strategy="sort")


def test_a_sort_order_of_void_fields_only_is_refused_with_one_line(catalog: Catalog) -> None:
    order = SortOrder(SortField(source_id=1, transform=VoidTransform()))
    table = _table(catalog, sort_order=order)
    with pytest.raises(UsageError, match=r"orders by nothing \(every field is void\)"):
        compactor.compact(table, **SMALL, strategy="sort")


def test_a_sort_task_round_trips_through_json_and_sorts_where_it_runs(catalog: Catalog) -> None:
    order = SortOrder(SortField(source_id=4, transform=IdentityTransform()))
    table = _table(catalog, partitioned=False, sort_order=order)
    plan, tasks = planned_tasks(table, "run000000001", **SMALL, strategy="sort", parallelism=2)
    assert len(plan.groups) == 1, "a sorted group is never cut for idle workers"
    (task,) = tasks
    again = RewriteTask.from_json(task.to_json())
    assert again.clustering == task.clustering == plan.clustering
    assert again.clustering is not None and again.clustering.sort_order_id == 1

    result = run_task(again)
    assert result.records_read == COMMITS * ROWS and len(result.data_files) > 1
    for data_file in result.data_files:
        assert data_file.sort_order_id == 1
        ys = read_data_file(table, data_file).column("y").to_pylist()
        nulls = ys.count(None)
        assert ys[:nulls] == [None] * nulls and ys[nulls:] == sorted(ys[nulls:])


class _CancelOnceRead:
    """A cancel token set once every input of a task has been read."""

    def __init__(self, files: int) -> None:
        self.files, self.read = files, 0

    def on_read(self, files: int, _size: int) -> None:
        self.read += files

    def is_cancelled(self) -> bool:
        return self.read >= self.files


def test_a_sort_cancelled_after_reading_stops_before_writing_and_leaves_no_output(
    catalog: Catalog,
) -> None:
    order = SortOrder(SortField(source_id=4, transform=IdentityTransform()))
    table = _table(catalog, partitioned=False, sort_order=order)
    _, (task,) = planned_tasks(table, "run000000002", **SMALL, strategy="sort", bulk_read=True)
    token = _CancelOnceRead(len(task.inputs))

    with pytest.raises(TaskCancelled, match="stopped before group"):
        run_task(task, token, token.on_read)

    assert token.read == len(task.inputs), "cancelled only once every input was read"
    assert list(local_path(table.location()).rglob("compactor-run000000002-*.parquet")) == []
