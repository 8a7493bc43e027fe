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

Memory, held to the run's memory limit past the process's allowance (:class:`Budget`): the
applier's keys (as in a rewrite, of the order of the deletes' key columns decoded), the key
columns of as many data files at once as reading threads the limit leaves room for, and the
matched positions, read in path order and written into a new position delete file whenever
the rows held reach what the limit leaves (or the target size): a group's matched positions
are not all held at once. On format 3 a group's matched positions are all held (a data file's
deletion vector is written once), 8 bytes per row.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, fields, replace
from itertools import groupby
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
from compactor.options.defaults import DEFAULT_MEMORY_LIMIT, PROCESS_ALLOWANCE
from compactor.planning.delete_groups import LiveData
from compactor.planning.equality_groups import EqualityGroup
from compactor.planning.planner import InputFile
from compactor.rewrite.equality_deletes import EqualityDeleteApplier
from compactor.rewrite.intent import IntentLog
from compactor.rewrite.parquet_output import output_location
from compactor.rewrite.position_deletes import write_position_deletes
from compactor.sizes import MiB

READ_THREADS = 4
# Memory, past the process's allowance: a deleted key in the applier's hash tables (22 MB for
# 288,634 keys of two integer columns, their key columns included); one reading thread (a file's
# key columns being decoded, Arrow's read-ahead batches); a matched row held until written (its
# position and sequence number, their copies while written, and twice its path: written out as a
# string per row, and cast to the file's schema).
KEY_BYTES = 80
READER_BYTES = 24 * MiB
HELD_ROW_BYTES = 48
MIN_HELD_ROWS = 64 * 1024
POSITION = "__compactor_position"
# Why a group is left alone.
LIVE_TWICE = "a_data_file_live_twice_in_a_format_3_table"
# Stored bytes per position delete row, until the first row group tells (a path shared by
# many rows, dictionary-encoded; positions close together).
BYTES_PER_ROW = 2.0


# A path's matched positions (sorted, unique) and the data sequence number of each.
HeldRows = tuple[str, np.ndarray, np.ndarray]


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


@dataclass(frozen=True)
class Budget:
    """What a group's conversion holds at once within ``memory_limit``: its deleted keys, the
    key columns of ``readers`` data files, and ``held_rows`` matched rows before they are
    written."""

    readers: int
    held_rows: int

    @classmethod
    def of(cls, group: EqualityGroup, memory_limit: int) -> Budget:
        """Half of what the deleted keys leave past the process's allowance for reading (one
        thread at least), the rest for the matched rows (``MIN_HELD_ROWS`` at least)."""
        deletes = {d.file_path: d.record_count for f in group.inputs for d in f.delete_files}
        keys = sum(deletes.values()) * KEY_BYTES
        spare = max(memory_limit - PROCESS_ALLOWANCE - keys, 0)
        readers = max(1, min(READ_THREADS, len(group.inputs), spare // 2 // READER_BYTES))
        longest = max(len(f.path.encode()) for f in group.inputs)
        held = (spare - readers * READER_BYTES) // (HELD_ROW_BYTES + 2 * longest)
        return cls(readers, max(MIN_HELD_ROWS, held))


def convert_equality_group(
    table: Table,
    group: EqualityGroup,
    live: LiveData,
    target_file_size: int,
    run_id: str | None,
    memory_limit: int = DEFAULT_MEMORY_LIMIT,
) -> ConvertedGroup:
    """Find the rows ``group``'s equality deletes delete and write their positions for run
    ``run_id`` (None: only find them, write nothing), holding what ``memory_limit`` allows."""
    if not group.inputs:
        return ConvertedGroup.of(group)
    deletion_vectors = table.metadata.format_version >= 3
    if deletion_vectors and _live_twice(group, live):
        return ConvertedGroup.of(group, skipped=LIVE_TWICE)
    applier = EqualityDeleteApplier(
        table.io, table.metadata.schema(), group.inputs, group.sequence_numbers
    )
    budget = Budget.of(group, memory_limit)
    if deletion_vectors:
        matched = [m for _, m in _matched(table, applier, group.inputs, budget.readers)]
        return _write_deletion_vectors(table, group, matched, run_id)
    return _convert_to_position_deletes(
        table, group, live, applier, budget, target_file_size, run_id
    )


def _matched(
    table: Table, applier: EqualityDeleteApplier, inputs: Sequence[InputFile], readers: int
) -> Iterator[tuple[InputFile, tuple[pa.Array, int]]]:
    """Each input with its matched positions and rows read, in order, read by ``readers``
    threads with at most two files each in flight."""
    with ThreadPoolExecutor(readers) as pool:
        pending = iter(inputs)
        window: deque[tuple[InputFile, Future[tuple[pa.Array, int]]]] = deque()

        def submit() -> None:
            f = next(pending, None)
            if f is not None:
                window.append((f, pool.submit(_matched_positions, table, applier, f)))

        for _ in range(2 * readers):
            submit()
        while window:
            f, future = window.popleft()
            found = future.result()
            submit()
            yield f, found


def _convert_to_position_deletes(
    table: Table,
    group: EqualityGroup,
    live: LiveData,
    applier: EqualityDeleteApplier,
    budget: Budget,
    target_file_size: int,
    run_id: str | None,
) -> ConvertedGroup:
    """Format 2: the matched positions, read in path order, written into position delete
    files of the partition whenever ``budget.held_rows`` are held (and at the end)."""
    inputs = sorted(group.inputs, key=lambda f: (f.path, f.data_sequence_number))
    intent = None
    if run_id is not None:
        intent = IntentLog(table.io, table.metadata.location, run_id, group.group_id)
    prefix = f"compactor-{run_id}-e{group.group_id:04d}"
    read = [0, 0]  # rows read, rows matched

    def counted() -> Iterator[tuple[InputFile, pa.Array]]:
        for f, (positions, rows) in _matched(table, applier, inputs, budget.readers):
            read[0] += rows
            read[1] += len(positions)
            yield f, positions

    held: list[HeldRows] = []
    outputs: list[tuple[DataFile, int | None]] = []
    targets: set[str] = set()
    rows_written = held_rows = 0
    for rows in _by_path(group, counted(), live):
        held.append(rows)
        targets.add(rows[0])
        rows_written += len(rows[1])
        held_rows += len(rows[1])
        if held_rows >= budget.held_rows:
            if intent is not None:
                outputs += _write(table, group, held, prefix, intent, target_file_size)
            held, held_rows = [], 0
    if held and intent is not None:
        outputs += _write(table, group, held, prefix, intent, target_file_size)
    return _read(
        group,
        read[0],
        read[1],
        rows_written=rows_written,
        target_paths=frozenset(targets),
        outputs=tuple(outputs),
    )


def _by_path(
    group: EqualityGroup, matched: Iterable[tuple[InputFile, pa.Array]], live: LiveData
) -> Iterator[HeldRows]:
    """The matched positions of each path (``matched``: each input, in path order, with its
    matched positions), sorted and unique, with their data sequence numbers; none for a path
    without one."""
    for path, entries in groupby(matched, lambda m: m[0].path):
        found = [(f.data_sequence_number, positions) for f, positions in entries]
        positions, sequences = _sequence_numbers(
            group, group.data_sequence_number, path, found, live
        )
        if len(positions):
            yield path, positions, sequences


def _write(
    table: Table,
    group: EqualityGroup,
    held: Sequence[HeldRows],
    prefix: str,
    intent: IntentLog,
    target_file_size: int,
) -> list[tuple[DataFile, int]]:
    """Write ``held`` (path, positions, sequence numbers; in path order) into position delete
    files rolling at the target size, one set per data sequence number."""
    rows = _position_rows(held)
    sequences = rows.column("seq")
    outputs: list[tuple[DataFile, int]] = []
    distinct = sorted(pc.unique(sequences).to_pylist())
    for sequence in distinct:
        part = rows if len(distinct) == 1 else rows.filter(pc.equal(sequences, sequence))
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
    return outputs


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
    group: EqualityGroup, rows_read: int, rows_matched: int, **written: Any
) -> ConvertedGroup:
    """``group`` with what reading its data files' keys found (rows read, and matched) and what
    is (to be) ``written``."""
    return ConvertedGroup.of(
        group,
        data_files_read=len(group.inputs),
        key_bytes_read=group.key_bytes,
        rows_read=rows_read,
        rows_matched=rows_matched,
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
        sum(n for _, n in matched),
        sum(len(m) for m, _ in matched),
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


def _position_rows(held: Sequence[HeldRows]) -> pa.Table:
    """``file_path``, ``pos`` and the data sequence number ``seq`` of each row ``held``."""
    counts = [len(p) for _, p, _ in held]
    indices = np.repeat(np.arange(len(held), dtype=np.int32), counts)
    paths = pa.array([path for path, _, _ in held], pa.string())
    file_path = pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), paths)
    return pa.table(
        {
            "file_path": file_path.cast(pa.string()),
            "pos": pa.array(np.concatenate([p for _, p, _ in held])),
            "seq": pa.array(np.concatenate([s for _, _, s in held])),
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
