"""Rewrite tasks: plain data that rewrites one file group anywhere, and the plain data it returns.

A :class:`RewriteTask` holds everything needed to rewrite one group of a plan — where the
table's metadata is, how to reach its storage, the inputs with the position deletes that apply
to each — and goes to JSON and back exactly. :func:`run_task` runs it in any Python process that
can reach the table's storage (a thread of the driver, a fresh process, a Ray worker): it loads
the table metadata from ``metadata_location``, records its intent (:mod:`compactor.intent`)
before creating each output file, rewrites, and returns a :class:`TaskResult`. It never calls
back into the driver and commits nothing; the driver commits results, and cleans up after
tasks whose results it does not commit.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pyiceberg.io import FileIO, load_file_io
from pyiceberg.manifest import DataFile
from pyiceberg.serializers import FromInputFile
from pyiceberg.table.locations import load_location_provider
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.typedef import Record
from pyiceberg.types import IcebergType

from compactor.codec import (
    PartitionTypes,
    decode_data_file,
    decode_partition,
    encode_data_file,
    encode_partition,
    parse_type,
    partition_types,
)
from compactor.errors import CompactorError, first_line
from compactor.intent import IntentLog
from compactor.parquet_output import OutputSpec
from compactor.planner import Plan, is_unpartitioned
from compactor.rewriter import rewrite_files

JSON_VERSION = 1
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


@dataclass(frozen=True)
class TaskInput:
    """One input data file, its data sequence number and the position deletes that apply to it."""

    data_file: DataFile
    data_sequence_number: int
    delete_files: tuple[DataFile, ...] = ()

    @property
    def path(self) -> str:
        return self.data_file.file_path

    @property
    def size(self) -> int:
        return self.data_file.file_size_in_bytes


def _types_to_json(types: PartitionTypes) -> dict[str, list[str]]:
    return {str(spec_id): [str(t) for t in fields] for spec_id, fields in sorted(types.items())}


def _types_from_json(data: dict[str, list[str]]) -> dict[int, tuple[IcebergType, ...]]:
    return {int(spec_id): tuple(map(parse_type, names)) for spec_id, names in data.items()}


def _check_version(data: dict[str, Any], kind: str) -> None:
    if data.get("version") != JSON_VERSION:
        raise CompactorError(
            f"{kind} JSON version {data.get('version')!r} is not supported (expected "
            f"{JSON_VERSION}): driver and workers must run the same compactor version"
        )


@dataclass(frozen=True)
class RewriteTask:
    """Everything needed to rewrite one group of a plan, anywhere; ``task_id`` is the group id.

    ``io_properties`` are the table FileIO's properties (they may hold storage credentials:
    treat a task's JSON as a secret). ``partition_types`` gives the Iceberg type of each
    partition field of every spec the task's files belong to.
    """

    run_id: str
    task_id: int
    table: str
    metadata_location: str
    io_properties: Mapping[str, str]
    spec_id: int
    partition: Record
    partition_types: Mapping[int, tuple[IcebergType, ...]]
    target_file_size: int
    row_group_size: int
    read_ahead: int
    file_prefix: str
    inputs: tuple[TaskInput, ...]

    @property
    def input_bytes(self) -> int:
        return sum(f.size for f in self.inputs)

    @property
    def delete_files(self) -> list[DataFile]:
        """The position delete files of all inputs, once each, by path."""
        unique = {d.file_path: d for f in self.inputs for d in f.delete_files}
        return [unique[path] for path in sorted(unique)]

    def to_json(self) -> str:
        """This task as one JSON document; :meth:`from_json` reads it back exactly."""
        types = self.partition_types
        return json.dumps(
            {
                "version": JSON_VERSION,
                "run_id": self.run_id,
                "task_id": self.task_id,
                "table": self.table,
                "metadata_location": self.metadata_location,
                "io_properties": dict(self.io_properties),
                "spec_id": self.spec_id,
                "partition": encode_partition(self.partition, types[self.spec_id]),
                "partition_types": _types_to_json(types),
                "target_file_size": self.target_file_size,
                "row_group_size": self.row_group_size,
                "read_ahead": self.read_ahead,
                "file_prefix": self.file_prefix,
                "delete_files": [encode_data_file(d, types) for d in self.delete_files],
                "inputs": [
                    {
                        "data_file": encode_data_file(f.data_file, types),
                        "data_sequence_number": f.data_sequence_number,
                        "delete_files": sorted(d.file_path for d in f.delete_files),
                    }
                    for f in self.inputs
                ],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> RewriteTask:
        """The task :meth:`to_json` wrote."""
        data = json.loads(text)
        _check_version(data, "task")
        deletes = {d.file_path: d for d in map(decode_data_file, data["delete_files"])}
        inputs = tuple(
            TaskInput(
                decode_data_file(f["data_file"]),
                f["data_sequence_number"],
                tuple(deletes[path] for path in f["delete_files"]),
            )
            for f in data["inputs"]
        )
        types = _types_from_json(data["partition_types"])
        return cls(
            run_id=data["run_id"],
            task_id=data["task_id"],
            table=data["table"],
            metadata_location=data["metadata_location"],
            io_properties=data["io_properties"],
            spec_id=data["spec_id"],
            partition=decode_partition(data["partition"]),
            partition_types=types,
            target_file_size=data["target_file_size"],
            row_group_size=data["row_group_size"],
            read_ahead=data["read_ahead"],
            file_prefix=data["file_prefix"],
            inputs=inputs,
        )


@dataclass
class TaskResult:
    """What one task produced: output data files with full metrics, and the rows it moved."""

    task_id: int
    data_files: list[DataFile] = field(default_factory=list)
    records_read: int = 0
    rows_deleted: int = 0
    input_bytes: int = 0
    # The outputs' partition field types (their spec's), for the JSON form.
    partition_types: Mapping[int, tuple[IcebergType, ...]] = field(default_factory=dict)

    def to_json(self) -> str:
        """This result as one JSON document; :meth:`from_json` reads it back exactly."""
        return json.dumps(
            {
                "version": JSON_VERSION,
                "task_id": self.task_id,
                "data_files": [encode_data_file(d, self.partition_types) for d in self.data_files],
                "records_read": self.records_read,
                "rows_deleted": self.rows_deleted,
                "input_bytes": self.input_bytes,
                "partition_types": _types_to_json(self.partition_types),
            }
        )

    @classmethod
    def from_json(cls, text: str) -> TaskResult:
        """The result :meth:`to_json` wrote."""
        data = json.loads(text)
        _check_version(data, "task result")
        return cls(
            task_id=data["task_id"],
            data_files=[decode_data_file(d) for d in data["data_files"]],
            records_read=data["records_read"],
            rows_deleted=data["rows_deleted"],
            input_bytes=data["input_bytes"],
            partition_types=_types_from_json(data["partition_types"]),
        )


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
    spec = metadata.specs()[task.spec_id]
    unpartitioned = is_unpartitioned(spec)
    path = "" if unpartitioned else spec.partition_to_path(task.partition, metadata.schema())
    return f"group {task.task_id} ({path or 'unpartitioned'})"


def run_task(task: RewriteTask, cancel: CancelToken | None = None) -> TaskResult:
    """Rewrite ``task``'s inputs into new data files and describe them; commits nothing.

    ``cancel`` is asked before the task starts and after each input file. On cancellation
    (:class:`TaskCancelled`) or any failure the task deletes the files it wrote, then raises.
    Its intent file stays for the driver to remove.
    """

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
        file_prefix=task.file_prefix,
    )
    intent = IntentLog(io, metadata.location, task.run_id, task.task_id)
    rewritten = rewrite_files(
        task.inputs,
        out,
        read_ahead=task.read_ahead,
        label=_label(task, metadata),
        between_files=check,
        on_file_created=intent.add,
    )
    return TaskResult(
        task_id=task.task_id,
        data_files=rewritten.data_files,
        records_read=rewritten.records_read,
        rows_deleted=rewritten.rows_deleted,
        input_bytes=task.input_bytes,
        partition_types={task.spec_id: tuple(task.partition_types[task.spec_id])},
    )


def plan_tasks(plan: Plan, run_id: str, io_properties: Mapping[str, str]) -> list[RewriteTask]:
    """One task per group of ``plan``, for run ``run_id``, in the plan's order."""
    metadata = plan.metadata
    schema, specs = metadata.schema(), metadata.specs()
    tasks = []
    for group in plan.groups:
        inputs = tuple(
            TaskInput(f.data_file, f.data_sequence_number, f.delete_files) for f in group.files
        )
        spec_ids = {group.spec_id} | {d.spec_id for f in inputs for d in f.delete_files}
        tasks.append(
            RewriteTask(
                run_id=run_id,
                task_id=group.group_id,
                table=plan.table,
                metadata_location=plan.metadata_location,
                io_properties=dict(io_properties),
                spec_id=group.spec_id,
                partition=group.partition,
                partition_types={i: partition_types(specs[i], schema) for i in sorted(spec_ids)},
                target_file_size=group.target_file_size,
                row_group_size=plan.options.row_group_size,
                read_ahead=plan.options.read_ahead,
                file_prefix=f"compactor-{run_id}-g{group.group_id:04d}",
                inputs=inputs,
            )
        )
    return tasks
