"""What the catalog call's outcome lets a run delete: only a definite refusal discards.

The catalog's ``commit_table`` is wrapped to fail in each way a real catalog or the network can
fail — applied and then failing (the answer is lost), or failing without applying — and the run's
files are checked. Iceberg Java's REST client maps 500, 502, 503 and 504 on a commit to "state
unknown", and its ``SnapshotProducer`` cleans up only after a failure that proves the commit was
refused; compactor does the same for every exception type. A commit whose answer was lost is
named in the run record before the call, so that no later run deletes its files while it may
still land: not a run after a crash, not a run that takes over from a paused one.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pyarrow as pa
import pytest
import requests
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import (
    BadRequestError,
    CommitFailedException,
    CommitStateUnknownException,
    ForbiddenError,
    NoSuchTableError,
    ServerError,
    ServiceUnavailableError,
    UnauthorizedError,
)
from pyiceberg.table import Table

import compactor
from compactor.commit.inflight import in_doubt_report, read_record, record_paths
from compactor.errors import CommitStateUnknownError
from compactor.maintain.delete_rewrite import DeleteRewriteResult

from support.java_reader import JavaReader, assert_java_reads_same
from support.rows import row_multiset, scan_rows
from support.tables import local_path, unreferenced_files

TABLE = "db.events"
SMALL = {"target_file_size": "1MiB", "allow_small_target": True, "min_input_files": 2}

# Failures after which the commit's outcome is unknown: the request may have been applied.
UNKNOWN = {
    "504": lambda: CommitStateUnknownException("504 Gateway Timeout"),
    "503": lambda: ServiceUnavailableError("503 Service Unavailable"),
    "5xx": lambda: ServerError("507 Insufficient Storage"),
    "read-timeout": lambda: requests.ReadTimeout("read timed out"),
    "reset": lambda: requests.ConnectionError("Connection reset by peer"),
    "unreadable-answer": lambda: ValueError("1 validation error for CommitTableResponse"),
    "other": lambda: RuntimeError("something else"),
}
# Failures that prove the commit was not applied.
REFUSED = {
    "400": lambda: BadRequestError("400 Bad Request: malformed update"),
    "401": lambda: UnauthorizedError("401 Unauthorized"),
    "403": lambda: ForbiddenError("403 Forbidden"),
    "404": lambda: NoSuchTableError("404: table db.events does not exist"),
}


@pytest.fixture
def events(catalog: Catalog) -> Table:
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    table = catalog.create_table(TABLE, schema)
    for start in range(0, 120, 20):
        table.append(pa.table({"id": range(start, start + 20), "name": ["x"] * 20}, schema))
    return catalog.load_table(TABLE)


def _fail_commits(
    monkeypatch: pytest.MonkeyPatch,
    catalog: Catalog,
    error: Callable[[], BaseException],
    apply: bool,
) -> list[Callable[[], object]]:
    """Make the catalog's next commit raise ``error()``, after applying it when ``apply``;
    when not, the request is kept in the returned list, to be applied later."""
    commit_table = catalog.commit_table
    held: list[Callable[[], object]] = []

    def failing(table: Table, requirements: tuple, updates: tuple) -> object:
        monkeypatch.setattr(catalog, "commit_table", commit_table)
        if apply:
            commit_table(table, requirements, updates)
        else:
            held.append(lambda: commit_table(table, requirements, updates))
        raise error()

    monkeypatch.setattr(catalog, "commit_table", failing)
    return held


def _append(catalog: Catalog, start: int) -> None:
    table = catalog.load_table(TABLE)
    table.append(pa.table({"id": [start], "name": ["late"]}, table.schema().as_arrow()))


@pytest.mark.parametrize("fault", sorted(UNKNOWN))
def test_an_applied_commit_whose_answer_was_lost_is_the_runs(
    catalog: Catalog, events: Table, monkeypatch: pytest.MonkeyPatch, fault: str
) -> None:
    before = row_multiset(scan_rows(events))
    _fail_commits(monkeypatch, catalog, UNKNOWN[fault], apply=True)

    result = compactor.compact(events, **SMALL)

    events.refresh()
    assert result.snapshot_ids == [events.current_snapshot().snapshot_id]
    assert row_multiset(scan_rows(events)) == before
    assert unreferenced_files(events) == []
    assert read_record(events) is None


@pytest.mark.parametrize("fault", sorted(UNKNOWN))
def test_a_commit_whose_answer_was_lost_keeps_its_files_until_it_can_no_longer_land(
    catalog: Catalog,
    events: Table,
    monkeypatch: pytest.MonkeyPatch,
    java_reader: JavaReader,
    fault: str,
) -> None:
    before, start = row_multiset(scan_rows(events)), events.current_snapshot().snapshot_id
    held = _fail_commits(monkeypatch, catalog, UNKNOWN[fault], apply=False)

    with pytest.raises(CommitStateUnknownError, match="did not say whether snapshot"):
        compactor.compact(events, **SMALL)

    kept = unreferenced_files(events)
    assert any("/data/" in p for p in kept) and any(p.endswith(".avro") for p in kept)
    (pending,) = read_record(events).commits()
    assert pending.parent_id == start
    assert [r.commit.snapshot_id for r in in_doubt_report(events)] == [pending.snapshot_id]

    # A command with nothing to commit takes the lease: the commit may still land.
    result = compactor.rewrite_deletes(events)
    assert result.recovered_files == []
    assert set(kept) <= set(unreferenced_files(events))

    _append(catalog, 1000)  # the branch moves on: the held request can no longer land
    result = compactor.rewrite_deletes(events)

    written = {p for p in kept if "/compactor-intent-" not in p}
    assert {str(local_path(p)) for p in result.recovered_files} == written
    assert unreferenced_files(events) == [] and read_record(events) is None
    with pytest.raises(CommitFailedException):
        held[0]()  # the late request is refused by its own requirement
    events.refresh()
    assert scan_rows(events).num_rows == before.total() + 1
    assert_java_reads_same(events)


@pytest.mark.parametrize("fault", ["504", "read-timeout"])
def test_a_commit_applied_after_the_run_gave_up_leaves_a_readable_table(
    catalog: Catalog,
    events: Table,
    monkeypatch: pytest.MonkeyPatch,
    java_reader: JavaReader,
    fault: str,
) -> None:
    before = row_multiset(scan_rows(events))
    held = _fail_commits(monkeypatch, catalog, UNKNOWN[fault], apply=False)
    with pytest.raises(CommitStateUnknownError):
        compactor.compact(events, **SMALL)
    (pending,) = read_record(events).commits()

    assert compactor.rewrite_deletes(events).recovered_files == []
    held[0]()  # a slow catalog applies it now

    events.refresh()
    assert events.current_snapshot().snapshot_id == pending.snapshot_id
    assert row_multiset(scan_rows(events)) == before
    assert_java_reads_same(events)
    assert in_doubt_report(events) == []
    compactor.rewrite_deletes(events)  # settles the record: the commit landed
    assert unreferenced_files(events) == [] and read_record(events) is None


def test_a_run_interrupted_inside_the_catalog_call_leaves_its_files_to_the_record(
    catalog: Catalog, events: Table, monkeypatch: pytest.MonkeyPatch, java_reader: JavaReader
) -> None:
    before = row_multiset(scan_rows(events))
    held = _fail_commits(monkeypatch, catalog, KeyboardInterrupt, apply=False)
    with pytest.raises(KeyboardInterrupt):
        compactor.compact(events, **SMALL)
    kept = unreferenced_files(events)
    assert any("/data/" in p for p in kept)

    compactor.rewrite_deletes(events)
    held[0]()

    events.refresh()
    assert row_multiset(scan_rows(events)) == before
    assert_java_reads_same(events)


def test_a_run_taking_over_from_a_paused_one_keeps_the_files_of_its_commit_in_flight(
    catalog: Catalog, events: Table, monkeypatch: pytest.MonkeyPatch, java_reader: JavaReader
) -> None:
    """A run is paused inside the catalog call (a stopped VM) long enough for its record to
    expire; another command takes the table over; then the paused request lands."""
    before = row_multiset(scan_rows(events))
    commit_table = catalog.commit_table
    took_over: list[DeleteRewriteResult] = []

    def paused(table: Table, requirements: tuple, updates: tuple) -> object:
        monkeypatch.setattr(catalog, "commit_table", commit_table)
        _expire_record(table)
        took_over.append(compactor.rewrite_deletes(catalog.load_table(TABLE)))
        return commit_table(table, requirements, updates)  # the paused request arrives

    monkeypatch.setattr(catalog, "commit_table", paused)
    compactor.compact(events, **SMALL)

    events.refresh()
    assert took_over[0].recovered_files == []
    assert row_multiset(scan_rows(events)) == before
    assert_java_reads_same(events)


def _expire_record(table: Table) -> None:
    """Write the table's run record again as expired, as a stalled heartbeat leaves it."""
    record = read_record(table)
    assert record is not None and record.commits()
    fields = {**record.__dict__, "expires_ms": 0, "seq": record.seq + 1}
    path = record_paths(table)[fields["seq"] % 2]
    with table.io.new_output(path).create(overwrite=True) as stream:
        stream.write(json.dumps(fields).encode())


@pytest.mark.parametrize("refusal", sorted(REFUSED))
def test_a_definite_refusal_discards_what_the_run_wrote(
    catalog: Catalog, events: Table, monkeypatch: pytest.MonkeyPatch, refusal: str
) -> None:
    before, start = row_multiset(scan_rows(events)), events.current_snapshot().snapshot_id
    _fail_commits(monkeypatch, catalog, REFUSED[refusal], apply=False)

    with pytest.raises(type(REFUSED[refusal]())):
        compactor.compact(events, **SMALL)

    events.refresh()
    assert events.current_snapshot().snapshot_id == start
    assert row_multiset(scan_rows(events)) == before
    assert unreferenced_files(events) == [] and read_record(events) is None


def test_a_conflict_is_retried_and_its_attempt_discarded(
    catalog: Catalog, events: Table, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = row_multiset(scan_rows(events))
    _fail_commits(monkeypatch, catalog, lambda: CommitFailedException("409"), apply=False)

    result = compactor.compact(events, **SMALL)

    events.refresh()
    assert [c.attempts for c in result.commits] == [2]
    assert row_multiset(scan_rows(events)) == before
    assert unreferenced_files(events) == [] and read_record(events) is None
