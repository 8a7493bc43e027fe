"""Converting equality deletes, on groups made up here: the data sequence number each position
delete row is committed with, and which global deletes a commit removes. No table is read."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.typedef import Record

from compactor.commit.equality_commit import removable_globals
from compactor.errors import DataFileError
from compactor.options.defaults import DEFAULT_MEMORY_LIMIT, MIN_MEMORY_LIMIT, PROCESS_ALLOWANCE
from compactor.planning.equality_groups import EqualityGroup, EqualityPlan
from compactor.planning.planner import InputFile
from compactor.rewrite.equality_conversion import (
    HELD_ROW_BYTES,
    KEY_BYTES,
    READ_THREADS,
    READER_BYTES,
    Budget,
    _by_path,
    _position_rows,
)

A = Record("a")


def _file(
    path: str, content: DataFileContent = DataFileContent.DATA, rows: int = 10, **more: Any
) -> DataFile:
    data_file = DataFile.from_args(
        content=content,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=A,
        record_count=rows,
        file_size_in_bytes=100,
        **more,
    )
    data_file.spec_id = 0
    return data_file


def _delete(path: str, ids: list[int] | None = None) -> DataFile:
    return _file(path, DataFileContent.EQUALITY_DELETES, equality_ids=ids or [1])


def _group(inputs: list[tuple[str, int, list[DataFile]]], seqs: dict[str, int]) -> EqualityGroup:
    return EqualityGroup(
        group_id=0,
        spec_id=0,
        partition=A,
        partition_path="region=a",
        inputs=tuple(
            InputFile(_file(path, column_sizes={1: 40, 2: 7}), seq, tuple(deletes))
            for path, seq, deletes in inputs
        ),
        equality_deletes=(),
        sequence_numbers=seqs,
    )


def _rows(
    group: EqualityGroup, matched: list[pa.Array], live: dict[str, Any]
) -> list[tuple[str, int, int]]:
    """The rows written for ``matched`` (each input's matched positions), as the conversion
    reads the inputs: in path order."""
    found = sorted(zip(group.inputs, matched, strict=True), key=lambda m: m[0].path)
    table = _position_rows(list(_by_path(group, found, live)))
    return list(
        zip(*(table.column(n).to_pylist() for n in ("file_path", "pos", "seq")), strict=True)
    )


def test_rows_keep_the_newest_delete_sequence_number_sorted_by_path_and_position() -> None:
    e3, e5 = _delete("e3"), _delete("e5", [1, 2])
    group = _group([("d2", 2, [e3, e5]), ("d1", 1, [e3, e5]), ("d4", 4, [e5])], {"e3": 3, "e5": 5})
    live = {"d1": [(1, 0, A)], "d2": [(2, 0, A)], "d4": [(4, 0, A)]}
    matched = [pa.array([4, 0], pa.int64()), pa.array([], pa.int64()), pa.array([9], pa.int64())]

    assert _rows(group, matched, live) == [("d2", 0, 5), ("d2", 4, 5), ("d4", 9, 5)]
    assert group.data_sequence_number == 5
    assert group.key_bytes == 3 * (40 + 7)  # each input's key columns (1 and 2), by field id


def test_a_path_live_twice_lowers_the_rows_its_newer_entry_keeps() -> None:
    """d1 at 1 and again at 3: a row only the older entry loses must not reach the newer."""
    e2, e4 = _delete("e2"), _delete("e4")
    group = _group([("d1", 1, [e2, e4]), ("d1", 3, [e4])], {"e2": 2, "e4": 4})
    live = {"d1": [(1, 0, A), (3, 0, A)]}
    older, newer = pa.array([1, 2, 3], pa.int64()), pa.array([2, 3], pa.int64())

    assert _rows(group, [older, newer], live) == [("d1", 1, 2), ("d1", 2, 4), ("d1", 3, 4)]


def test_a_newer_entry_no_delete_applies_to_bounds_every_row() -> None:
    """d1 at 1 and again at 4, the newest delete's sequence number: its rows are its own."""
    e4 = _delete("e4")
    group = _group([("d1", 1, [e4])], {"e4": 4})
    live = {"d1": [(1, 0, A), (4, 0, A)], "other": [(1, 0, Record("b"))]}

    assert _rows(group, [pa.array([0, 5], pa.int64())], live) == [("d1", 0, 3), ("d1", 5, 3)]


def test_entries_that_disagree_are_refused() -> None:
    e2, e4 = _delete("e2"), _delete("e4")
    group = _group([("d1", 1, [e2, e4]), ("d1", 3, [e4])], {"e2": 2, "e4": 4})
    live = {"d1": [(1, 0, A), (3, 0, A)]}
    # The newer entry loses a row the older keeps: the same file cannot read so.
    with pytest.raises(DataFileError, match="disagree"):
        _rows(group, [pa.array([1], pa.int64()), pa.array([7], pa.int64())], live)


def test_a_global_delete_goes_once_every_group_it_applies_to_is_committed() -> None:
    g1 = _delete("g1")
    groups = (
        EqualityGroup(0, 0, A, "a", (InputFile(_file("d1"), 1, (g1,)),), ()),
        EqualityGroup(1, 0, Record("b"), "b", (InputFile(_file("d2"), 1, (g1,)),), ()),
    )
    plan = EqualityPlan(
        groups=groups,
        global_deletes={"g1": (None, "m"), "g2": (None, "m")},  # type: ignore[dict-item]
    )

    assert plan.global_targets() == {"g1": {0, 1}, "g2": set()}
    assert removable_globals(plan, {0: groups[0], 1: groups[1]}, {}) == ["g1", "g2"]
    assert removable_globals(plan, {0: groups[0]}, {}) == ["g2"]
    assert removable_globals(plan, {0: groups[0], 1: groups[1]}, {"g1": "added"}) == ["g2"]


def test_the_memory_limit_bounds_the_readers_and_the_rows_held() -> None:
    """Past the process's allowance and the deleted keys, half for the readers, the rest for
    the matched rows held before they are written; a lower limit holds less."""
    # 40 MB of deleted keys.
    deletes = [_file("e1", DataFileContent.EQUALITY_DELETES, 500_000, equality_ids=[1])]
    group = _group([(f"d{n}", 1, deletes) for n in range(8)], {"e1": 2})

    default = Budget.of(group, DEFAULT_MEMORY_LIMIT)
    lowest = Budget.of(group, MIN_MEMORY_LIMIT)
    larger = Budget.of(group, 4 * DEFAULT_MEMORY_LIMIT)

    assert (lowest.readers, default.readers, larger.readers) == (2, 3, READ_THREADS)
    assert lowest.held_rows < default.held_rows < larger.held_rows
    spare = DEFAULT_MEMORY_LIMIT - PROCESS_ALLOWANCE - 500_000 * KEY_BYTES
    held = default.readers * READER_BYTES + default.held_rows * (HELD_ROW_BYTES + 2 * len("d0"))
    assert spare - (HELD_ROW_BYTES + 4) < held <= spare
