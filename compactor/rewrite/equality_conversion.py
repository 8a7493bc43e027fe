"""Convert one group's equality deletes into position deletes: read key columns, match, write.

:func:`convert_equality_group` reads, of each data file an equality delete applies to, only the
columns the deletes name (:func:`~compactor.iceberg.pyiceberg_compat.read_columns`: by field
id or name mapping, in the current schema's types), and finds the rows the deletes delete with
the rewrite's own rule (:class:`~compactor.rewrite.equality_deletes.EqualityDeleteApplier`:
null equal to null, floating-point values by their canonical bits, a key deleted only from data
files older than its delete). Their positions go into Parquet position delete files of the
group's partition, rolling at the target size, each path listed in the group's intent file
before its file is created; no data file is written.

On format 3 a data file gets one deletion vector instead, holding its matched rows and its
earlier deletes (its deletion vector, else the position delete files that apply to it), all
of a group in one Puffin file; the deletion vectors and file-scoped position delete files
merged are replaced by it.

Each position delete keeps the largest data sequence number of the group's equality deletes:
a position delete applies to the data files named in it whose sequence number is at most its
own, which are the ones the equality deletes applied to. Only where a path is live more than
once in the partition (a data file added again) does a row take a lower one, so that it does
not reach the newer entry if that entry keeps the row.

Memory: the applier's keys (as in a rewrite), one batch of key columns per reading thread, and
the group's matched positions (8 bytes and the path per row) until they are written.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table

from compactor.errors import CompactorError, DataFileError, file_error
from compactor.iceberg.delete_files import write_deletion_vectors
from compactor.iceberg.pyiceberg_compat import (
    POSITION_DELETE_FILE_PATH_ID,
    delete_file_key,
    is_deletion_vector,
    read_columns,
    read_position_deletes,
    referenced_data_file,
)
from compactor.iceberg.value_keys import same_partition
from compactor.planning.delete_groups import LiveData
from compactor.planning.equality_groups import EqualityGroup
from compactor.planning.planner import InputFile
from compactor.rewrite.equality_deletes import EqualityDeleteApplier
from compactor.rewrite.intent import IntentLog
from compactor.rewrite.parquet_output import output_location
from compactor.rewrite.position_deletes import write_position_deletes

READ_THREADS = 4
POSITION = "__compactor_position"
# Why a group is left alone.
LIVE_TWICE = "a_data_file_live_twice_in_a_format_3_table"
# Stored bytes per position delete row, until the first row group tells (a path shared by
# many rows, dictionary-encoded; positions close together).
BYTES_PER_ROW = 2.0


@dataclass(frozen=True)
class ConvertedGroup(EqualityGroup):
    """A group as its conversion left it: what it read and matched, and what it wrote."""

    data_files_read: int = 0
    key_bytes_read: int = 0
    rows_read: int = 0
    rows_matched: int = 0
    rows_written: int = 0
    # Each position delete file or deletion vector written, with the data sequence number it
    # is committed with (None: the snapshot's).
    outputs: tuple[tuple[DataFile, int | None], ...] = ()
    # Data files (paths) a position delete row names.
    target_paths: frozenset[str] = frozenset()
    # Format 3: deletion vectors and file-scoped position delete files merged into the new
    # deletion vectors, removed with the equality deletes (by ``delete_file_key``).
    replaced: tuple[str, ...] = ()
    # Why the group is left alone (its equality deletes stay), or None.
    skipped: str | None = None

    @classmethod
    def of(cls, group: EqualityGroup, **found: Any) -> ConvertedGroup:
        """``group`` with what its conversion ``found`` (this class's own fields)."""
        return cls(**{f.name: getattr(group, f.name) for f in fields(EqualityGroup)}, **found)

    @property
    def output_files(self) -> list[DataFile]:
        return [d for d, _ in self.outputs]

    @property
    def deletion_vectors(self) -> int:
        return sum(1 for d, _ in self.outputs if is_deletion_vector(d))

    def summary(self) -> dict[str, Any]:
        unread = bool(self.inputs) and not self.data_files_read  # planned only (dry run)
        return {
            "group_id": self.group_id,
            "spec_id": self.spec_id,
            "partition": self.partition_path or "(unpartitioned)",
            "equality_delete_files": len(self.equality_deletes),
            "global_equality_delete_files": len(self.global_deletes),
            "data_files": len(self.inputs),
            "data_sequence_number": self.data_sequence_number,
            "key_bytes": self.key_bytes_read or self.key_bytes,
            "rows_matched": None if unread else self.rows_matched,
            "added_files": None if unread else len(self.outputs),
        }


def convert_equality_group(
    table: Table,
    group: EqualityGroup,
    live: LiveData,
    target_file_size: int,
    run_id: str | None,
) -> ConvertedGroup:
    """Find the rows ``group``'s equality deletes delete and write their positions for run
    ``run_id`` (None: only find them, write nothing)."""
    if not group.inputs:
        return ConvertedGroup.of(group)
    deletion_vectors = table.metadata.format_version >= 3
    if deletion_vectors and _live_twice(group, live):
        return ConvertedGroup.of(group, skipped=LIVE_TWICE)
    applier = EqualityDeleteApplier(
        table.io, table.metadata.schema(), group.inputs, group.sequence_numbers
    )
    with ThreadPoolExecutor(min(READ_THREADS, len(group.inputs))) as pool:
        matched = list(pool.map(lambda f: _matched_positions(table, applier, f), group.inputs))
    if deletion_vectors:
        return _write_deletion_vectors(table, group, matched, run_id)
    rows = _position_rows(group, [m for m, _ in matched], live)
    converted = _read(
        group,
        matched,
        rows_written=rows.num_rows,
        target_paths=frozenset(pc.unique(rows.column("file_path")).to_pylist()),
    )
    if run_id is None or rows.num_rows == 0:
        return converted
    intent = IntentLog(table.io, table.metadata.location, run_id, group.group_id)
    outputs: list[tuple[DataFile, int | None]] = []
    prefix = f"compactor-{run_id}-e{group.group_id:04d}"
    sequences = rows.column("seq")
    for sequence in sorted(pc.unique(sequences).to_pylist()):
        part = rows.filter(pc.equal(sequences, sequence))
        written = write_position_deletes(
            table,
            group.spec_id,
            group.partition,
            part,
            prefix,
            intent.add,
            target_file_size,
            BYTES_PER_ROW,
        )
        outputs += [(d, sequence) for d in written]
    return replace(converted, outputs=tuple(outputs))


def _live_twice(group: EqualityGroup, live: LiveData) -> bool:
    """Whether a data file of the group is live more than once in its partition: one deletion
    vector, which applies to all its entries, cannot tell them apart."""
    for f in group.inputs:
        entries = [
            seq
            for seq, spec_id, partition in live.get(f.path, [])
            if spec_id == group.spec_id and same_partition(partition, group.partition)
        ]
        if len(entries) > 1:
            return True
    return False


def _file_scoped(delete_file: DataFile, path: str) -> bool:
    """Whether a position delete file applies to the data file ``path`` only (a deletion
    vector, or ``file_path`` bounds both ``path``, as Java's ``ContentFileUtil.isFileScoped``)."""
    if is_deletion_vector(delete_file):
        return referenced_data_file(delete_file) == path
    lower = (delete_file.lower_bounds or {}).get(POSITION_DELETE_FILE_PATH_ID)
    upper = (delete_file.upper_bounds or {}).get(POSITION_DELETE_FILE_PATH_ID)
    return lower == upper == path.encode()


def _read(
    group: EqualityGroup, matched: Sequence[tuple[pa.Array, int]], **written: Any
) -> ConvertedGroup:
    """``group`` with what reading its data files' keys found (``matched``: each file's deleted
    positions and rows read) and what is to be ``written``."""
    return ConvertedGroup.of(
        group,
        data_files_read=len(group.inputs),
        key_bytes_read=group.key_bytes,
        rows_read=sum(n for _, n in matched),
        rows_matched=sum(len(m) for m, _ in matched),
        **written,
    )


def _write_deletion_vectors(
    table: Table,
    group: EqualityGroup,
    matched: Sequence[tuple[pa.Array, int]],
    run_id: str | None,
) -> ConvertedGroup:
    """Format 3: one deletion vector per data file with a matched row, holding its earlier
    deletes too (its deletion vector, else the position delete files that apply to it), all in
    one Puffin file; the deletion vectors and file-scoped position delete files merged are
    replaced (a data file has one deletion vector at most, and readers then ignore position
    delete files for it)."""
    read: dict[str, dict[str, pa.ChunkedArray]] = {}
    merged: dict[DataFile, list[int]] = {}
    replaced: list[str] = []
    for f, (positions, _) in zip(group.inputs, matched, strict=True):
        if not len(positions):
            continue
        arrays = [positions.to_numpy(zero_copy_only=False)]
        for delete_file in group.previous.get(f.path, ()):
            key = delete_file_key(delete_file)
            if key not in read:
                try:
                    read[key] = read_position_deletes(table.io, delete_file)
                except Exception as exc:
                    raise file_error("delete", delete_file.file_path, exc) from exc
            earlier = read[key].get(f.path)
            if earlier is not None:
                arrays += [c.to_numpy(zero_copy_only=False) for c in earlier.chunks]
            if _file_scoped(delete_file, f.path):
                replaced.append(key)
        merged[f.data_file] = np.unique(np.concatenate(arrays)).tolist()
    converted = _read(
        group,
        matched,
        rows_written=sum(len(p) for p in merged.values()),
        target_paths=frozenset(d.file_path for d in merged),
        replaced=tuple(sorted(set(replaced))),
    )
    if run_id is None or not merged:
        return converted
    intent = IntentLog(table.io, table.metadata.location, run_id, group.group_id)
    metadata = table.metadata
    name = f"compactor-{run_id}-e{group.group_id:04d}-{uuid.uuid4().hex[:8]}-dvs.puffin"
    path = output_location(
        metadata, table.location_provider(), group.spec_id, group.partition, name
    )
    written = write_deletion_vectors(table, merged, path=path, on_create=intent.add)
    return replace(converted, outputs=tuple((d, None) for d in written))


def _matched_positions(
    table: Table, applier: EqualityDeleteApplier, f: InputFile
) -> tuple[pa.Array, int]:
    """The positions of ``f``'s rows that its equality deletes delete (sorted), and its rows."""
    drop = applier.filter_for(f)
    field_ids = sorted({i for d in f.delete_files for i in (d.equality_ids or ())})
    found: list[pa.Array] = []
    offset = 0
    try:
        if drop is not None:
            for batch in read_columns(table.io, table.metadata, f.data_file, field_ids):
                rows = batch.num_rows
                positions = pa.array(np.arange(offset, offset + rows, dtype=np.int64))
                kept = drop(batch.append_column(POSITION, positions)).column(POSITION)
                if len(kept) < rows:
                    gone = pc.invert(pc.is_in(positions, value_set=kept))
                    found.append(positions.filter(gone))
                offset += rows
    except CompactorError:
        raise
    except Exception as exc:
        raise file_error("data", f.path, exc) from exc
    if offset != f.data_file.record_count:
        raise DataFileError(
            f"data file {f.path}: {offset} rows read, its manifest entry says "
            f"{f.data_file.record_count}"
        )
    return pa.concat_arrays(found) if found else pa.array([], pa.int64()), offset


def _position_rows(group: EqualityGroup, matched: Sequence[pa.Array], live: LiveData) -> pa.Table:
    """``file_path``, ``pos`` and the data sequence number ``seq`` each row is committed with,
    unique and sorted by path and position."""
    by_path: dict[str, list[tuple[int, pa.Array]]] = defaultdict(list)
    for f, positions in zip(group.inputs, matched, strict=True):
        by_path[f.path].append((f.data_sequence_number, positions))
    paths: list[str] = []
    positions_of: list[np.ndarray] = []
    sequences_of: list[np.ndarray] = []
    newest = group.data_sequence_number
    for path in sorted(by_path):
        positions, sequences = _sequence_numbers(group, newest, path, by_path[path], live)
        if len(positions):
            paths.append(path)
            positions_of.append(positions)
            sequences_of.append(sequences)
    counts = [len(p) for p in positions_of]
    indices = np.repeat(np.arange(len(paths), dtype=np.int32), counts)
    file_path = pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), pa.array(paths))
    empty = np.array([], np.int64)
    return pa.table(
        {
            "file_path": file_path.cast(pa.string()),
            "pos": pa.array(np.concatenate(positions_of) if counts else empty),
            "seq": pa.array(np.concatenate(sequences_of) if counts else empty),
        }
    )


def _sequence_numbers(
    group: EqualityGroup,
    newest: int,
    path: str,
    found: list[tuple[int, pa.Array]],
    live: LiveData,
) -> tuple[np.ndarray, np.ndarray]:
    """The positions matched in ``path`` (sorted, unique) and each one's data sequence number.

    ``found``: (data sequence number, matched positions) of each input entry of ``path``. A row
    takes the group's sequence number ``newest``, lowered below that of any live entry of the
    path in the partition that keeps the row (a path added again), so that it reaches only the
    entries whose deletes delete it.
    """
    entries = sorted(
        seq
        for seq, spec_id, partition in live.get(path, [])
        if spec_id == group.spec_id and same_partition(partition, group.partition)
    )
    arrays = [a.to_numpy(zero_copy_only=False) for _, a in found]
    positions = np.unique(np.concatenate(arrays)) if arrays else np.array([], np.int64)
    sequences = np.full(len(positions), newest, np.int64)
    if len(entries) <= 1 or not len(positions):
        return positions, sequences
    matched_by_entry = {
        seq: np.asarray(a) for seq, a in zip((s for s, _ in found), arrays, strict=True)
    }
    for seq in entries:  # ascending: the first entry keeping a row bounds it
        hit = np.isin(positions, matched_by_entry.get(seq, np.array([], np.int64)))
        sequences = np.where(hit, sequences, np.minimum(sequences, seq - 1))
    for seq, matched in matched_by_entry.items():
        if np.any(sequences[np.isin(positions, matched)] < seq):
            raise DataFileError(
                f"data file {path}: its entries of sequence number {seq} and lower disagree "
                "on which rows the equality deletes delete; nothing was written"
            )
    return positions, sequences
