"""Merge-on-read delete files written and committed (pyiceberg 0.12 cannot write them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table
from pyiceberg.typedef import Record

from compactor.iceberg import delete_files
from compactor.iceberg.value_keys import partition_key


# The spec's position delete schema (pyiceberg's POSITIONAL_DELETE_SCHEMA types ``pos`` as int).
def write_position_delete_file(
    table: Table, deletes: Mapping[DataFile, Iterable[int]], *, path_bounds: bool = True
) -> DataFile:
    """Write a Parquet position delete file deleting ``positions`` of each data file.

    All data files must share one spec and partition. With ``path_bounds`` the file carries
    ``file_path`` bounds (as Java writes them), otherwise it applies partition-wide by metrics.
    """
    files = list(deletes)
    assert files, "no data files given"
    spec_ids = {f.spec_id for f in files}
    partitions = {partition_key(f.partition) for f in files}
    assert len(spec_ids) == 1 and len(partitions) == 1, "delete file must cover one partition"
    rows = [(f.file_path, int(p)) for f in files for p in deletes[f]]
    data = pa.table({"file_path": [r[0] for r in rows], "pos": [r[1] for r in rows]})
    return delete_files.write_position_delete_file(
        table, data, spec_id=files[0].spec_id, partition=files[0].partition, path_bounds=path_bounds
    )


def write_equality_delete_file(
    table: Table,
    columns: Sequence[str],
    rows: Sequence[tuple[Any, ...]],
    *,
    spec_id: int,
    partition: Record,
) -> DataFile:
    """Write a Parquet equality delete file on ``columns`` (table column names)."""
    schema = table.schema().as_arrow()
    keys = pa.table(
        {
            name: pa.array([r[i] for r in rows], schema.field(name).type)
            for i, name in enumerate(columns)
        }
    )
    return delete_files.write_equality_delete_file(
        table, keys, spec_id=spec_id, partition=partition
    )


commit_delete_files = delete_files.commit_delete_files
