"""Adversarial tests of compaction: the ways a run could lose, resurrect or break rows.

Each test reproduces an operator's bad day (a second container, a stalled heartbeat, a catalog
that times out, a signal at the worst moment) or a table shape the spec treats specially.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.avro.file import AvroFile
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import CommitStateUnknownException, NoSuchTableError
from pyiceberg.manifest import DataFileContent
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.typedef import Record
from pyiceberg.types import IntegerType, LongType, NestedField, StringType

import compactor.compaction as compaction
import compactor.execute.executors as executors
from compactor.commit.inflight import (
    LeaseHeldError,
    RunRecord,
    boot_id,
    pid_namespace,
    read_record,
    record_paths,
)
from compactor.errors import CommitConflictError, CommitStateUnknownError
from compactor.planning.tasks import RewriteTask
from compactor.rewrite.task_runner import load_table_state

from support.deletes import (
    commit_delete_files,
    write_equality_delete_file,
    write_position_delete_file,
)
from support.java_reader import assert_java_reads_same
from support.rows import assert_same_rows, scan_rows
from support.runs import run_compaction
from support.tables import (
    FIELD_IDS,
    IMPORTED,
    events_table,
    live_data_files,
    live_delete_files,
    live_entries,
    local_path,
    read_data_file,
    unmapped_snapshots,
    unreferenced_files,
)

# Every test here holds on both read paths (compactor.rewrite.bulk_read and Iceberg's).
pytestmark = pytest.mark.usefixtures("read_path")

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "category", StringType(), required=False),
)


def _rows(ids: range, category: str) -> pa.Table:
    return pa.table(
        {"id": pa.array(list(ids), pa.int64()), "category": [category] * len(ids)},
        schema=SCHEMA.as_arrow(),
    )


def _events(catalog: Catalog, identifier: str = "db.ev", version: str = "2") -> Table:
    """One day of 4 regions, 4 files each (rows appended with
    :func:`support.tables.append_rows`); made afresh if it exists."""
    with contextlib.suppress(NoSuchTableError):
        catalog.purge_table(identifier)
    return events_table(
        catalog,
        identifier,
        commits=4,
        rows_per_commit=240,
        days=1,
        properties={"format-version": version},
    )


def _assert_every_referenced_file_exists(table: Table) -> None:
    for entry in live_entries(table):
        path = entry.data_file.file_path
        assert local_path(path).exists(), f"the current snapshot references missing {path}"


# --------------------------------------------------------------------------------------------
# 1. Manifests follow the spec's schema (equality_ids is list<int>)
# --------------------------------------------------------------------------------------------


def _equality_ids_element_type(table: Table, manifest_path: str) -> Any:
    with AvroFile(table.io.new_input(manifest_path)) as manifest:
        data_file = manifest.schema.find_field(2).field_type
        return data_file.field(135).field_type.element_type


def test_rewritten_delete_manifests_declare_equality_ids_as_int(catalog: Catalog) -> None:
    """A delete manifest holding an equality delete, rewritten to retire a position delete."""
    table = _events(catalog)
    eu = sorted(
        (f for f in live_data_files(table).values() if f.partition[1] == "eu"),
        key=lambda f: f.file_path,
    )
    us = next(f for f in live_data_files(table).values() if f.partition[1] == "us")
    rows_before = scan_rows(table).num_rows
    position_delete = write_position_delete_file(table, {f: [0] for f in eu})
    # An equality delete on another partition's key: it shares the delete manifest.
    equality_delete = write_equality_delete_file(
        table,
        ["event_id"],
        [(read_data_file(table, us).column("event_id")[0].as_py(),)],
        spec_id=us.spec_id,
        partition=us.partition,
    )
    table = commit_delete_files(table, [position_delete, equality_delete])

    result, table = run_compaction(catalog, "db.ev", where="region = 'eu'")
    assert result.commits and result.commits[0].removed_delete_files
    manifests = table.current_snapshot().manifests(table.io)
    rewritten = [
        m
        for m in manifests
        if m.added_snapshot_id == table.current_snapshot().snapshot_id
        and any(
            e.data_file.content == DataFileContent.EQUALITY_DELETES
            for e in m.fetch_manifest_entry(table.io)
        )
    ]
    assert rewritten, "the commit should have rewritten the delete manifest"
    for manifest in manifests:
        assert isinstance(_equality_ids_element_type(table, manifest.manifest_path), IntegerType), (
            f"{manifest.manifest_path} declares equality_ids as list<long>"
        )
    # Iceberg Java reads every manifest; pyiceberg cannot apply the equality delete, so the
    # compacted snapshot is compared with its parent as Java reads both.
    snapshot = table.current_snapshot()
    java = assert_java_reads_same(
        table, {snapshot.snapshot_id: None, snapshot.parent_snapshot_id: None}
    )
    assert java.rows(snapshot.snapshot_id) == java.rows(snapshot.parent_snapshot_id)
    assert sum(java.rows().values()) == rows_before - len(eu) - 1


# --------------------------------------------------------------------------------------------
# 2. Equality deletes under an all-void spec are global
# --------------------------------------------------------------------------------------------


def _apply_equality_deletes(table: Table) -> Counter[tuple[Any, ...]]:
    """Live rows by reading every data file and applying equality deletes on ``id`` by hand.

    A delete applies to data files of lower data sequence number; its spec here is unpartitioned
    (all void), so everywhere. pyiceberg cannot read equality deletes.
    """
    entries = live_entries(table)
    deletes = [
        (e.sequence_number, set(read_data_file(table, e.data_file).column("id").to_pylist()))
        for e in entries
        if e.data_file.content == DataFileContent.EQUALITY_DELETES
    ]
    rows: Counter[tuple[Any, ...]] = Counter()
    for e in entries:
        if e.data_file.content != DataFileContent.DATA:
            continue
        for row in read_data_file(table, e.data_file).to_pylist():
            if not any(e.sequence_number < seq and row["id"] in ids for seq, ids in deletes):
                rows[(row["id"], row["category"])] += 1
    return rows


def test_equality_delete_under_an_all_void_spec_applies_to_every_older_file(
    catalog: Catalog,
) -> None:
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "category"))
    table = catalog.create_table(
        "db.upserts", SCHEMA, partition_spec=spec, properties={"format-version": "1"}
    )
    for start in range(0, 100, 10):
        table.append(_rows(range(start, start + 10), "a"))
    with table.update_spec() as update:
        update.remove_field("category")  # v1: the field stays, as void
    with table.transaction() as tx:
        tx.upgrade_table_version(2)
    table = catalog.load_table("db.upserts")
    void_spec = table.spec()
    assert void_spec.fields and all(str(f.transform) == "void" for f in void_spec.fields)

    delete_file = write_equality_delete_file(
        table, ["id"], [(i,) for i in range(5)], spec_id=void_spec.spec_id, partition=Record(None)
    )
    table = commit_delete_files(table, [delete_file])
    expected = _apply_equality_deletes(table)
    assert sum(expected.values()) == 95

    parent = table.metadata.current_snapshot_id

    result, table = run_compaction(catalog, "db.upserts")
    assert _apply_equality_deletes(table) == expected, "deleted rows came back"
    # Every file the global delete applied to was rewritten without its rows: the delete goes.
    assert result.to_dict()["rewritten_files"] == 10
    assert live_delete_files(table) == {}
    rows = sorted(expected.elements())
    expected_table = pa.table(
        {"id": [r[0] for r in rows], "category": [r[1] for r in rows]}, schema=SCHEMA.as_arrow()
    )
    current = table.metadata.current_snapshot_id
    assert_java_reads_same(
        table, {None: expected_table, current: expected_table, parent: expected_table}
    )


# --------------------------------------------------------------------------------------------
# 3. A second container with the same host name; a stalled heartbeat
# --------------------------------------------------------------------------------------------


def _junk(table: Table, name: str) -> str:
    path = local_path(table.metadata.location) / "data" / name
    path.write_bytes(b"a live run's output, still being written")
    return f"{table.metadata.location}/data/{name}"


@pytest.mark.parametrize("namespace", ["pid:[1]", None], ids=["other-namespace", "unknown"])
def test_a_run_in_another_pid_namespace_with_our_host_name_is_not_judged_dead(
    catalog: Catalog, namespace: str | None
) -> None:
    """A second container with our host name: its PID means nothing here, only the expiry."""
    table = _events(catalog)
    output = _junk(table, "compactor-otherrun0001-g0000-00000-aaaa.parquet")
    record = asdict(
        RunRecord(
            run_id="otherrun0001",
            host=socket.gethostname(),
            pid=999_999,  # no such process here; in its own namespace it is alive
            started_ms=0,
            expires_ms=int(time.time() * 1000) + 600_000,
            files=[output],
            seq=1,
            process=f"{boot_id()}:12345",
            pid_namespace=namespace or "",
        )
    )
    if namespace is None:
        record.pop("pid_namespace")  # as a run of an older compactor wrote it
    local_path(record_paths(table)[1]).write_text(json.dumps(record))
    assert pid_namespace() and pid_namespace() != namespace

    with pytest.raises(LeaseHeldError, match="otherrun0001"):
        run_compaction(catalog, "db.ev")
    assert local_path(output).exists(), "a live run's output was deleted"
    assert read_record(catalog.load_table("db.ev")).run_id == "otherrun0001"


def _take_over_after_rewrite(monkeypatch: pytest.MonkeyPatch, delete_outputs: bool) -> None:
    """Once groups are rewritten, another run takes the lease (this run's heartbeat stalled)."""
    real = executors.run_task

    def rewrite_then_lose_the_lease(
        task: RewriteTask, cancel: Any = None, on_read: Any = None
    ) -> Any:
        result = real(task, cancel, on_read)
        if delete_outputs:
            for data_file in result.data_files:
                local_path(data_file.file_path).unlink()
        location = load_table_state(task.metadata_location, task.io_properties)[0].location
        for slot in record_paths_for(location):
            record = RunRecord("usurper0001", "elsewhere", 1, 0, 2**62, [], seq=10**6)
            local_path(slot).write_text(json.dumps(asdict(record)))
        return result

    monkeypatch.setattr(executors, "run_task", rewrite_then_lose_the_lease)


def record_paths_for(location: str) -> list[str]:
    return [f"{location.rstrip('/')}/metadata/compactor-run.{n}.json" for n in (0, 1)]


@pytest.mark.parametrize("delete_outputs", [True, False], ids=["outputs-deleted", "outputs-kept"])
def test_a_run_that_lost_its_lease_does_not_commit(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch, delete_outputs: bool
) -> None:
    table = _events(catalog)
    before, snapshots = scan_rows(table), len(table.metadata.snapshots)
    _take_over_after_rewrite(monkeypatch, delete_outputs)
    with pytest.raises(CommitConflictError, match="lost its lease|missing from storage"):
        run_compaction(catalog, "db.ev")
    table = catalog.load_table("db.ev")
    assert len(table.metadata.snapshots) == snapshots
    assert_same_rows(before, scan_rows(table))
    assert read_record(table).run_id == "usurper0001", "the new holder's record was touched"


@pytest.mark.usefixtures("file_kind")
@pytest.mark.parametrize("file_kind", [FIELD_IDS, IMPORTED], indirect=True)
def test_outputs_missing_from_storage_are_not_committed(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _events(catalog)
    before, snapshots = scan_rows(table), len(table.metadata.snapshots)
    real = executors.run_task

    def rewrite_then_lose_outputs(
        task: RewriteTask, cancel: Any = None, on_read: Any = None
    ) -> Any:
        result = real(task, cancel, on_read)
        if task.task_id == 0:
            local_path(result.data_files[0].file_path).unlink()
        return result

    monkeypatch.setattr(executors, "run_task", rewrite_then_lose_outputs)
    result, table = run_compaction(catalog, "db.ev", commit_every=1)
    refused = [f for f in result.failures if f.group_id == 0]
    assert refused and "missing from storage" in refused[0].reason
    assert len(table.metadata.snapshots) == snapshots + len(result.plan.groups) - 1
    _assert_every_referenced_file_exists(table)
    assert_same_rows(before, scan_rows(table))


# --------------------------------------------------------------------------------------------
# 4. Commit state unknown: the commit lands after the catalog call failed
# --------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("file_kind")
@pytest.mark.parametrize("file_kind", [FIELD_IDS, IMPORTED], indirect=True)
def test_commit_state_unknown_keeps_every_file_even_when_the_commit_lands_later(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _events(catalog)
    before = scan_rows(table)
    delayed: list[tuple[Any, ...]] = []
    real_commit = type(catalog).commit_table

    def time_out(self: Catalog, table: Table, requirements: Any, updates: Any) -> Any:
        delayed.append((table, requirements, updates))
        raise CommitStateUnknownException("504 Gateway Timeout")

    monkeypatch.setattr(type(catalog), "commit_table", time_out)
    with pytest.raises(CommitStateUnknownError, match="kept"):
        run_compaction(catalog, "db.ev")
    monkeypatch.setattr(type(catalog), "commit_table", real_commit)

    # The catalog applies the request a moment later.
    assert len(delayed) == 1
    real_commit(catalog, *delayed[0])
    table = catalog.load_table("db.ev")
    assert table.current_snapshot().summary.operation.value == "replace"
    _assert_every_referenced_file_exists(table)
    assert_same_rows(before, scan_rows(table))
    # The run's record stays so that the next run settles it: nothing referenced is deleted.
    assert read_record(table) is not None
    result, table = run_compaction(catalog, "db.ev")
    assert result.recovered_files == []
    _assert_every_referenced_file_exists(table)
    assert unreferenced_files(table) == []
    unmapped = unmapped_snapshots(table)  # Java reads them, their rows not compared
    assert table.metadata.current_snapshot_id not in unmapped
    assert_java_reads_same(table, unmapped)


def test_commit_state_unknown_and_never_applied_is_cleaned_up_by_the_next_run(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = _events(catalog)
    before = scan_rows(table)
    real_commit = type(catalog).commit_table

    def time_out(self: Catalog, table: Table, requirements: Any, updates: Any) -> Any:
        raise CommitStateUnknownException("504 Gateway Timeout")

    monkeypatch.setattr(type(catalog), "commit_table", time_out)
    with pytest.raises(CommitStateUnknownError):
        run_compaction(catalog, "db.ev")
    table = catalog.load_table("db.ev")
    assert unreferenced_files(table), "the outputs should have been kept"
    monkeypatch.setattr(type(catalog), "commit_table", real_commit)

    result, table = run_compaction(catalog, "db.ev")
    assert result.recovered_files
    assert unreferenced_files(table) == []
    assert_same_rows(before, scan_rows(table))


# --------------------------------------------------------------------------------------------
# 7. Position deletes apply by sequence number, per data file entry
# --------------------------------------------------------------------------------------------


def test_position_delete_does_not_apply_to_a_path_added_again_later(catalog: Catalog) -> None:
    table = catalog.create_table("db.readded", SCHEMA, properties={"format-version": "2"})
    table.append(_rows(range(0, 10), "a"))
    table.append(_rows(range(10, 20), "b"))
    files = sorted(live_data_files(table).values(), key=lambda f: f.file_path)
    table = commit_delete_files(table, [write_position_delete_file(table, {f: [0] for f in files})])
    assert scan_rows(table).num_rows == 18

    # The first file is removed, then the same path is added again: the delete, older than the
    # new entry, no longer applies to it.
    readded = next(
        f for f in files if read_data_file(table, f).column("category")[0].as_py() == "a"
    )
    with table.transaction() as tx, tx.update_snapshot().overwrite() as overwrite:
        overwrite.delete_data_file(readded)
    with table.transaction() as tx, tx.update_snapshot().fast_append() as append:
        append.append_data_file(readded)
    table = catalog.load_table("db.readded")
    readded_at = table.metadata.current_snapshot_id
    # pyiceberg's scan applies the old delete to the new entry too (18 rows): count by hand.
    expected = Counter((i, "a") for i in range(10)) + Counter((i, "b") for i in range(11, 20))

    result, table = run_compaction(catalog, "db.readded")
    assert result.to_dict()["rewritten_files"] == 2
    assert live_delete_files(table) == {}, "the position delete applies to nothing any more"
    after: Counter[tuple[Any, ...]] = Counter()
    for data_file in live_data_files(table).values():
        after.update((r["id"], r["category"]) for r in read_data_file(table, data_file).to_pylist())
    assert after == expected
    java = assert_java_reads_same(table, {readded_at: None})
    assert java.rows(readded_at) == java.rows(), "Java reads the re-added file whole too"


# --------------------------------------------------------------------------------------------
# 9. A signal at any moment after a commit never deletes committed files
# --------------------------------------------------------------------------------------------


def _interrupt_at_line(
    monkeypatch: pytest.MonkeyPatch, line: int
) -> tuple[list[int], Callable[..., Any]]:
    """A tracer raising KeyboardInterrupt at the ``line``-th line the runner's commit step runs
    once the catalog commit returned, and a list recording where it fired."""
    fired: list[int] = []
    real = compaction.commit_replace
    state = {"returned": False, "count": 0}

    def commit_and_mark(*args: Any, **kwargs: Any) -> Any:
        outcome = real(*args, **kwargs)
        state["returned"] = True
        return outcome

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code is not compaction.CommitManager._commit.__code__:
            return None

        def local(frame: Any, event: str, arg: Any) -> Any:
            if event == "line" and state["returned"] and not fired:
                if state["count"] == line:
                    fired.append(frame.f_lineno)
                    raise KeyboardInterrupt
                state["count"] += 1
            return local

        return local

    monkeypatch.setattr(compaction, "commit_replace", commit_and_mark)
    return fired, tracer


def test_a_signal_right_after_a_commit_never_deletes_its_files(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = 0
    while True:
        table = _events(catalog, "db.signal")
        before = scan_rows(table)
        fired, tracer = _interrupt_at_line(monkeypatch, line)
        sys.settrace(tracer)
        try:
            run_compaction(catalog, "db.signal")
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        table = catalog.load_table("db.signal")
        _assert_every_referenced_file_exists(table)
        assert_same_rows(before, scan_rows(table))
        if not fired:
            break
        line += 1
    assert line > 3, "the interrupt should have been tried at every line after the commit"
