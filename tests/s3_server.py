"""S3 for the S3 tests: moto in server mode on loopback, reached over real HTTP.

One server per test session (:func:`moto_s3`), one bucket per test (:func:`s3`). Every request
the server answers is recorded (:class:`RequestLog`), so tests can prove which S3 operations a
run used, whichever client sent them (boto3 or pyarrow's AWS SDK). Nothing here, nor in the
clients configured from it, reaches beyond 127.0.0.1: credentials and region are explicit,
instance metadata is disabled and no user AWS or pyiceberg configuration is read.

Used from a test module with ``pytest_plugins = ("s3_server",)``.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import boto3
import pytest
from moto.server import ThreadedMotoServer
from pyiceberg.catalog.sql import SqlCatalog

HOST = "127.0.0.1"
ACCESS_KEY, SECRET_KEY, REGION = "testing", "testing", "us-east-1"
CATALOG_NAME = "lake"
NAMESPACE = "db"
# Variables that would point clients elsewhere or make them read user configuration.
AWS_LEAKY = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
)
_bucket_numbers = itertools.count()


_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")
ACCESS_DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
)


@dataclass(frozen=True)
class S3Request:
    """One request the server received.

    ``key`` is decoded and empty for bucket operations; ``access_key`` is the key id the request
    was signed with (SigV4 ``Credential=``), empty when unsigned.
    """

    method: str
    bucket: str
    key: str
    query: str
    access_key: str

    @property
    def is_batch_delete(self) -> bool:
        """A DeleteObjects request: ``POST /bucket?delete``."""
        names = {part.partition("=")[0] for part in self.query.split("&")}
        return self.method == "POST" and not self.key and "delete" in names


class RequestLog:
    """WSGI middleware recording every request (path-style addressing) before moto answers it.

    It can also refuse a bucket's DeleteObjects requests with 403 AccessDenied, as a bucket
    policy denying s3:DeleteObject would.
    """

    def __init__(self, app: Callable[..., Any]) -> None:
        self._app = app
        self._lock = threading.Lock()
        self._requests: list[S3Request] = []
        self._refuse_deletes: set[str] = set()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = unquote(environ.get("PATH_INFO", ""))
        bucket, _, key = path.lstrip("/").partition("/")
        signed = _CREDENTIAL.search(environ.get("HTTP_AUTHORIZATION", ""))
        request = S3Request(
            environ["REQUEST_METHOD"],
            bucket,
            key,
            environ.get("QUERY_STRING", ""),
            signed.group(1) if signed else "",
        )
        with self._lock:
            self._requests.append(request)
            refuse = request.is_batch_delete and bucket in self._refuse_deletes
        if refuse:
            start_response(
                "403 Forbidden",
                [("Content-Type", "application/xml"), ("Content-Length", str(len(ACCESS_DENIED)))],
            )
            return [ACCESS_DENIED]
        return self._app(environ, start_response)

    def refuse_batch_deletes(self, bucket: str, refuse: bool = True) -> None:
        """Answer ``bucket``'s DeleteObjects requests with 403 AccessDenied (or stop doing so)."""
        with self._lock:
            if refuse:
                self._refuse_deletes.add(bucket)
            else:
                self._refuse_deletes.discard(bucket)

    def mark(self) -> int:
        """A position in the log: pass it to :meth:`since`."""
        with self._lock:
            return len(self._requests)

    def since(self, mark: int, bucket: str) -> list[S3Request]:
        """Requests to ``bucket`` after ``mark``."""
        with self._lock:
            return [r for r in self._requests[mark:] if r.bucket == bucket]


@dataclass(frozen=True)
class MotoS3:
    """The session's server: its endpoint and the log of every request it answered."""

    endpoint: str
    log: RequestLog


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    """moto's S3 over HTTP on 127.0.0.1, on a port the OS picks (its socket binds port 0)."""
    server = ThreadedMotoServer(ip_address=HOST, port=0, verbose=False)
    server.start()
    access_log = logging.getLogger("werkzeug")  # one line per request: too much for reports
    level = access_log.level
    access_log.setLevel(logging.WARNING)
    try:
        host, port = server.get_host_and_port()
        assert host == HOST, f"moto bound {host}, not loopback"
        # The server reads its WSGI app per request: wrap moto's app to record requests.
        wsgi = server._server
        assert wsgi is not None
        log = RequestLog(wsgi.app)
        wsgi.app = log
        yield MotoS3(f"http://{HOST}:{port}", log)
    finally:
        access_log.setLevel(level)
        server.stop()


@dataclass
class S3Bucket:
    """A test's bucket on the session's server, a boto3 client for it and a catalog using it."""

    endpoint: str
    bucket: str
    client: Any
    log: RequestLog
    home: Path
    catalog_name: str = CATALOG_NAME

    @property
    def warehouse(self) -> str:
        return f"s3://{self.bucket}/wh"

    @property
    def catalog_uri(self) -> str:
        return f"sqlite:///{self.home / 'catalog.db'}"

    def properties(self) -> dict[str, str]:
        """The ``s3.*`` FileIO properties of the catalog (and so of its tables)."""
        return {
            "s3.endpoint": self.endpoint,
            "s3.access-key-id": ACCESS_KEY,
            "s3.secret-access-key": SECRET_KEY,
            "s3.region": REGION,
        }

    def catalog(self, properties: dict[str, str] | None = None) -> SqlCatalog:
        """A SQLite catalog named ``lake`` with its warehouse in this bucket; namespace ``db``.

        ``properties`` replace the default :meth:`properties`.
        """
        catalog = SqlCatalog(
            self.catalog_name,
            uri=self.catalog_uri,
            warehouse=self.warehouse,
            **(self.properties() if properties is None else properties),
        )
        if not catalog.namespace_exists(NAMESPACE):
            catalog.create_namespace(NAMESPACE)
        return catalog

    def key(self, location: str) -> str:
        """The object key of ``s3://<bucket>/<key>``, exactly as spelled (no decoding)."""
        prefix = f"s3://{self.bucket}/"
        assert location.startswith(prefix), f"{location} is not in bucket {self.bucket}"
        return location[len(prefix) :]

    def objects(self, location: str) -> dict[str, int]:
        """Key -> size of every object under ``location`` (a directory: ``/`` is appended)."""
        prefix = self.key(location).rstrip("/") + "/"
        found: dict[str, int] = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        ):
            for item in page.get("Contents", []):
                found[item["Key"]] = item["Size"]
        return found

    def put(self, key: str, body: bytes = b"junk") -> str:
        """Upload an object; returns its location."""
        self.client.put_object(Bucket=self.bucket, Key=key, Body=body)
        return f"s3://{self.bucket}/{key}"

    def exists(self, key: str) -> bool:
        response = self.client.list_objects_v2(Bucket=self.bucket, Prefix=key, MaxKeys=1)
        return any(item["Key"] == key for item in response.get("Contents", []))

    def requests_since(self, mark: int) -> list[S3Request]:
        return self.log.since(mark, self.bucket)


def _bucket_name(test_name: str) -> str:
    """A valid, session-unique bucket name derived from the test's name."""
    stem = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:40].strip("-")
    return f"t{next(_bucket_numbers):03d}-{stem or 'bucket'}"


def isolate_environment(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """Point every client at explicit test credentials; read no user AWS or pyiceberg setup."""
    for name in list(os.environ):
        if name in AWS_LEAKY or name.upper().startswith(("PYICEBERG_", "COMPACTOR_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(home / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(home / "no-aws-credentials"))
    monkeypatch.setenv("NO_PROXY", HOST)
    monkeypatch.setenv("no_proxy", HOST)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PYICEBERG_HOME", str(home))
    monkeypatch.setenv("COMPACTOR_HOME", str(home))


@pytest.fixture
def s3(
    moto_s3: MotoS3,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> S3Bucket:
    """A fresh bucket for this test, with the process environment isolated."""
    isolate_environment(monkeypatch, tmp_path)
    client = boto3.client(
        "s3",
        endpoint_url=moto_s3.endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
    )
    bucket = _bucket_name(request.node.name)
    client.create_bucket(Bucket=bucket)
    return S3Bucket(moto_s3.endpoint, bucket, client, moto_s3.log, tmp_path)
