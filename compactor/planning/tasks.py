"""Rewrite tasks: plain data that rewrites one file group anywhere, and the plain data it returns.

A :class:`RewriteTask` holds everything needed to rewrite one group of a plan — where the
table's metadata is, how to reach its storage, the inputs with the position deletes that apply
to each — and goes to JSON and back exactly; :func:`plan_tasks` makes one per group.
:func:`compactor.rewrite.task_runner.run_task` runs it; a :class:`TaskResult` comes back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.typedef import Record
from pyiceberg.types import IcebergType

from compactor.errors import CompactorError
from compactor.iceberg.codec import (
    PartitionTypes,
    decode_data_file,
    decode_partition,
    encode_data_file,
    encode_partition,
    parse_type,
    partition_types,
)
from compactor.iceberg.pyiceberg_compat import delete_file_key, with_s3_retries
from compactor.options.compact import ExecutionOptions
from compactor.planning.planner import Plan, TaskInput
from compactor.planning.sort_order import Clustering

JSON_VERSION = 5


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
    # The memory limit of the process the task runs in (see compactor.rewrite.freed_memory).
    memory_limit: int
    file_prefix: str
    inputs: tuple[TaskInput, ...]
    # The data sequence number of each equality delete of the inputs, by path.
    equality_delete_sequence_numbers: Mapping[str, int] = field(default_factory=dict)
    # Read the inputs that need none of Iceberg's read rules in bulk (compactor.rewrite.bulk_read).
    bulk_read: bool = True
    # Strategy sort or zorder: the order the rows are written in.
    clustering: Clustering | None = None
    # Inputs of other specs, written into ``spec_id`` split by its partitions.
    repartition: bool = False

    @property
    def input_bytes(self) -> int:
        return sum(f.size for f in self.inputs)

    @property
    def delete_files(self) -> list[DataFile]:
        """The delete files of all inputs, once each, by path."""
        unique = {delete_file_key(d): d for f in self.inputs for d in f.delete_files}
        return [unique[key] for key in sorted(unique)]

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
                "memory_limit": self.memory_limit,
                "file_prefix": self.file_prefix,
                "delete_files": [encode_data_file(d, types) for d in self.delete_files],
                "equality_delete_sequence_numbers": dict(
                    sorted(self.equality_delete_sequence_numbers.items())
                ),
                "bulk_read": self.bulk_read,
                "clustering": self.clustering.to_json() if self.clustering else None,
                "repartition": self.repartition,
                "inputs": [
                    {
                        "data_file": encode_data_file(f.data_file, types),
                        "data_sequence_number": f.data_sequence_number,
                        "file_sequence_number": f.file_sequence_number,
                        "delete_files": sorted(map(delete_file_key, f.delete_files)),
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
        deletes = {delete_file_key(d): d for d in map(decode_data_file, data["delete_files"])}
        inputs = tuple(
            TaskInput(
                decode_data_file(f["data_file"]),
                f["data_sequence_number"],
                tuple(deletes[key] for key in f["delete_files"]),
                f["file_sequence_number"],
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
            memory_limit=data["memory_limit"],
            file_prefix=data["file_prefix"],
            inputs=inputs,
            equality_delete_sequence_numbers=data["equality_delete_sequence_numbers"],
            bulk_read=data["bulk_read"],
            clustering=Clustering.from_json(data["clustering"]) if data["clustering"] else None,
            repartition=data["repartition"],
        )


@dataclass
class TaskResult:
    """What one task produced: output data files with full metrics, and the rows it moved."""

    task_id: int
    data_files: list[DataFile] = field(default_factory=list)
    records_read: int = 0
    rows_deleted: int = 0
    input_bytes: int = 0
    bulk_read_files: int = 0  # inputs read in bulk, not through the Iceberg read path
    # CPU seconds per phase of the rewrite, when measured (compactor.rewrite.phase_times).
    phase_times: Mapping[str, float] = field(default_factory=dict)
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
                "bulk_read_files": self.bulk_read_files,
                "phase_times": self.phase_times,
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
            bulk_read_files=data["bulk_read_files"],
            phase_times=data["phase_times"],
            partition_types=_types_from_json(data["partition_types"]),
        )


def plan_tasks(
    plan: Plan, run_id: str, io_properties: Mapping[str, str], execution: ExecutionOptions
) -> list[RewriteTask]:
    """One task per group of ``plan``, for run ``run_id``, in the plan's order, with the
    buffers of ``execution``."""
    metadata = plan.metadata
    schema, specs = metadata.schema(), metadata.specs()
    tasks = []
    for group in plan.groups:
        inputs = tuple(
            TaskInput(f.data_file, f.data_sequence_number, f.delete_files, f.file_sequence_number)
            for f in group.files
        )
        spec_ids = {group.spec_id} | {f.data_file.spec_id for f in inputs}
        spec_ids |= {d.spec_id for f in inputs for d in f.delete_files}
        tasks.append(
            RewriteTask(
                run_id=run_id,
                task_id=group.group_id,
                table=plan.table,
                metadata_location=plan.metadata_location,
                # Strings only: a REST catalog puts its auth manager object among them.
                io_properties=with_s3_retries(
                    {k: v for k, v in io_properties.items() if isinstance(v, str)}
                ),
                spec_id=group.spec_id,
                partition=group.partition,
                partition_types={i: partition_types(specs[i], schema) for i in sorted(spec_ids)},
                target_file_size=group.target_file_size,
                row_group_size=execution.row_group_size,
                read_ahead=execution.read_ahead,
                memory_limit=execution.memory_limit,
                file_prefix=f"compactor-{run_id}-g{group.group_id:04d}",
                inputs=inputs,
                equality_delete_sequence_numbers={
                    d.file_path: plan.equality_delete_sequence_numbers[d.file_path]
                    for f in inputs
                    for d in f.delete_files
                    if d.content == DataFileContent.EQUALITY_DELETES
                },
                bulk_read=execution.bulk_read,
                clustering=plan.clustering,
                repartition=group.repartition,
            )
        )
    return tasks
