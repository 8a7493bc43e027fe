"""Run a rewrite task anywhere: ``run_task(task) -> TaskResult``, stopped by a cancel token.

:func:`run_task` runs in any Python process that can reach the table's storage (a thread of the
driver, a fresh process, a Ray worker): it loads the table metadata from the task's
``metadata_location``, records its intent (:mod:`compactor.rewrite.intent`) before creating each
output file, rewrites, and returns a :class:`~compactor.planning.tasks.TaskResult`. It never
calls back into the driver and commits nothing; the driver commits results, and cleans up after
tasks whose results it does not commit.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Mapping
from typing import Protocol

from pyiceberg.io import FileIO, load_file_io
from pyiceberg.serializers import FromInputFile
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata

from compactor.errors import CompactorError, first_line
from compactor.iceberg import pyiceberg_compat
from compactor.planning.planner import partition_path
from compactor.planning.tasks import RewriteTask, TaskResult
from compactor.rewrite.freed_memory import handed_back_after
from compactor.rewrite.intent import IntentLog
from compactor.rewrite.parquet_output import OutputSpec
from compactor.rewrite.phase_times import PhaseTimes, recording
from compactor.rewrite.rewriter import rewrite_files

METADATA_CACHE_SIZE = 8


class CancelToken(Protocol):
    """Asked between input files whether the task should stop."""

    def is_cancelled(self) -> bool: ...


class EventToken:
    """A cancel token for threads of one process: cancelled once any of its events is set."""

    def __init__(self, *events: threading.Event) -> None:
        self.events = events

    def is_cancelled(self) -> bool:
        return any(event.is_set() for event in self.events)


class TaskCancelled(CompactorError):
    """The task was cancelled before it finished; it removed the files it had written."""


@functools.lru_cache(maxsize=METADATA_CACHE_SIZE)
def _table_state(metadata_location: str, io_properties: str) -> tuple[TableMetadata, FileIO]:
    io = load_file_io(json.loads(io_properties), metadata_location)
    return FromInputFile.table_metadata(io.new_input(metadata_location)), io


def load_table_state(
    metadata_location: str, io_properties: Mapping[str, str]
) -> tuple[TableMetadata, FileIO]:
    """The table metadata at ``metadata_location`` and a FileIO from ``io_properties``.

    Cached per process: metadata files never change, so every task of a run reads it once.
    """
    return _table_state(metadata_location, json.dumps(dict(io_properties), sort_keys=True))


def _label(task: RewriteTask, metadata: TableMetadata) -> str:
    if task.repartition:
        return f"group {task.task_id} (other specs into spec {task.spec_id})"
    path = partition_path(metadata.specs()[task.spec_id], metadata.schema(), task.partition)
    return f"group {task.task_id} ({path or 'unpartitioned'})"


def run_task(
    task: RewriteTask,
    cancel: CancelToken | None = None,
    on_read: Callable[[int, int], None] | None = None,
) -> TaskResult:
    """Rewrite ``task``'s inputs into new data files and describe them; commits nothing.

    ``cancel`` is asked before the task starts, after each input file and, in a sorted group,
    between the merged pieces it writes; ``on_read`` is told (files, bytes) as inputs are read.
    On cancellation (:class:`TaskCancelled`) or any failure the task deletes the files it wrote,
    then raises. Its intent file stays for the driver to remove.
    """
    pyiceberg_compat.install()  # the read path verifies page checksums, in any process

    def check() -> None:
        if cancel is not None and cancel.is_cancelled():
            raise TaskCancelled(f"table {task.table}: stopped before group {task.task_id} finished")

    if cancel is not None and cancel.is_cancelled():
        raise TaskCancelled(f"table {task.table}: stopped before group {task.task_id} started")
    try:
        metadata, io = load_table_state(task.metadata_location, task.io_properties)
    except Exception as exc:
        raise CompactorError(
            f"table {task.table}: cannot read its metadata {task.metadata_location}: "
            f"{first_line(exc)}"
        ) from exc
    out = OutputSpec(
        metadata=metadata,
        io=io,
        locations=load_location_provider(metadata.location, metadata.properties),
        spec_id=task.spec_id,
        partition=task.partition,
        target_file_size=task.target_file_size,
        row_group_size=task.row_group_size,
        memory_limit=task.memory_limit,
        file_prefix=task.file_prefix,
        sort_order_id=task.clustering.sort_order_id if task.clustering else None,
    )
    intent = IntentLog(io, metadata.location, task.run_id, task.task_id)
    times = PhaseTimes.if_enabled()
    with recording(times), handed_back_after():
        rewritten = rewrite_files(
            task.inputs,
            out,
            equality_sequence_numbers=task.equality_delete_sequence_numbers,
            read_ahead=task.read_ahead,
            label=_label(task, metadata),
            between_files=check,
            on_file_created=intent.add,
            bulk_read=task.bulk_read,
            clustering=task.clustering,
            repartition=task.repartition,
            on_read=on_read,
        )
    return TaskResult(
        task_id=task.task_id,
        data_files=rewritten.data_files,
        records_read=rewritten.records_read,
        rows_deleted=rewritten.rows_deleted,
        input_bytes=task.input_bytes,
        bulk_read_files=rewritten.bulk_read_files,
        phase_times=times.to_dict() if times else {},
        partition_types={task.spec_id: tuple(task.partition_types[task.spec_id])},
    )
