"""Rewrite one group of position delete files: keep the rows that still apply, write them anew.

:func:`rewrite_delete_group` reads a group's files and keeps a row ``(path, pos)`` only if a
live data file at ``path`` has a data sequence number <= the row's delete file's: other rows
never applied to a live row (the spec's rule). The kept rows, de-duplicated and sorted by
(``file_path``, ``pos``), go into Parquet position delete files rolling at the target size,
each path listed in the group's intent file (:mod:`compactor.rewrite.intent`) before its file is
created. It returns a :class:`~compactor.planning.delete_groups.RewrittenDeleteGroup`; a group
it leaves alone says why in ``skipped``: a single file with no dangling row, or rows naming a
path that two live data files share or a data file of another partition (readers differ on
whether those apply; a rewrite would pick one reading).

A group's rows are held in memory while it is rewritten (16 bytes plus the path per row, the
path dictionary-shared by Arrow per file).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestEntry
from pyiceberg.table import Table
from pyiceberg.typedef import Record

from compactor.errors import CompactorError, DataFileError, first_line
from compactor.iceberg.pyiceberg_compat import (
    POSITION_DELETE_FILE_PATH_ID,
    POSITION_DELETE_POS_ID,
    file_statistics,
    parquet_writer_kwargs,
    position_delete_schema,
)
from compactor.iceberg.value_keys import same_partition
from compactor.planning.delete_groups import (
    DeleteGroup,
    LiveData,
    RewrittenDeleteGroup,
    sequence_number,
)
from compactor.rewrite.intent import IntentLog
from compactor.rewrite.parquet_output import FILL_RATIO, output_file_name, output_location

MAX_ROW_GROUP_ROWS = 1024 * 1024
MIN_ROW_GROUP_ROWS = 1024
# Java writes file_path and pos of position deletes with full metrics whatever the table says:
# readers use the file_path bounds to scope a delete file to one data file.
FULL_METRICS = {"write.metadata.metrics.default": "full"}

# Why a group is left alone.
SINGLE_FILE = "single_delete_file_without_dangling_rows"
SHARED_PATH = "rows_name_a_path_of_several_live_data_files"
OTHER_PARTITION = "rows_name_a_data_file_of_another_partition"


def rewrite_delete_group(
    table: Table,
    identifier: str,
    group: DeleteGroup,
    live: LiveData,
    target_file_size: int,
    run_id: str | None,
) -> RewrittenDeleteGroup:
    """Read ``group``'s delete files, keep the rows that apply to ``live`` data files, and write
    them for run ``run_id`` (None: a dry run, which writes nothing)."""
    rows = pa.concat_tables([read_delete_file(table, identifier, e) for e in group.entries])
    kept, rewritten = _kept_rows(group, rows, live)
    del rows
    if kept is None:
        return rewritten
    if len(group.entries) == 1 and rewritten.dangling_rows == 0:
        return replace(rewritten, skipped=SINGLE_FILE)
    rewritten = replace(rewritten, rows_written=kept.num_rows)
    if run_id is None or kept.num_rows == 0:
        return rewritten
    intent = IntentLog(table.io, table.metadata.location, run_id, group.group_id)
    outputs = _write_delete_files(table, rewritten, kept, run_id, intent.add, target_file_size)
    return replace(rewritten, outputs=tuple(outputs))


def read_delete_file(table: Table, identifier: str, entry: ManifestEntry) -> pa.Table:
    """``file_path`` and ``pos`` of one position delete file, with its data sequence number."""
    delete_file = entry.data_file
    path = delete_file.file_path
    try:
        with table.io.new_input(path).open() as stream:
            parquet = pq.ParquetFile(stream)
            arrow_schema = parquet.schema_arrow
            for name, field_id in (
                ("file_path", POSITION_DELETE_FILE_PATH_ID),
                ("pos", POSITION_DELETE_POS_ID),
            ):
                index = arrow_schema.get_field_index(name)
                if index < 0:
                    raise DataFileError(
                        f"table {identifier}: position delete file {path} has no {name} column"
                    )
                meta = arrow_schema.field(index).metadata or {}
                written_id = meta.get(b"PARQUET:field_id")
                if written_id is not None and int(written_id) != field_id:
                    raise DataFileError(
                        f"table {identifier}: position delete file {path}: column {name} has "
                        f"field id {int(written_id)}, not {field_id}"
                    )
            data = parquet.read(columns=["file_path", "pos"])
    except CompactorError:
        raise
    except Exception as exc:
        raise DataFileError(
            f"table {identifier}: cannot read position delete file {path}: {first_line(exc)}"
        ) from exc
    if data.num_rows != delete_file.record_count:
        raise DataFileError(
            f"table {identifier}: position delete file {path} holds {data.num_rows} rows, its "
            f"manifest entry says {delete_file.record_count}"
        )
    file_path = data.column("file_path")
    if pa.types.is_dictionary(file_path.type):
        file_path = file_path.cast(pa.string())
    return pa.table(
        {
            "file_path": file_path.cast(pa.string()),
            "pos": data.column("pos").cast(pa.int64()),
            "seq": pa.array([sequence_number(entry)] * data.num_rows, pa.int64()),
        }
    )


def _kept_rows(
    group: DeleteGroup, rows: pa.Table, live: LiveData
) -> tuple[pa.Table | None, RewrittenDeleteGroup]:
    """The rows that still apply to a live data file, unique and sorted, and what was found;
    no rows when the group is left alone (the group says why)."""
    unique_paths = pc.unique(rows.column("file_path")).to_pylist()
    live_seqs: list[int | None] = []
    for path in unique_paths:
        files = live.get(path, [])
        if len(files) > 1:
            return None, RewrittenDeleteGroup.of(group, skipped=SHARED_PATH)
        if files:
            seq, spec_id, partition = files[0]
            if spec_id != group.spec_id or not same_partition(partition, group.partition):
                return None, RewrittenDeleteGroup.of(group, skipped=OTHER_PARTITION)
            live_seqs.append(seq)
        else:
            live_seqs.append(None)
    indices = pc.index_in(rows.column("file_path"), value_set=pa.array(unique_paths, pa.string()))
    data_seq = pc.take(pa.array(live_seqs, pa.int64()), indices)
    applies = pc.fill_null(pc.less_equal(data_seq, rows.column("seq")), False)
    kept = rows.filter(applies).select(["file_path", "pos"])
    unique = kept.group_by(["file_path", "pos"]).aggregate([])
    unique = unique.sort_by([("file_path", "ascending"), ("pos", "ascending")])
    return unique, RewrittenDeleteGroup.of(
        group,
        rows_read=rows.num_rows,
        dangling_rows=rows.num_rows - kept.num_rows,
        duplicate_rows=kept.num_rows - unique.num_rows,
        # The data files the new file applies to: those with a kept row.
        target_paths=frozenset(pc.unique(unique.column("file_path")).to_pylist()),
        referenced_paths=frozenset(unique_paths),
    )


def _write_delete_files(
    table: Table,
    group: RewrittenDeleteGroup,
    rows: pa.Table,
    run_id: str,
    on_create: Callable[[str], None],
    target_file_size: int,
) -> list[DataFile]:
    """Write sorted ``rows`` into Parquet position delete files rolling at the target size."""
    return write_position_deletes(
        table,
        group.spec_id,
        group.partition,
        rows,
        f"compactor-{run_id}-d{group.group_id:04d}",
        on_create,
        target_file_size,
        # On-disk bytes per row: from the inputs until the first row group tells.
        bytes_per_row=group.input_bytes / max(group.rows_read, 1),
    )


def write_position_deletes(
    table: Table,
    spec_id: int,
    partition: Record,
    rows: pa.Table,
    prefix: str,
    on_create: Callable[[str], None],
    target_file_size: int,
    bytes_per_row: float,
) -> list[DataFile]:
    """Write ``rows`` (``file_path``, ``pos``; sorted and unique, as the spec asks) into Parquet
    position delete files of ``partition`` rolling at ``target_file_size``, named from
    ``prefix``; ``on_create(path)`` is called before each file is created. ``bytes_per_row``
    sizes the first row group, until it tells the real size."""
    metadata = table.metadata
    file_schema, arrow_schema = position_delete_schema()
    rows = rows.select(["file_path", "pos"]).cast(arrow_schema)
    kwargs = parquet_writer_kwargs(metadata.properties)
    locations = table.location_provider()
    outputs: list[DataFile] = []
    offset, counter = 0, 0
    while offset < rows.num_rows:
        first_row = offset
        name = output_file_name(prefix, counter, "-deletes")
        counter += 1
        path = output_location(metadata, locations, spec_id, partition, name)
        on_create(path)
        with table.io.new_output(path).create(overwrite=False) as stream:
            parquet = pq.ParquetWriter(stream, schema=arrow_schema, **kwargs)
            try:
                while offset < rows.num_rows:
                    written = stream.tell()
                    room = max(target_file_size - written, 0) / max(bytes_per_row, 1e-3)
                    chunk = min(MAX_ROW_GROUP_ROWS, max(MIN_ROW_GROUP_ROWS, int(room)))
                    part = rows.slice(offset, chunk)
                    parquet.write_table(part, row_group_size=max(part.num_rows, 1))
                    offset += part.num_rows
                    after = stream.tell()
                    if after > written:
                        bytes_per_row = after / (offset - first_row)
                    if after >= target_file_size * FILL_RATIO:
                        break
            finally:
                parquet.close()
            size = stream.tell()
        stats = file_statistics(parquet.writer.metadata, file_schema, FULL_METRICS)
        delete_file = DataFile.from_args(
            content=DataFileContent.POSITION_DELETES,
            file_path=path,
            file_format=FileFormat.PARQUET,
            partition=partition,
            file_size_in_bytes=size,
            sort_order_id=None,
            equality_ids=None,
            key_metadata=None,
            **stats,
        )
        delete_file.spec_id = spec_id
        outputs.append(delete_file)
    return outputs
