"""Build fragmented sample tables: many small files over many commits, as streaming writers leave."""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Callable

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestamptzType

REGIONS = ("eu", "us", "ap", "sa")
START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

EVENTS_SCHEMA = Schema(
    NestedField(1, "event_id", LongType(), required=True),
    NestedField(2, "ts", TimestamptzType(), required=True),
    NestedField(3, "region", StringType(), required=True),
    NestedField(4, "user_id", LongType(), required=False),
    NestedField(5, "amount", DoubleType(), required=False),
    NestedField(6, "payload", StringType(), required=False),
)
EVENTS_SPEC = PartitionSpec(
    PartitionField(source_id=2, field_id=1000, transform=DayTransform(), name="ts_day"),
    PartitionField(source_id=3, field_id=1001, transform=IdentityTransform(), name="region"),
)


def events_batch(commit: int, rows: int, days: int) -> pa.Table:
    """Deterministic rows for one commit, spread over ``days`` days and every region."""
    first = commit * rows
    ids = pa.array(range(first, first + rows), pa.int64())
    seconds = [(i * 7919) % (days * 86400) for i in range(first, first + rows)]
    return pa.table(
        {
            "event_id": ids,
            "ts": pa.array(
                [START + dt.timedelta(seconds=s) for s in seconds], pa.timestamp("us", tz="UTC")
            ),
            "region": pa.array([REGIONS[i % len(REGIONS)] for i in range(first, first + rows)]),
            "user_id": pa.array(
                [None if i % 97 == 0 else i % 10_000 for i in range(first, first + rows)],
                pa.int64(),
            ),
            "amount": pa.array(
                [None if i % 89 == 0 else (i % 1000) / 7 for i in range(first, first + rows)]
            ),
            "payload": pa.array(
                [f"event-{i}-" + "x" * (i % 64) for i in range(first, first + rows)]
            ),
        },
        schema=EVENTS_SCHEMA.as_arrow(),
    )


def create_events_table(
    catalog: Catalog,
    identifier: str,
    *,
    commits: int,
    rows_per_commit: int,
    days: int = 3,
    properties: dict[str, str] | None = None,
    on_commit: Callable[[int], None] | None = None,
) -> Table:
    """(Re)create ``identifier`` partitioned by day(ts) and region, appended in ``commits`` commits.

    Every commit writes one small file per (day, region) partition it touches.
    """
    namespace = identifier.rsplit(".", 1)[0]
    with contextlib.suppress(NamespaceAlreadyExistsError):
        catalog.create_namespace(namespace)
    with contextlib.suppress(NoSuchTableError):
        catalog.purge_table(identifier)
    table = catalog.create_table(
        identifier, EVENTS_SCHEMA, partition_spec=EVENTS_SPEC, properties=properties or {}
    )
    for commit in range(commits):
        table.append(events_batch(commit, rows_per_commit, days))
        if on_commit:
            on_commit(commit)
    return table
