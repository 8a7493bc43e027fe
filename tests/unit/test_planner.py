"""Planning on manifest entries made up here: which deletes apply to which file, how candidate
files are packed into groups, which groups are worth rewriting, in which order, and which
branch a plan starts from. No table is read: the entries and the metadata live in memory."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestEntry,
    ManifestEntryStatus,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.metadata import new_table_metadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.table.update import AddSnapshotUpdate, SetSnapshotRefUpdate, update_table_metadata
from pyiceberg.transforms import IdentityTransform, VoidTransform
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType

from compactor.errors import UsageError
from compactor.iceberg.pyiceberg_compat import POSITION_DELETE_FILE_PATH_ID
from compactor.options import resolve_options
from compactor.planning.planner import (
    _JOB_ORDERS,
    EqualityDeleteIndex,
    FileGroup,
    InputFile,
    _pack,
    _split_for_idle_workers,
    _within_max_files,
    branch_head,
    file_scoped_deleted_rows,
    is_unpartitioned,
    partition_path,
    skip_reason,
    too_many_deletes,
)

MiB = 1 << 20
TARGET = 8 * MiB
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "region", StringType(), required=False),
)
BY_REGION = PartitionSpec(
    PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="region"),
    spec_id=0,
)
# A v1 table's spec whose partition field was dropped: void, so it partitions nothing.
DROPPED = PartitionSpec(
    PartitionField(source_id=2, field_id=1000, transform=VoidTransform(), name="region"),
    spec_id=1,
)


def plan_options(**options: Any) -> Any:
    """What the planner reads of options given as the library takes them (small targets)."""
    given = {"target_file_size": "8MiB", "allow_small_target": True, "min_input_files": 2}
    given.update(options)
    return resolve_options("db.t", {}, **given).plan


def data_file(
    path: str,
    size: int = MiB,
    records: int = 100,
    region: str | None = "eu",
    content: DataFileContent = DataFileContent.DATA,
    spec_id: int = 0,
    **fields: Any,
) -> DataFile:
    made = DataFile.from_args(
        content=content,
        file_path=f"s3://bucket/db/t/data/{path}",
        file_format=FileFormat.PARQUET,
        partition=Record(region) if spec_id == 0 else Record(None),
        record_count=records,
        file_size_in_bytes=size,
        **fields,
    )
    made.spec_id = spec_id
    return made


def position_deletes(path: str, records: int, *targets: DataFile) -> DataFile:
    """A position delete file; with one target, bounded to its path as Java writes it."""
    bounds = {}
    if len(targets) == 1:
        bounds = {POSITION_DELETE_FILE_PATH_ID: targets[0].file_path.encode()}
    return data_file(
        path,
        records=records,
        content=DataFileContent.POSITION_DELETES,
        lower_bounds=bounds,
        upper_bounds=bounds,
    )


def inputs(*sizes: int) -> list[InputFile]:
    return [
        InputFile(data_file=data_file(f"f{number}.parquet", size), data_sequence_number=1)
        for number, size in enumerate(sizes)
    ]


def group(files: list[InputFile], group_id: int = 0, region: str = "eu") -> FileGroup:
    return FileGroup(
        group_id=group_id,
        spec_id=0,
        partition=Record(region),
        partition_path=f"region={region}",
        files=files,
        target_file_size=TARGET,
    )


# --- which deletes apply -----------------------------------------------------------------------


def entry(data: DataFile, sequence_number: int) -> ManifestEntry:
    return ManifestEntry.from_args(
        status=ManifestEntryStatus.ADDED,
        snapshot_id=1,
        sequence_number=sequence_number,
        file_sequence_number=sequence_number,
        data_file=data,
    )


def test_equality_deletes_apply_to_older_files_of_their_partition_or_everywhere_if_global() -> None:
    eu_delete = data_file("eq-eu.parquet", content=DataFileContent.EQUALITY_DELETES)
    global_delete = data_file("eq-all.parquet", content=DataFileContent.EQUALITY_DELETES, spec_id=1)
    index = EqualityDeleteIndex(
        {0: BY_REGION, 1: DROPPED}, [entry(eu_delete, 5), entry(global_delete, 3)]
    )

    def applying(data: DataFile, sequence_number: int) -> set[str]:
        found = index.for_data_file(entry(data, sequence_number))
        return {d.file_path.rsplit("/", 1)[1] for d in found}

    eu, us = data_file("eu.parquet"), data_file("us.parquet", region="us")
    assert applying(eu, 2) == {"eq-eu.parquet", "eq-all.parquet"}
    assert applying(us, 2) == {"eq-all.parquet"}  # another partition: only the global one
    assert applying(eu, 3) == {"eq-eu.parquet"}  # same sequence number: not older, not deleted
    assert applying(eu, 5) == set()


def test_only_file_scoped_position_deletes_count_and_never_beyond_the_files_rows() -> None:
    target, other = data_file("a.parquet", records=100), data_file("b.parquet")
    scoped = position_deletes("pos-a.parquet", 30, target)
    spanning = position_deletes("pos-ab.parquet", 50, target, other)  # bounds span two files
    equality = data_file("eq.parquet", records=70, content=DataFileContent.EQUALITY_DELETES)

    assert file_scoped_deleted_rows(target, [scoped, spanning, equality]) == 30
    assert file_scoped_deleted_rows(other, [scoped]) == 0
    assert file_scoped_deleted_rows(target, [scoped] * 5) == 100


def test_a_file_is_a_candidate_by_its_number_of_deletes_or_its_deleted_share() -> None:
    options = plan_options(delete_file_threshold=3, delete_ratio_threshold=0.3)
    target = data_file("a.parquet", records=100)
    few = [position_deletes("p1.parquet", 10, target)] * 2

    assert not too_many_deletes(target, few, options)
    assert too_many_deletes(target, [*few, data_file("p3.parquet")], options)  # three files
    assert too_many_deletes(target, [position_deletes("p4.parquet", 30, target)], options)


def test_a_spec_of_void_fields_is_unpartitioned_and_has_no_partition_path() -> None:
    assert is_unpartitioned(UNPARTITIONED_PARTITION_SPEC) and is_unpartitioned(DROPPED)
    assert not is_unpartitioned(BY_REGION)
    assert partition_path(DROPPED, SCHEMA, Record(None)) == ""
    assert partition_path(BY_REGION, SCHEMA, Record("eu")) == "region=eu"


# --- groups ------------------------------------------------------------------------------------


def test_packing_fills_groups_in_write_order_up_to_the_maximum_size() -> None:
    files = inputs(40, 40, 30, 100, 10, 10)

    packed = _pack(files, max_group_size=100)

    assert [[f.size for f in g] for g in packed] == [[40, 40], [30], [100], [10, 10]]
    assert [f for g in packed for f in g] == files  # nothing lost, nothing reordered
    assert _pack([], max_group_size=100) == []


def test_a_group_counts_its_outputs_bytes_and_each_delete_file_once() -> None:
    files = inputs(5 * MiB, 5 * MiB, 7 * MiB)
    shared = position_deletes("pos.parquet", 3, files[0].data_file, files[1].data_file)
    files[0] = InputFile(files[0].data_file, 1, delete_files=(shared,))
    files[1] = InputFile(files[1].data_file, 1, delete_files=(shared,))
    made = group(files)

    summary = made.summary()

    assert summary["input_bytes"] == 17 * MiB and summary["input_records"] == 300
    assert summary["expected_output_files"] == 3  # 17 MiB at 8 MiB a file
    assert summary["delete_files"] == 1
    assert made.inputs == {f.path for f in files} | {shared.file_path}
    assert group(inputs(1)).expected_output_files == 1
    assert FileGroup(0, 0, Record(), "", [], TARGET).partition_label == "(unpartitioned)"


@pytest.mark.parametrize(
    ("sizes", "options", "reason"),
    [
        ([MiB] * 4, {}, None),  # four small files into one
        ([MiB], {}, "groups_not_reducing_file_count"),  # one file into one
        ([6 * MiB, 6 * MiB], {}, "groups_not_reducing_file_count"),  # two into two
        ([MiB] * 3, {"min_input_files": 5}, "groups_below_min_input_files"),
        ([4 * MiB] * 3, {"min_input_files": 5}, None),  # few files, but a target's worth
        ([MiB], {"rewrite_all": True}, None),
        ([10 * TARGET], {}, None),  # one file too large: it is split
    ],
)
def test_a_group_is_skipped_only_when_its_rewrite_would_not_help(
    sizes: list[int], options: dict[str, Any], reason: str | None
) -> None:
    assert skip_reason(group(inputs(*sizes)), plan_options(**options)) == reason


def test_while_workers_would_idle_the_largest_group_is_cut_in_write_order_at_whole_targets() -> (
    None
):
    large = group(inputs(*[2 * MiB] * 16), group_id=0)  # 32 MiB: four targets' worth
    small = group(inputs(MiB, MiB), group_id=1, region="us")

    one_worker = _split_for_idle_workers([large, small], plan_options(parallelism=1))
    three_workers = _split_for_idle_workers([large, small], plan_options(parallelism=3))

    assert one_worker == [large, small]
    halves = [g for g in three_workers if g.partition_path == "region=eu"]
    assert [g.input_bytes for g in halves] == [2 * TARGET, 2 * TARGET]
    assert [f for g in halves for f in g.files] == large.files  # in write order, all of them
    assert small in three_workers and len(three_workers) == 3
    # A group under two targets' worth is never cut, however many workers wait.
    assert _split_for_idle_workers([small], plan_options(parallelism=4)) == [small]


def test_job_orders_sort_groups_by_files_or_bytes_with_ties_by_partition() -> None:
    a = group(inputs(MiB, MiB, MiB), group_id=0, region="a")  # 3 files, 3 MiB
    b = group(inputs(4 * MiB, 4 * MiB), group_id=1, region="b")  # 2 files, 8 MiB
    c = group(inputs(MiB, MiB, MiB), group_id=2, region="c")  # like a: a tie, by partition

    def order(name: str) -> list[str]:
        ordered = sorted([c, b, a], key=_JOB_ORDERS[name])
        return [g.partition_path.removeprefix("region=") for g in ordered]

    assert order("most-fragmented") == ["a", "c", "b"]
    assert order("files-desc") == ["a", "c", "b"]
    assert order("files-asc") == ["b", "a", "c"]
    assert order("bytes-desc") == ["b", "a", "c"]
    assert order("bytes-asc") == ["a", "c", "b"]


def test_max_files_to_rewrite_takes_groups_in_order_while_they_fit_and_counts_the_rest() -> None:
    groups = [group(inputs(*[MiB] * n), group_id=n) for n in (4, 3, 2)]
    plan: Any = SimpleNamespace(skipped=defaultdict(int))

    taken = _within_max_files(groups, 6, plan)

    assert [len(g.files) for g in taken] == [4, 2]  # 4 + 3 is over 6; 4 + 2 fits
    assert plan.skipped == {"groups_beyond_max_files_to_rewrite": 1}


# --- the branch planned from -------------------------------------------------------------------


def test_the_branch_head_is_main_by_default_and_a_missing_branch_or_a_tag_is_refused() -> None:
    metadata = new_table_metadata(
        SCHEMA, BY_REGION, UNSORTED_SORT_ORDER, "file:///nowhere/db/t", {}
    )
    empty = Table(("db", "t"), metadata, "memory", None, None)  # type: ignore[arg-type]
    assert branch_head(empty, "db.t", MAIN_BRANCH) is None

    snapshot = Snapshot(
        snapshot_id=7,
        sequence_number=1,
        timestamp_ms=1_790_000_000_000,
        manifest_list="file:///nowhere/db/t/metadata/snap-7.avro",
        summary=Summary(operation=Operation.APPEND),
    )
    updates = [AddSnapshotUpdate(snapshot=snapshot)] + [
        SetSnapshotRefUpdate(ref_name=name, type=kind, snapshot_id=7)
        for name, kind in [
            (MAIN_BRANCH, SnapshotRefType.BRANCH),
            ("audit", SnapshotRefType.BRANCH),
            ("v1", SnapshotRefType.TAG),
        ]
    ]
    table = Table(
        ("db", "t"),
        update_table_metadata(metadata, tuple(updates)),
        "memory",
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
    )

    assert branch_head(table, "db.t", "audit") == snapshot
    with pytest.raises(UsageError, match=r"no branch 'dev' \(branches: audit, main\)"):
        branch_head(table, "db.t", "dev")
    with pytest.raises(UsageError, match="'v1' is a tag"):
        branch_head(table, "db.t", "v1")
