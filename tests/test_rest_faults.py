"""A REST catalog behind a proxy that times out: 504 on the commit, applied or not.

Iceberg's REST catalog server runs as in test_catalogs.py; a small HTTP proxy in front of it
forwards every request, except that the commit of a table (``POST .../tables/<name>``) is
answered ``504 Gateway Timeout`` — after forwarding it (the commit landed, the client cannot
know) or without forwarding it (it did not). pyiceberg turns that 504 into
CommitStateUnknownException. compactor must then find out from the table whether its snapshot
landed: if it did, the run succeeded; if not, it keeps every file it wrote (the catalog might
still apply it) and the next run cleans up. Either way the rows never change and, once settled,
no file is left that the table does not reference. The same server also refuses (400) a
snapshot whose sequence number another branch's commit took meanwhile: a conflict to retry.
"""

from __future__ import annotations

import http.client
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
from compactor.errors import CommitStateUnknownError
from compactor.iceberg.references import table_references

if TYPE_CHECKING:
    from catalog_servers import RestServer
    from s3_server import MotoS3

pytest_plugins = ("s3_server", "catalog_servers")

HOST = "127.0.0.1"
SMALL = {"target_file_size": "1MiB", "allow_small_target": True, "min_input_files": 2}


class TimeoutProxy:
    """Forwards HTTP to ``upstream``; table commits get a 504 while ``mode`` says so.

    ``mode``: None (forward everything), ``"after"`` (forward the commit, answer 504) or
    ``"instead"`` (answer 504 without forwarding). ``timed_out`` counts the 504s given.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.removeprefix("http://")
        self.mode: str | None = None
        self.timed_out = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> tuple[int, list[tuple[str, str]], bytes]:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                connection = http.client.HTTPConnection(proxy.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse()
                data = response.read()
                connection.close()
                return response.status, response.getheaders(), data

            def _handle(self) -> None:
                is_commit = self.command == "POST" and "/tables/" in self.path
                mode = proxy.mode if is_commit else None
                if mode == "instead":
                    length = int(self.headers.get("Content-Length") or 0)
                    self.rfile.read(length)
                else:
                    status, headers, data = self._forward()
                if mode is not None:
                    proxy.timed_out += 1
                    status, headers, data = 504, [], b'{"error": "gateway timeout"}'
                self.send_response(status)
                for name, value in headers:
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

    def __enter__(self) -> TimeoutProxy:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxied(
    rest_catalog_server: RestServer, moto_s3: MotoS3, request: pytest.FixtureRequest
) -> Iterator[tuple[TimeoutProxy, Catalog]]:
    from catalog_servers import s3_properties  # a plugin of this module: imported after it

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
    from catalog_servers import s3_client

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
