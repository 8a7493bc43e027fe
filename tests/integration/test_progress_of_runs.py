"""The progress a run reports while it reads and writes a group, on real tables."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog

from compactor.compaction import compact_table
from compactor.options import resolve_options

from support.runs import DEFAULT_OPTIONS


class Recorded:
    """A run's progress, as told."""

    def __init__(self) -> None:
        self.plan: Any = None
        self.advances: list[tuple[int, int]] = []

    def start(self, plan: Any) -> None:
        self.plan = plan

    def advance(self, input_files: int, input_bytes: int) -> None:
        self.advances.append((input_files, input_bytes))


@pytest.mark.parametrize("bulk_read", [False, True])
def test_progress_moves_while_a_group_reads_its_files(catalog: Catalog, bulk_read: bool) -> None:
    """One long group (a 20 GB table is one) must not look stuck until it finishes."""
    table = catalog.create_table("db.t", pa.schema([("id", pa.int64())]))
    for start in range(0, 50, 10):
        table.append(pa.table({"id": pa.array(range(start, start + 10), pa.int64())}))
    options = resolve_options(
        "db.t", table.metadata.properties, **{**DEFAULT_OPTIONS, "bulk_read": bulk_read}
    )
    recorded = Recorded()

    result = compact_table(table, options, progress=recorded)

    assert result.to_dict()["rewritten_files"] == 5
    (group,) = result.plan.groups
    sizes = [f.size for f in group.files]
    if bulk_read:  # one run of five files, read in bulk, then the group's end
        assert recorded.advances == [(5, sum(sizes)), (0, 0)]
    else:  # each file as it is read, then the group's end
        assert recorded.advances == [(1, size) for size in sizes] + [(0, 0)]
    assert recorded.plan.input_bytes == sum(sizes)


@pytest.mark.parametrize("bulk_read", [False, True])
def test_a_sorted_group_is_half_done_when_read_and_done_when_written(
    catalog: Catalog, bulk_read: bool
) -> None:
    """A sort reads every input before it writes a row: its progress must not stand at 100%
    through the merge. Reading counts half the bytes, writing the sorted rows the rest."""
    table = catalog.create_table("db.t", pa.schema([("id", pa.int64())]))
    for start in range(0, 5000, 1000):
        ids = pa.array(reversed(range(start, start + 1000)), pa.int64())
        table.append(pa.table({"id": ids}))
    options = resolve_options(
        "db.t",
        table.metadata.properties,
        **{**DEFAULT_OPTIONS, "bulk_read": bulk_read, "strategy": "sort", "sort_order": "id"},
    )
    recorded = Recorded()

    result = compact_table(table, options, progress=recorded)

    assert result.to_dict()["rewritten_files"] == 5
    total = recorded.plan.input_bytes
    read = [size for files, size in recorded.advances if files > 0]
    written = [size for files, size in recorded.advances if files == 0 and size > 0]
    assert sum(files for files, _ in recorded.advances) == 5
    assert 0 < sum(read) <= total / 2  # all read, half done: the merge is still to come
    assert written and sum(read) + sum(written) == total  # done once the rows are written
    assert recorded.advances[-1] == (0, 0)  # told as the rows were written, not at the end
