"""S3 for the S3 tests: moto in server mode on loopback, reached over real HTTP.

One server per test session (:func:`moto_s3`), one bucket per test (:func:`s3`). Every request
the server answers is recorded (:class:`RequestLog`), so tests can prove which S3 operations a
run used, whichever client sent them (boto3 or pyarrow's AWS SDK). Nothing here, nor in the
clients configured from it, reaches beyond 127.0.0.1: credentials and region are explicit,
instance metadata is disabled and no user AWS or pyiceberg configuration is read.

Faults can be injected at the HTTP level, per bucket (:class:`S3Faults`, fixture
:func:`s3_faults`): S3 error responses (503 SlowDown, 500 InternalError) for some requests,
connections dropped after part of a request body was read, DeleteObjects answers with per-key
``<Error>`` entries, and ListObjectsV2 pages capped at a few keys.

Used from a test module with ``pytest_plugins = ("support.s3_server",)``.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import re
import socket
import struct
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode
from xml.etree import ElementTree
from xml.sax.saxutils import escape

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
        self._faults: dict[str, S3Faults] = {}

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
        with self._lock:
            faults = self._faults.get(bucket)
        if faults is not None:
            return faults.handle(request, environ, start_response, self._app)
        return self._app(environ, start_response)

    def faults(self, bucket: str) -> S3Faults:
        """The fault plan of ``bucket`` (created empty on first use): see :class:`S3Faults`."""
        with self._lock:
            if bucket not in self._faults:
                self._faults[bucket] = S3Faults(bucket)
            return self._faults[bucket]

    def clear_faults(self, bucket: str) -> None:
        """Stop injecting faults into ``bucket``'s requests."""
        with self._lock:
            self._faults.pop(bucket, None)

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


# --- fault injection ----------------------------------------------------------------------------

SLOW_DOWN, INTERNAL_ERROR, DROP, DELETE_ERROR = "SlowDown", "InternalError", "drop", "delete-error"
_ERROR_STATUS = {SLOW_DOWN: "503 Slow Down", INTERNAL_ERROR: "500 Internal Server Error"}
_ERROR_MESSAGE = {
    SLOW_DOWN: "Please reduce your request rate.",
    INTERNAL_ERROR: "We encountered an internal error. Please try again.",
    "AccessDenied": "Access Denied",
}
_S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"
# Query parameters of ListObjects (V1: marker) and ListObjectsV2 (list-type=2).
_LIST_PARAMETERS = {
    "list-type",
    "continuation-token",
    "start-after",
    "fetch-owner",
    "prefix",
    "delimiter",
    "max-keys",
    "encoding-type",
    "marker",
}


def _error_document(code: str, message: str, resource: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{escape(code)}</Code><Message>{escape(message)}</Message>"
        f"<Resource>{escape(resource)}</Resource><RequestId>{uuid.uuid4().hex[:16]}</RequestId>"
        "</Error>"
    ).encode()


def _query_names(query: str) -> set[str]:
    return {part.partition("=")[0] for part in query.split("&") if part}


@dataclass
class Fault:
    """A rule: the requests it matches are answered by ``kind`` instead of by moto.

    A request matches when its method is ``method``, its decoded key matches ``key`` (a regular
    expression, searched) and its query has every parameter in ``query``. Only the first
    ``times`` matching requests *per key* are hit (None: every one), so a client retrying a
    request sees the fault ``times`` times, then success. ``injected`` lists the requests hit.
    """

    kind: str
    method: str
    key: re.Pattern[str]
    query: frozenset[str] = frozenset()
    times: int | None = 1
    fraction: float = 0.5  # DROP: the share of the body read before the connection is cut
    code: str = ""  # DELETE_ERROR: the per-key error code
    injected: list[S3Request] = field(default_factory=list)
    _seen: Counter[str] = field(default_factory=Counter)

    def matches(self, request: S3Request) -> bool:
        return (
            self.kind != DELETE_ERROR
            and request.method == self.method
            and self.key.search(request.key) is not None
            and self.query <= _query_names(request.query)
        )

    def take(self, request: S3Request) -> bool:
        """Whether this request gets the fault (counts it); call with the plan's lock held."""
        return self.matches(request) and self._count(request.key, request)

    def take_key(self, key: str, request: S3Request) -> bool:
        """Whether a DeleteObjects request's ``key`` gets a per-key error (counts it)."""
        return (
            self.kind == DELETE_ERROR and bool(self.key.search(key)) and self._count(key, request)
        )

    def _count(self, key: str, request: S3Request) -> bool:
        if self.times is not None and self._seen[key] >= self.times:
            return False
        self._seen[key] += 1
        self.injected.append(request)
        return True


class S3Faults:
    """Faults injected into one bucket's requests, at the HTTP level, before moto sees them.

    - :meth:`throttle` / :meth:`error`: an S3 error response (503 SlowDown, 500 InternalError)
      with the usual XML body; the request body is read first, and moto never sees the request.
    - :meth:`drop_connection`: part of the request body is read, then the TCP connection is
      reset (SO_LINGER 0): the client gets no response at all, as when a proxy or the network
      drops a connection mid-upload.
    - :meth:`fail_deletes`: DeleteObjects requests are passed to moto without the keys
      matching a pattern, and moto's 200 answer gets an ``<Error>`` entry for each of them —
      those objects stay, as under a policy denying their deletion.
    - :meth:`cap_list_keys`: ListObjectsV2 requests ask for at most ``n`` keys, so listings of
      a handful of objects come in several pages (continuation tokens), as 1000+ objects would.

    Every DeleteObjects request's keys are recorded (``delete_batches``), and every listing
    request (``list_requests``).
    """

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        self._lock = threading.Lock()
        self.faults: list[Fault] = []
        self.max_keys: int | None = None
        self.delete_batches: list[list[str]] = []
        self.list_requests: list[S3Request] = []
        self._failed_delete_keys: list[str] = []

    # -- configuration ---------------------------------------------------------------------

    def _add(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    def error(
        self,
        method: str,
        key: str = "",
        *,
        code: str = INTERNAL_ERROR,
        times: int | None = 1,
        query: Iterable[str] = (),
    ) -> Fault:
        """Answer matching requests with S3 error ``code`` (``SlowDown`` or ``InternalError``)."""
        assert code in _ERROR_STATUS, code
        return self._add(Fault(code, method, re.compile(key), frozenset(query), times))

    def throttle(
        self, method: str, key: str = "", *, times: int | None = 1, query: Iterable[str] = ()
    ) -> Fault:
        """Answer matching requests with 503 SlowDown."""
        return self.error(method, key, code=SLOW_DOWN, times=times, query=query)

    def drop_connection(
        self,
        method: str,
        key: str = "",
        *,
        times: int | None = 1,
        query: Iterable[str] = (),
        fraction: float = 0.5,
    ) -> Fault:
        """Read ``fraction`` of a matching request's body, then reset the connection."""
        return self._add(Fault(DROP, method, re.compile(key), frozenset(query), times, fraction))

    def fail_deletes(
        self, key: str, code: str = "AccessDenied", *, times: int | None = None
    ) -> Fault:
        """Report keys matching ``key`` as per-key errors ``code`` in DeleteObjects answers.

        ``times``: per key, how many requests get the error (None: every one).
        """
        return self._add(Fault(DELETE_ERROR, "POST", re.compile(key), times=times, code=code))

    def cap_list_keys(self, max_keys: int | None) -> None:
        """Make every ListObjectsV2 request ask for at most ``max_keys`` keys (None: stop)."""
        with self._lock:
            self.max_keys = max_keys

    def clear(self) -> None:
        """Inject nothing more (what was recorded stays)."""
        with self._lock:
            self.faults, self.max_keys = [], None

    @property
    def injected(self) -> list[tuple[str, S3Request]]:
        """Every request a fault hit, with the fault's kind."""
        with self._lock:
            return [(f.kind, r) for f in self.faults for r in f.injected]

    def failed_delete_keys(self) -> list[str]:
        """Keys reported as per-key errors so far."""
        with self._lock:
            return list(self._failed_delete_keys)

    # -- the WSGI side ---------------------------------------------------------------------

    def handle(
        self,
        request: S3Request,
        environ: dict[str, Any],
        start_response: Callable[..., Any],
        app: Callable[..., Any],
    ) -> Any:
        with self._lock:
            fault = next((f for f in self.faults if f.take(request)), None)
            max_keys = self.max_keys
        if fault is not None and fault.kind == DROP:
            _drop_connection(environ, fault.fraction)
        if fault is not None:
            _read_body(environ)  # a well-behaved server reads the body it does not want
            body = _error_document(
                fault.kind, _ERROR_MESSAGE[fault.kind], f"/{request.bucket}/{request.key}"
            )
            start_response(
                _ERROR_STATUS[fault.kind],
                [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))],
            )
            return [] if request.method == "HEAD" else [body]
        if request.is_batch_delete:
            return self._delete_objects(request, environ, start_response, app)
        names = _query_names(request.query)
        if request.method == "GET" and not request.key and names <= _LIST_PARAMETERS:
            with self._lock:
                self.list_requests.append(request)
            if max_keys is not None and "list-type" in names:
                pairs = parse_qsl(request.query, keep_blank_values=True)
                asked = [int(v) for k, v in pairs if k == "max-keys" and v.isdigit()]
                limit = min([max_keys, *asked])
                pairs = [(k, v) for k, v in pairs if k != "max-keys"] + [("max-keys", str(limit))]
                environ["QUERY_STRING"] = urlencode(pairs)
        return app(environ, start_response)

    def _delete_objects(
        self,
        request: S3Request,
        environ: dict[str, Any],
        start_response: Callable[..., Any],
        app: Callable[..., Any],
    ) -> Any:
        """Record the batch; hold back the keys to fail and add their ``<Error>`` entries."""
        body = _read_body(environ)
        document = ElementTree.fromstring(body)

        def child(element: ElementTree.Element, name: str) -> str | None:
            found = [c.text or "" for c in element if c.tag.rsplit("}", 1)[-1] == name]
            return found[0] if found else None

        keys = [child(e, "Key") or "" for e in document if e.tag.rsplit("}", 1)[-1] == "Object"]
        quiet = child(document, "Quiet") or "false"
        failing: dict[str, str] = {}
        with self._lock:
            self.delete_batches.append(keys)
            for key in keys:
                fault = next((f for f in self.faults if f.take_key(key, request)), None)
                if fault is not None:
                    failing[key] = fault.code
        if not failing:
            environ["wsgi.input"] = io.BytesIO(body)
            return app(environ, start_response)
        with self._lock:
            self._failed_delete_keys.extend(failing)
        errors = "".join(
            f"<Error><Key>{escape(key)}</Key><Code>{escape(code)}</Code>"
            f"<Message>{escape(_ERROR_MESSAGE.get(code, code))}</Message></Error>"
            for key, code in failing.items()
        )
        if len(failing) == len(keys):  # nothing left for moto: answer alone
            answer = (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<DeleteResult xmlns="{_S3_NS}">'
                f"{errors}</DeleteResult>"
            ).encode()
            start_response(
                "200 OK",
                [("Content-Type", "application/xml"), ("Content-Length", str(len(answer)))],
            )
            return [answer]
        kept = "".join(
            f"<Object><Key>{escape(key)}</Key></Object>" for key in keys if key not in failing
        )
        _set_body(environ, f'<Delete xmlns="{_S3_NS}">{kept}<Quiet>{quiet}</Quiet></Delete>')
        captured: dict[str, Any] = {}

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            captured["status"], captured["headers"] = status, headers
            return lambda data: None

        chunks = app(environ, capture)
        try:
            answer = b"".join(chunks)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        if captured["status"].startswith("200"):
            end = answer.rindex(b"</DeleteResult>")
            answer = answer[:end] + errors.encode() + answer[end:]
        headers = [(k, v) for k, v in captured["headers"] if k.lower() != "content-length"]
        start_response(captured["status"], [*headers, ("Content-Length", str(len(answer)))])
        return [answer]


def _read_body(environ: dict[str, Any]) -> bytes:
    """The request body (by Content-Length); the stream is left empty."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    return environ["wsgi.input"].read(length) if length > 0 else b""


def _set_body(environ: dict[str, Any], text: str) -> None:
    """Replace the request body (for moto: signatures and checksums are not checked)."""
    body = text.encode()
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))
    for name in [n for n in environ if n.startswith("HTTP_X_AMZ_CHECKSUM_")]:
        del environ[name]  # the body changed: its checksum would not match
    environ.pop("HTTP_CONTENT_MD5", None)


def _drop_connection(environ: dict[str, Any], fraction: float) -> None:
    """Read ``fraction`` of the body, then reset the TCP connection; raises ConnectionError.

    werkzeug treats the ConnectionError as a dropped connection: it writes nothing more.
    """
    length = int(environ.get("CONTENT_LENGTH") or 0)
    if length > 0:
        environ["wsgi.input"].read(max(1, int(length * fraction)))
    connection: socket.socket = environ["werkzeug.socket"]
    # Linger 0: closing sends a RST, not a FIN — the peer sees "connection reset".
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    connection.shutdown(socket.SHUT_RDWR)
    connection.close()
    raise ConnectionAbortedError("fault injected: connection dropped")


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


@pytest.fixture
def s3_faults(s3: S3Bucket) -> Iterator[S3Faults]:
    """The fault plan of this test's bucket: empty at first, switched off after the test."""
    faults = s3.log.faults(s3.bucket)
    try:
        yield faults
    finally:
        s3.log.clear_faults(s3.bucket)
