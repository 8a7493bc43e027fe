"""Rewrite tasks as plain data: exact JSON round trips, runs in a fresh process, intent files,
cancellation, and the library examples of the README and docs/library.md."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import BucketTransform, IdentityTransform, TruncateTransform
from pyiceberg.typedef import Record
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

import compactor
from compactor.bench.sample import create_events_table
from compactor.commit.inflight import RunRecord, boot_id, pid_namespace, record_paths
from compactor.execute import make_executor
from compactor.execute.executors import ThreadExecutor
from compactor.iceberg.codec import DATA_FILE_STRUCTS, decode_partition, encode_partition
from compactor.planning.tasks import RewriteTask, TaskResult
from compactor.rewrite.intent import listed_files
from compactor.rewrite.task_runner import TaskCancelled, run_task

from support import REPOSITORY
from support.deletes import commit_delete_files, write_position_delete_file
from support.rows import assert_same_rows, scan_rows
from support.runs import planned_tasks, run_compaction
from support.tables import live_data_files, local_path, unreferenced_files

README = REPOSITORY / "README.md"
LIBRARY_DOC = REPOSITORY / "docs" / "library.md"
SMALL = {"target_file_size": "1MiB", "allow_small_target": True, "min_input_files": 2}
# A target small enough for one group of the events table to roll over to a second file.
ROLLING = {"target_file_size": "32KiB", "allow_small_target": True, "min_input_files": 2}
TIMEOUT_S = 300


def fields(data_file: DataFile) -> list[tuple[str, Any]]:
    """Every field of a DataFile (and the Python type of each partition value), for comparing."""
    struct = DATA_FILE_STRUCTS[len(data_file)]
    values = [(f.name, data_file[i]) for i, f in enumerate(struct.fields)]
    partition = data_file.partition
    types = [type(partition[i]).__name__ for i in range(len(partition))]
    return [*values, ("spec_id", data_file.spec_id), ("partition types", types)]


def assert_same_data_files(a: Sequence[DataFile], b: Sequence[DataFile]) -> None:
    assert [fields(f) for f in a] == [fields(f) for f in b]


# --- the JSON form ------------------------------------------------------------------------------

PRIMITIVES = [
    (BooleanType(), True),
    (IntegerType(), -7),
    (LongType(), 2**40),
    (FloatType(), 1.100000023841858),  # a float32 value, as Avro reads it
    (DoubleType(), -0.1),
    (DateType(), 20_514),
    (TimeType(), 45_296_000_001),
    (TimestampType(), 1_772_409_600_000_001),
    (TimestamptzType(), -1),
    (DecimalType(9, 2), Decimal("-12.50")),
    (DecimalType(38, 10), Decimal("1234567890123456789012345678.0123456789")),
    (StringType(), "région/é ü"),
    (UUIDType(), uuid.UUID("a4c1f8c2-5f62-4b3e-9a36-2f4b9f3c1d2e")),
    (FixedType(3), b"\x00\xff\x10"),
    (BinaryType(), b"\x00binary\xff"),
]


def test_every_primitive_partition_value_round_trips_exactly() -> None:
    types = [t for t, _ in PRIMITIVES]
    partition = Record(*[v for _, v in PRIMITIVES], None)
    encoded = encode_partition(partition, [*types, DateType()])

    decoded = decode_partition(json.loads(json.dumps(encoded)))

    assert decoded == partition
    for index in range(len(partition)):
        assert type(decoded[index]) is type(partition[index]), PRIMITIVES[index]


MIXED = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "day", DateType(), required=False),
    NestedField(3, "at", TimestampType(), required=False),
    NestedField(4, "amount", DecimalType(9, 2), required=False),
    NestedField(5, "name", StringType(), required=False),
    NestedField(6, "note", StringType(), required=False),
)
MIXED_SPEC = PartitionSpec(
    PartitionField(2, 1000, IdentityTransform(), "day"),
    PartitionField(3, 1001, IdentityTransform(), "at"),
    PartitionField(4, 1002, IdentityTransform(), "amount"),
    PartitionField(5, 1003, TruncateTransform(2), "name_trunc"),
    PartitionField(1, 1004, BucketTransform(2), "id_bucket"),
)


def _mixed_rows(commit: int, rows: int = 40) -> pa.Table:
    ids = range(commit * rows, (commit + 1) * rows)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "day": [dt.date(2026, 3, 1) + dt.timedelta(days=i % 2) for i in ids],
            "at": pa.array(
                [dt.datetime(2026, 3, 1, 12, 30, i % 2) for i in ids], pa.timestamp("us")
            ),
            "amount": pa.array([Decimal("-12.50") if i % 2 else Decimal("7.25") for i in ids]),
            "name": [("ab", "cd")[i % 2] + f"-{i}" for i in ids],
            "note": [f"note {i}" for i in ids],
        },
        schema=MIXED.as_arrow(),
    )


@pytest.fixture
def mixed(catalog: Catalog) -> Table:
    """Four partitions over date, timestamp, decimal, truncate and bucket fields, three files
    each, and position deletes on one partition's files."""
    table = catalog.create_table("db.mixed", MIXED, partition_spec=MIXED_SPEC)
    for commit in range(3):
        table.append(_mixed_rows(commit))
    files = list(live_data_files(table).values())
    first = files[0].partition
    victims = [f for f in files if f.partition == first]
    return commit_delete_files(
        table, [write_position_delete_file(table, {f: [0] for f in victims})]
    )


def test_a_task_and_its_result_round_trip_through_json_exactly(mixed: Table) -> None:
    plan, tasks = planned_tasks(mixed, "run000000001", **SMALL)
    assert len(tasks) == 4
    assert any(t.delete_files for t in tasks), "no task carries position deletes"

    for task in tasks:
        text = task.to_json()
        again = RewriteTask.from_json(json.loads(json.dumps(text)))

        assert again.to_json() == text
        for name in ("run_id", "task_id", "table", "metadata_location", "io_properties"):
            assert getattr(again, name) == getattr(task, name)
        assert again.partition == task.partition and again.spec_id == task.spec_id
        assert again.partition_types == task.partition_types
        assert (again.target_file_size, again.row_group_size, again.read_ahead) == (
            task.target_file_size,
            task.row_group_size,
            task.read_ahead,
        )
        assert again.file_prefix == task.file_prefix
        assert_same_data_files(
            [f.data_file for f in again.inputs], [f.data_file for f in task.inputs]
        )
        assert [f.data_sequence_number for f in again.inputs] == [
            f.data_sequence_number for f in task.inputs
        ]
        for mine, theirs in zip(again.inputs, task.inputs, strict=True):
            assert_same_data_files(mine.delete_files, theirs.delete_files)

    with_deletes = next(t for t in tasks if t.delete_files)
    result = run_task(with_deletes)
    assert result.rows_deleted == len(with_deletes.inputs) and result.data_files

    again_result = TaskResult.from_json(result.to_json())

    assert again_result.to_json() == result.to_json()
    assert (again_result.task_id, again_result.records_read, again_result.rows_deleted) == (
        result.task_id,
        result.records_read,
        result.rows_deleted,
    )
    assert again_result.input_bytes == result.input_bytes == with_deletes.input_bytes
    assert_same_data_files(again_result.data_files, result.data_files)
    assert all(f.lower_bounds and f.upper_bounds and f.column_sizes for f in result.data_files)


def test_a_task_json_from_another_version_is_refused() -> None:
    with pytest.raises(compactor.CompactorError, match="version 99 is not supported"):
        RewriteTask.from_json(json.dumps({"version": 99}))


def test_the_ray_executor_without_the_ray_extra_is_a_one_line_usage_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "compactor.execute.ray_executor", None)  # as if not installed
    options = compactor.resolve_options("db.t", {}, executor="ray")

    with pytest.raises(compactor.UsageError, match=r"pip install 'compactor\[ray\]'") as raised:
        make_executor(options.execution)

    assert raised.value.options == ("executor",)
    assert isinstance(
        make_executor(compactor.resolve_options("db.t", {}).execution), ThreadExecutor
    )


# --- a task runs anywhere -----------------------------------------------------------------------

WORKER = """
import sys
from pathlib import Path
from compactor.planning.tasks import RewriteTask
from compactor.rewrite.task_runner import run_task

task = RewriteTask.from_json(Path(sys.argv[1]).read_text())
Path(sys.argv[2]).write_text(run_task(task).to_json())
"""


class FreshProcessExecutor:
    """Runs each task from its JSON in a new Python process, one after the other."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.results: list[TaskResult] = []

    def run(
        self, tasks: Sequence[RewriteTask], cancel: compactor.CancelToken
    ) -> Iterator[tuple[RewriteTask, TaskResult | BaseException]]:
        for task in tasks:
            source = self.workdir / f"task-{task.task_id}.json"
            target = self.workdir / f"result-{task.task_id}.json"
            source.write_text(task.to_json())
            done = subprocess.run(
                [sys.executable, "-c", WORKER, str(source), str(target)],
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                check=False,
            )
            if done.returncode != 0:
                yield task, compactor.CompactorError(done.stderr.strip().splitlines()[-1])
                continue
            result = TaskResult.from_json(target.read_text())
            self.results.append(result)
            yield task, result

    def close(self) -> None:
        pass


def _outputs_by_partition(table: Table, result: compactor.RunResult) -> list[list[Any]]:
    """Committed outputs as the table's manifests hold them, every field but the path."""
    live = live_data_files(table)
    files = [live[d.file_path] for r in result.committed for d in r.data_files]
    # Plain dicts: pyiceberg's lazy metric maps print their address, which would order at random.
    rows = [
        [dict(v) if isinstance(v, Mapping) else v for k, v in fields(f) if k != "file_path"]
        for f in files
    ]
    return sorted(rows, key=repr)


def test_a_task_run_from_json_in_a_fresh_process_commits_what_the_in_process_path_does(
    catalog: Catalog, tmp_path: Path
) -> None:
    here = create_events_table(catalog, "db.here", commits=4, rows_per_commit=400, days=1)
    there = create_events_table(catalog, "db.there", commits=4, rows_per_commit=400, days=1)
    before = scan_rows(here)
    assert_same_rows(before, scan_rows(there))

    in_process = compactor.compact(here, **SMALL)
    executor = FreshProcessExecutor(tmp_path)
    elsewhere = compactor.compact(there, executor=executor, **SMALL)

    assert len(executor.results) == len(elsewhere.plan.groups) == 4
    assert elsewhere.to_dict()["committed_groups"] == 4 and elsewhere.failures == []
    here, there = catalog.load_table("db.here"), catalog.load_table("db.there")
    assert_same_rows(before, scan_rows(here))
    assert_same_rows(before, scan_rows(there))
    # What the table committed is exactly what the fresh processes described, metrics and all.
    live = live_data_files(there)
    for result in executor.results:
        assert_same_data_files([live[d.file_path] for d in result.data_files], result.data_files)
    # And the same as the in-process path wrote, but for the file names.
    assert _outputs_by_partition(there, elsewhere) == _outputs_by_partition(here, in_process)
    assert unreferenced_files(there) == []


# --- intent files -------------------------------------------------------------------------------

KILLED_WORKER = """
import os, signal, sys
from pathlib import Path
from compactor.rewrite.parquet_output import RollingParquetWriter
from compactor.planning.tasks import RewriteTask
from compactor.rewrite.task_runner import run_task

real, opened = RollingParquetWriter._open_file, []

def open_then_die(self):
    real(self)
    opened.append(self._file.path)
    if len(opened) == 2:  # the second output exists, empty: die before writing to it
        os.kill(os.getpid(), signal.SIGKILL)

RollingParquetWriter._open_file = open_then_die
run_task(RewriteTask.from_json(Path(sys.argv[1]).read_text()))
"""


def _abandoned_record(table: Table, run_id: str) -> None:
    """The record a run killed with its task leaves: its process is gone."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    record = RunRecord(
        run_id=run_id,
        host=socket.gethostname(),
        pid=dead.pid,
        started_ms=0,
        expires_ms=int(time.time() * 1000) + 600_000,
        seq=1,
        process=f"{boot_id()}:0",
        pid_namespace=pid_namespace(),
    )
    local_path(record_paths(table)[1]).write_text(json.dumps(asdict(record)))


def _intent_files(table: Table) -> list[Path]:
    return sorted(local_path(table.metadata.location).glob("metadata/compactor-intent-*"))


def test_a_task_killed_mid_write_leaves_its_outputs_in_its_intent_file_for_the_next_run(
    catalog: Catalog, tmp_path: Path
) -> None:
    table = create_events_table(catalog, "db.events", commits=5, rows_per_commit=3000, days=1)
    before = scan_rows(table)
    run_id = "deadbeef0042"
    _, (task, *_) = planned_tasks(table, run_id, **ROLLING)
    source = tmp_path / "task.json"
    source.write_text(task.to_json())
    _abandoned_record(table, run_id)

    killed = subprocess.run(
        [sys.executable, "-c", KILLED_WORKER, str(source)],
        capture_output=True,
        timeout=TIMEOUT_S,
        check=False,
    )

    assert killed.returncode == -signal.SIGKILL, killed.stderr
    intents = _intent_files(table)
    assert [p.name for p in intents] and all(
        f"-{run_id}-t{task.task_id}-" in p.name for p in intents
    )
    listed = listed_files(table.io, [p.as_uri() for p in intents])
    written = sorted(local_path(table.metadata.location).rglob(f"compactor-{run_id}-*.parquet"))
    assert len(written) == 2, "the task should have created two output files"
    assert sorted(map(str, written)) == sorted(str(local_path(p)) for p in listed)

    result, table = run_compaction(catalog, "db.events", **ROLLING)

    assert sorted(result.recovered_files) == sorted(listed)
    assert not any(p.exists() for p in written)
    assert _intent_files(table) == []
    assert unreferenced_files(table) == []
    assert result.snapshot_ids, "the run went on to compact after recovering"
    assert_same_rows(before, scan_rows(table))


class CancelAfter:
    """Cancelled from the ``n``-th time it is asked on."""

    def __init__(self, n: int) -> None:
        self.n, self.asked = n, 0

    def is_cancelled(self) -> bool:
        self.asked += 1
        return self.asked >= self.n


@pytest.mark.parametrize(
    ("bulk_read", "asked"),
    [
        (True, 2),  # before it starts, after the first batch (small files' rows are joined)
        (False, 3),  # before it starts, after the first file, after the second
    ],
    ids=["bulk", "each"],
)
def test_a_cancelled_task_leaves_no_output_file(
    catalog: Catalog, bulk_read: bool, asked: int
) -> None:
    table = create_events_table(catalog, "db.events", commits=5, rows_per_commit=3000, days=1)
    _, (task, *_) = planned_tasks(table, "cancelled0001", **ROLLING, bulk_read=bulk_read)
    assert len(task.inputs) == 5
    token = CancelAfter(asked)

    with pytest.raises(TaskCancelled, match="stopped before group"):
        run_task(task, token)

    assert token.asked == asked
    listed = listed_files(table.io, [p.as_uri() for p in _intent_files(table)])
    assert listed, "the task should have created an output before it was cancelled"
    assert not any(local_path(p).exists() for p in listed)
    assert not list(local_path(table.metadata.location).rglob("compactor-cancelled0001-*.parquet"))


def test_orphans_keep_the_intent_files_of_a_recorded_run_and_what_they_list(
    catalog: Catalog,
) -> None:
    table = create_events_table(catalog, "db.events", commits=5, rows_per_commit=3000, days=1)
    _, tasks = planned_tasks(table, "recorded0001", **ROLLING)
    with pytest.raises(TaskCancelled):
        run_task(tasks[0], CancelAfter(2))  # leaves its intent file; its outputs are deleted
    result = run_task(tasks[1])  # leaves outputs and intent file, as a killed run would
    outputs = [local_path(d.file_path) for d in result.data_files]
    metadata = local_path(table.metadata.location) / "metadata"
    stray = metadata / "compactor-intent-other0001-t0-aaaaaaaa.0.json"
    stray.write_text('{"files": []}')  # of a run without a record: an ordinary orphan
    _abandoned_record(table, "recorded0001")
    intents = [p for p in _intent_files(table) if p != stray]
    assert intents and outputs
    old = time.time() - 10 * 86_400
    for path in local_path(table.metadata.location).rglob("*"):
        os.utime(path, (old, old))

    swept = compactor.remove_orphans(table).to_dict()

    assert all(p.exists() for p in [*outputs, *intents])
    assert swept["skipped_in_run_record"] == len(outputs) + len(intents)
    assert not stray.exists()
    assert swept["files_deleted"] == 1


# --- the library examples of the README and docs/library.md ---------------------------------------


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def _library_examples() -> list[str]:
    """The README's library example and every example of docs/library.md, each once."""
    section = README.read_text().split("\n## Library", 1)[1].split("\n## ", 1)[0]
    front_page = _python_blocks(section)
    manual = _python_blocks(LIBRARY_DOC.read_text())
    assert len(front_page) == 1, "the README's Library section has one example"
    assert len(manual) == 2, "docs/library.md has the plan-and-compact and executor examples"
    return list(dict.fromkeys([*front_page, *manual]))


def test_the_library_examples_run(catalog: SqlCatalog, tmp_path: Path) -> None:
    blocks = _library_examples()
    assert len(blocks) >= 2
    # The examples name the catalog "lake"; a SQL catalog keeps tables per catalog name.
    catalog = SqlCatalog("lake", **catalog.properties)
    catalog.create_namespace("db")
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("PYICEBERG_")}
    env.update(
        HOME=str(tmp_path),
        PYICEBERG_HOME=str(tmp_path),
        PYICEBERG_CATALOG__LAKE__TYPE="sql",
        PYICEBERG_CATALOG__LAKE__URI=catalog.properties["uri"],
        PYICEBERG_CATALOG__LAKE__WAREHOUSE=catalog.properties["warehouse"],
    )
    for number, block in enumerate(blocks):
        table = create_events_table(catalog, "db.events", commits=6, rows_per_commit=400, days=1)
        before, snapshots = scan_rows(table), len(table.metadata.snapshots)
        script = tmp_path / f"example-{number}.py"
        script.write_text(block)

        ran = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )

        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.strip(), "the example printed nothing"
        table = catalog.load_table("db.events")
        assert len(table.metadata.snapshots) == snapshots + 1, ran.stdout
        assert table.current_snapshot().summary.operation.value == "replace"
        assert len(live_data_files(table)) == 4  # one file per partition
        assert_same_rows(before, scan_rows(table))
        assert unreferenced_files(table) == []
