"""A REST catalog behind a proxy that loses the answer to a commit: applied, or applied later.

Iceberg's REST catalog server runs as in test_catalogs.py; a small HTTP proxy in front of it
forwards every request, except that the commit of a table (``POST .../tables/<name>``) is
answered with a fault — ``504 Gateway Timeout``, ``503``, a reset connection or no answer until
the client times out — after forwarding it (the commit landed, the client cannot know), without
forwarding it (it did not), or while holding it to forward later (a gateway or a slow catalog
applies it once the client has given up). Only a definite refusal lets compactor discard what it
wrote: after any of these it must find out from the table whether its snapshot landed; if it did,
the run succeeded; if not, it keeps every file it wrote, since the catalog may still apply the
request, and no later run deletes them until that commit has landed or can no longer land. Either
way the rows never change, every engine can read the table, and, once settled, no file is left
that the table does not reference. The same server also refuses (400) a snapshot whose sequence
number another branch's commit took meanwhile: a conflict to retry.
"""

from __future__ import annotations

import functools
import http.client
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.table import Table

import compactor
from compactor.commit.inflight import in_doubt_report, read_record
from compactor.errors import CommitStateUnknownError
from compactor.iceberg.references import table_references

from support.java_reader import JavaReader, assert_java_reads_same

if TYPE_CHECKING:
    from support.catalog_servers import RestServer
    from support.s3_server import MotoS3

pytest_plugins = ("support.s3_server", "support.catalog_servers")

HOST = "127.0.0.1"
SMALL = {"target_file_size": "1MiB", "allow_small_target": True, "min_input_files": 2}
# The client's timeout when a test makes the proxy stay silent (pyiceberg sets none).
CLIENT_TIMEOUT_S = 2
# How long a held request waits for the test at most (a failing test must not hang).
HOLD_LIMIT_S = 120


class TimeoutProxy:
    """Forwards HTTP to ``upstream``; table commits get a fault while ``mode`` says so.

    ``mode``: None (forward everything), ``"after"`` (forward the commit, answer the fault),
    ``"instead"`` (answer the fault without forwarding) or ``"later"`` (answer the fault and keep
    the request for :meth:`deliver`). ``fault``: an HTTP status (504 by default, 503, ...),
    ``"reset"`` (close the connection without an answer) or ``"silence"`` (answer nothing until
    :meth:`deliver`, past the client's timeout). ``timed_out`` counts the faults given.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.removeprefix("http://")
        self.mode: str | None = None
        self.fault: int | str = 504
        self.timed_out = 0
        self.held: list[tuple[str, str, bytes | None, dict[str, str]]] = []
        self.delivered = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _read(self) -> tuple[bytes | None, dict[str, str]]:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                return body, headers

            def _handle(self) -> None:
                is_commit = self.command == "POST" and "/tables/" in self.path
                mode = proxy.mode if is_commit else None
                body, headers = self._read()
                if mode == "later":
                    proxy.held.append((self.command, self.path, body, headers))
                if mode in (None, "after"):
                    status, answer_headers, data = proxy.forward(
                        self.command, self.path, body, headers
                    )
                if mode is not None:
                    proxy.timed_out += 1
                    if proxy.fault == "silence":
                        proxy.delivered.wait(HOLD_LIMIT_S)
                    if not isinstance(proxy.fault, int):
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    status, answer_headers, data = proxy.fault, [], b'{"error": "fault"}'
                self.send_response(status)
                for name, value in answer_headers:
                    if name.lower() not in {"transfer-encoding", "connection", "content-length"}:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_HEAD = _handle

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((HOST, 0), Handler)
        self.uri = f"http://{HOST}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def forward(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection(self.upstream, timeout=60)
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        data = response.read()
        connection.close()
        return response.status, response.getheaders(), data

    def deliver(self) -> list[int]:
        """Forward the held commits now, as a late gateway would; their statuses."""
        self.mode = None
        held, self.held = self.held, []
        statuses = [self.forward(*request)[0] for request in held]
        self.delivered.set()
        return statuses

    def __enter__(self) -> TimeoutProxy:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.delivered.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxied(
    rest_catalog_server: RestServer, moto_s3: MotoS3, request: pytest.FixtureRequest
) -> Iterator[tuple[TimeoutProxy, Catalog]]:
    from support.catalog_servers import s3_properties  # a plugin of this module: imported after it

    with TimeoutProxy(rest_catalog_server.uri) as proxy:
        properties = {"type": "rest", "uri": proxy.uri, **s3_properties(moto_s3.endpoint)}
        catalog = load_catalog("proxied", **properties)
        namespace = f"faults_{request.node.name[-12:].strip('[]-') or 'ns'}_{id(proxy) % 10_000}"
        catalog.create_namespace(namespace)
        yield proxy, catalog


def _fragmented(catalog: Catalog) -> Table:
    namespace = catalog.list_namespaces()[-1][0]
    schema = pa.schema([("id", pa.int64()), ("name", pa.string())])
    table = catalog.create_table(f"{namespace}.events", schema)
    for start in range(0, 120, 20):
        table.append(pa.table({"id": range(start, start + 20), "name": ["x"] * 20}, schema))
    return table


def _rows(table: Table) -> Counter[tuple]:
    return Counter(tuple(r.values()) for r in table.scan().to_arrow().to_pylist())


def _unreferenced(table: Table, moto_s3: MotoS3) -> set[str]:
    """Objects under the table's location that its metadata does not reference."""
    from support.catalog_servers import s3_client

    bucket, _, prefix = table.location().removeprefix("s3://").partition("/")
    client = s3_client(moto_s3.endpoint)
    stored = set()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        stored.update(f"s3://{bucket}/{o['Key']}" for o in page.get("Contents", []))
    referenced = set(table_references(table).all())
    return {p for p in stored - referenced if not p.endswith(".metadata.json")}


def test_a_commit_that_landed_behind_a_504_is_recognised(
    proxied: tuple[TimeoutProxy, Catalog], moto_s3: MotoS3
) -> None:
    proxy, catalog = proxied
    table = _fragmented(catalog)
    before = _rows(table)
    proxy.mode = "after"

    result = compactor.compact(table, **SMALL)

    proxy.mode = None
    assert proxy.timed_out == 1
    table.refresh()
    assert result.snapshot_ids == [table.current_snapshot().snapshot_id]
    assert table.current_snapshot().summary.operation.value == "replace"
    assert _rows(table) == before
    assert len(table.inspect.files()) < 6
    assert _unreferenced(table, moto_s3) == set()


def test_a_commit_lost_behind_a_504_keeps_every_file_until_the_next_run(
    proxied: tuple[TimeoutProxy, Catalog], moto_s3: MotoS3
) -> None:
    proxy, catalog = proxied
    table = _fragmented(catalog)
    before, snapshot = _rows(table), table.current_snapshot().snapshot_id
    proxy.mode = "instead"

    with pytest.raises(CommitStateUnknownError, match="did not say whether snapshot"):
        compactor.compact(table, **SMALL)

    proxy.mode = None
    table.refresh()
    assert table.current_snapshot().snapshot_id == snapshot
    assert _rows(table) == before
    kept = _unreferenced(table, moto_s3)
    assert any("/data/" in p for p in kept), "the run's outputs were deleted"

    result = compactor.compact(table, **SMALL)

    table.refresh()
    assert result.recovered_files
    assert result.snapshot_ids == [table.current_snapshot().snapshot_id]
    assert _rows(table) == before
    assert _unreferenced(table, moto_s3) == set()


def test_a_branch_commit_inside_the_catalog_call_is_a_conflict_retried(
    proxied: tuple[TimeoutProxy, Catalog], moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another branch's commit lands between the run's last look at the table and its commit:
    main has not moved, but the run's snapshot now reuses a sequence number. The REST server
    refuses it (400, nothing applied); the run retries it with the next one."""
    _, catalog = proxied
    table = _fragmented(catalog)
    identifier = ".".join(table.name())
    table.manage_snapshots().create_branch(table.current_snapshot().snapshot_id, "audit").commit()
    before = _rows(table)
    appended = pa.table({"id": [1000], "name": ["branch"]}, table.schema().as_arrow())
    commit_table = catalog.commit_table
    moved: list[int] = []

    def commit_after_the_branch_moved(committing: Table, requirements: tuple, updates: tuple):
        to_main = any(getattr(r, "ref", None) == "main" for r in requirements)
        if to_main and not moved:
            other = catalog.load_table(identifier)
            other.append(appended, branch="audit")
            moved.append(other.metadata.last_sequence_number)
        return commit_table(committing, requirements, updates)

    monkeypatch.setattr(catalog, "commit_table", commit_after_the_branch_moved)
    table = catalog.load_table(identifier)
    result = compactor.compact(table, **SMALL)

    table.refresh()
    assert moved and [c.attempts for c in result.commits] == [2]
    assert result.snapshot_ids == [table.current_snapshot().snapshot_id]
    assert table.current_snapshot().sequence_number > moved[0]
    assert _rows(table) == before
    assert (
        table.scan(snapshot_id=table.snapshot_by_name("audit").snapshot_id).to_arrow().num_rows
        == 121
    )
    assert _unreferenced(table, moto_s3) == set()


FAULTS = [503, 504, "reset", "silence"]


def _set_fault(proxy: TimeoutProxy, catalog: Catalog, mode: str, fault: int | str) -> None:
    if fault == "silence":  # pyiceberg sets no timeout: give the client one, as users do
        session = catalog._session  # type: ignore[attr-defined]
        session.request = functools.partial(session.request, timeout=CLIENT_TIMEOUT_S)
    proxy.mode, proxy.fault = mode, fault


@pytest.mark.parametrize("fault", FAULTS)
def test_a_commit_that_landed_behind_any_fault_is_recognised(
    proxied: tuple[TimeoutProxy, Catalog], moto_s3: MotoS3, fault: int | str
) -> None:
    proxy, catalog = proxied
    table = _fragmented(catalog)
    before = _rows(table)
    _set_fault(proxy, catalog, "after", fault)

    result = compactor.compact(table, **SMALL)

    proxy.mode = None
    proxy.delivered.set()
    assert proxy.timed_out == 1
    table.refresh()
    assert result.snapshot_ids == [table.current_snapshot().snapshot_id]
    assert _rows(table) == before
    assert _unreferenced(table, moto_s3) == set()


@pytest.mark.parametrize("fault", FAULTS)
def test_a_commit_applied_after_the_client_gave_up_leaves_a_readable_table(
    proxied: tuple[TimeoutProxy, Catalog],
    moto_s3: MotoS3,
    java_reader: JavaReader,
    fault: int | str,
) -> None:
    """The gateway answers a fault (or nothing) and applies the commit later: in between, the
    next command on the table must not delete what the late commit references."""
    proxy, catalog = proxied
    table = _fragmented(catalog)
    before, start = _rows(table), table.current_snapshot().snapshot_id
    _set_fault(proxy, catalog, "later", fault)

    with pytest.raises(CommitStateUnknownError, match="did not say whether snapshot"):
        compactor.compact(table, **SMALL)

    (pending,) = read_record(table).commits()
    assert pending.parent_id == start
    kept = _unreferenced(table, moto_s3)
    assert any("/data/" in p for p in kept) and any(p.endswith(".avro") for p in kept)
    (report,) = in_doubt_report(table)
    listed = {p for p in kept if "/compactor-intent-" not in p and "/compactor-run." not in p}
    assert (report.commit.snapshot_id, report.files_kept) == (pending.snapshot_id, len(listed))

    # The daemon's next action on the table, with nothing of its own to commit.
    assert compactor.rewrite_deletes(table).recovered_files == []
    assert kept <= _unreferenced(table, moto_s3)

    assert proxy.deliver() == [200]
    table.refresh()
    assert table.current_snapshot().snapshot_id == pending.snapshot_id
    assert _rows(table) == before
    assert_java_reads_same(table)

    compactor.rewrite_deletes(table)  # the commit landed: the record is settled
    assert in_doubt_report(table) == []
    assert _unreferenced(table, moto_s3) == set()


def test_a_commit_that_can_no_longer_land_is_cleaned_up_by_the_next_run(
    proxied: tuple[TimeoutProxy, Catalog], moto_s3: MotoS3, java_reader: JavaReader
) -> None:
    proxy, catalog = proxied
    table = _fragmented(catalog)
    before = _rows(table)
    _set_fault(proxy, catalog, "later", 504)
    with pytest.raises(CommitStateUnknownError):
        compactor.compact(table, **SMALL)
    proxy.mode = None

    other = catalog.load_table(".".join(table.name()))
    other.append(pa.table({"id": [1000], "name": ["late"]}, other.schema().as_arrow()))
    result = compactor.rewrite_deletes(table)

    assert result.recovered_files
    table.refresh()
    assert _unreferenced(table, moto_s3) == set()
    assert proxy.deliver() == [409]  # the held request's AssertRefSnapshotId fails
    table.refresh()
    assert _rows(table) == before + Counter({(1000, "late"): 1})
    assert_java_reads_same(table)
