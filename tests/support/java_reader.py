"""An independent reader: Apache Iceberg's Java library reads a table and reports what it sees.

The Maven project in ``tests/support/java`` (``compactor.readcheck.IcebergReadCheck``) opens a table
from its metadata.json, reads the live rows of the current state, of every snapshot still in the
metadata and of every branch and tag with ``IcebergGenerics`` (Java's own position delete,
equality delete and deletion vector semantics), reads every manifest list and every entry of
every manifest in full, and prints JSON. :func:`assert_java_reads_same` compares that with
pyiceberg's scans of the same snapshots.

Tables on local disk (``file://`` URIs, plain paths) are read with a local FileIO, tables on S3
(``s3://``, ``s3a://``, ``s3n://``) with Iceberg's S3FileIO (``iceberg-aws`` and the AWS SDK v2
of ``iceberg-aws-bundle``). :func:`java_read` takes the S3 settings from the table's FileIO
properties (pyiceberg's ``table.io.properties``: endpoint, access key id, secret, session token,
region; see :func:`java_io_properties`) and sends them with each read; Java opens the
metadata.json and every file it references through that FileIO. Credentials are never written
into an error or a log: the reader and :class:`JavaReadError` redact them.

One JVM serves every read of a test session (of each pytest-xdist worker): the first read starts
``IcebergReadCheck --serve``, which takes one JSON request a line on stdin and answers one JSON
line on stdout; reads are serialised by a lock, a server that died is started again on the next
read, and it is stopped at interpreter exit (its stdin closing also stops it if this process
dies). A read Java fails answers :class:`JavaReadError` for that read only; the server goes on.
The server keeps one S3 client per distinct set of S3 properties (at most four), so the reads of
a session against one S3 endpoint share a client.

The reader is built once per source version (hash of ``pom.xml`` and ``src/``) into
``~/.cache/compactor-tests/java-reader/<hash>/`` (``COMPACTOR_TEST_CACHE`` moves the root) under
a file lock, so parallel pytest workers and later sessions reuse it. Maven's local repository
(``~/.m2``) caches the dependencies; the first build needs Maven Central. A failed build raises
:class:`JavaReaderBuildError`: tests using the reader error out, they are never skipped.

Row lineage (format v3): for a v3 table Java reads the current state and every snapshot with the
projection ``MetadataColumns.schemaWithRowLineage(schema)``, so Iceberg's generic readers report
each live row's ``_row_id`` and ``_last_updated_sequence_number`` as Java computes them: the
file's own value when it has the column and the value is not null, else inherited, the row id as
the data file's ``first_row_id`` plus the row's position in the file and the sequence number as
the data file's *file* sequence number (Java's ``PartitionUtil.constantsMap`` passes
``fileSequenceNumber()``, not the data sequence number); for a data file without
``first_row_id`` both are null, whatever the file holds. :meth:`JavaRead.lineage` counts
(canonical row, row id, sequence number); ``JavaRead.next_row_id`` is the table's next-row-id.
v1 and v2 tables are read without lineage (no extra cost); ``lineage=`` of
:func:`java_read_location` forces it on or off. Refs are read without lineage.

Rows are compared as multisets of canonical strings, one per row: a JSON array of the top-level
values, written identically by both sides (see :func:`canonical_value`). Supported Iceberg types:
boolean, int, long, float, double (NaN, infinities and -0 kept apart), decimal, string, uuid,
binary, fixed, date, time, timestamp, timestamptz, struct, list, map, and null values of any of
them. timestamp_ns, timestamptz_ns, variant, geometry and geography raise
:class:`UnsupportedCanonicalType`.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import math
import os
import select
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FixedType,
    FloatType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UnknownType,
    UUIDType,
)

JAVA_PROJECT = Path(__file__).resolve().parent / "java"
MAIN_CLASS = "compactor.readcheck.IcebergReadCheck"
BUILD_TIMEOUT_S = 1800
READ_TIMEOUT_S = 600
STOP_TIMEOUT_S = 10
# C1 only and the serial collector, for the one-shot JVM (JavaReader.command) and the server:
# measured over 60 reads of small tables on two busy cores, full tiered JIT (C2) spent ~33 s of
# JVM CPU where C1 only spent ~20 s, and took longer in all (40-54 s against ~30 s).
JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
SERVER_JVM_OPTIONS = JVM_OPTIONS
# Added to the server's NO_PROXY: the AWS SDK honours HTTP(S)_PROXY from the environment, and
# no proxy can reach a loopback S3 endpoint (the tests' moto server).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

# Iceberg Java S3FileIO property -> the pyiceberg FileIO properties that give it, first found.
S3_PROPERTY_MAP: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("s3.endpoint", ("s3.endpoint",)),
    ("s3.access-key-id", ("s3.access-key-id", "client.access-key-id")),
    ("s3.secret-access-key", ("s3.secret-access-key", "client.secret-access-key")),
    ("s3.session-token", ("s3.session-token", "client.session-token")),
    ("client.region", ("s3.region", "client.region")),
)
# Java property names whose values are credentials (redacted from errors; IcebergReadCheck's
# SECRET_PROPERTIES).
SECRET_PROPERTIES = ("s3.access-key-id", "s3.secret-access-key", "s3.session-token")


class JavaReaderBuildError(RuntimeError):
    """The Java reader could not be built (no Maven Central and no cache, or a compile error)."""


class JavaReadError(AssertionError):
    """Iceberg's Java library failed to read the table; ``stderr`` holds the exception.

    Neither the message nor ``stderr`` holds a credential of the read's FileIO properties.
    """

    def __init__(self, message: str, stderr: str, returncode: int) -> None:
        super().__init__(message)
        self.stderr = stderr
        self.returncode = returncode


class UnsupportedCanonicalType(TypeError):
    """A column type the canonical row form does not cover."""


# --------------------------------------------------------------------------------------------
# Building
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JavaReader:
    """A built reader: how to run it."""

    java: str
    classpath: str
    build_dir: Path

    def command(self, metadata_location: str) -> list[str]:
        """The command line that reads the table at ``metadata_location`` in a JVM of its own."""
        return [self.java, *JVM_OPTIONS, "-cp", self.classpath, MAIN_CLASS, metadata_location]

    def server_command(self) -> list[str]:
        """The command line of the long-lived reader (see :func:`java_read_location`)."""
        return [self.java, *SERVER_JVM_OPTIONS, "-cp", self.classpath, MAIN_CLASS, "--serve"]


_lock = threading.Lock()
_reader: JavaReader | None = None


def cache_root() -> Path:
    """Where built readers are kept, one directory per source hash."""
    base = os.environ.get("COMPACTOR_TEST_CACHE") or Path.home() / ".cache" / "compactor-tests"
    return Path(base) / "java-reader"


def source_hash() -> str:
    """Hash of the Maven project's pom and sources: a change means a new build."""
    digest = hashlib.sha256()
    files = [JAVA_PROJECT / "pom.xml", *sorted((JAVA_PROJECT / "src").rglob("*"))]
    for path in files:
        if path.is_file():
            digest.update(str(path.relative_to(JAVA_PROJECT)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _tool(name: str) -> str:
    home = os.environ.get("JAVA_HOME")
    if name == "java" and home and (Path(home) / "bin" / "java").is_file():
        return str(Path(home) / "bin" / "java")
    found = shutil.which(name)
    if found is None:
        raise JavaReaderBuildError(
            f"{name} not found on PATH: the Java reader needs JDK 17 and Maven"
        )
    return found


def _load(build_dir: Path, java: str) -> JavaReader | None:
    """The reader built in ``build_dir``, if complete and its dependency jars are still there."""
    classes, classpath_file = build_dir / "classes", build_dir / "classpath.txt"
    if not (build_dir / "BUILT").is_file() or not classpath_file.is_file():
        return None
    jars = [j for j in classpath_file.read_text().strip().split(os.pathsep) if j]
    if not jars or not all(Path(j).is_file() for j in jars):
        return None  # ~/.m2 was cleaned: build again
    return JavaReader(java, os.pathsep.join([str(classes), *jars]), build_dir)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` across processes (pytest workers, sessions)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(build_dir: Path) -> None:
    """Run Maven into a scratch directory, then move it into place."""
    scratch = build_dir.with_name(f"{build_dir.name}.building-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    command = [
        _tool("mvn"),
        "-q",
        "-B",
        "-f",
        str(JAVA_PROJECT / "pom.xml"),
        f"-Dreadcheck.buildDir={scratch}",
        "process-classes",  # compiles, then writes classpath.txt (see pom.xml)
    ]
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        shutil.rmtree(scratch, ignore_errors=True)
        raise JavaReaderBuildError(f"Maven build timed out after {BUILD_TIMEOUT_S}s") from e
    if done.returncode != 0 or not (scratch / "classpath.txt").is_file():
        shutil.rmtree(scratch, ignore_errors=True)
        output = (done.stdout + done.stderr).strip()[-6000:]
        raise JavaReaderBuildError(
            f"building the Java reader failed (exit {done.returncode}): {' '.join(command)}\n"
            f"{output}"
        )
    (scratch / "BUILT").write_text(source_hash() + "\n")
    shutil.rmtree(build_dir, ignore_errors=True)
    scratch.rename(build_dir)


def ensure_reader() -> JavaReader:
    """Build the reader if this source version has no complete build yet; return it.

    Safe across threads and processes (pytest-xdist workers): one builds, the others wait on a
    file lock and then use its result.
    """
    global _reader
    with _lock:
        if _reader is not None and _load(_reader.build_dir, _reader.java) is not None:
            return _reader
        java = _tool("java")
        build_dir = cache_root() / source_hash()
        reader = _load(build_dir, java)
        if reader is None:
            with file_lock(build_dir.with_name(f"{build_dir.name}.lock")):
                reader = _load(build_dir, java)
                if reader is None:
                    _build(build_dir)
                    reader = _load(build_dir, java)
        if reader is None:
            raise JavaReaderBuildError(f"the Java reader build in {build_dir} is incomplete")
        _reader = reader
        return reader


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


# One live row's lineage as Java reads it: (canonical row, _row_id,
# _last_updated_sequence_number); the ids are None only where Java inherits none (a data file
# without first_row_id).
LineageRow = tuple[str, int | None, int | None]


@dataclass(frozen=True)
class RowsRead:
    """The rows one Java read returned: column names and canonical rows, counted.

    ``lineage``: with row lineage read (format v3), each row with its ``_row_id`` and
    ``_last_updated_sequence_number``, counted; None when lineage was not read.
    """

    columns: tuple[str, ...]
    rows: Counter[str]
    lineage: Counter[LineageRow] | None = None

    @property
    def row_count(self) -> int:
        return self.rows.total()


@dataclass(frozen=True)
class SnapshotRead:
    """What Java read of one snapshot (time travel with ``useSnapshot``)."""

    snapshot_id: int
    parent_id: int | None
    schema_id: int | None
    manifest_list: str
    manifests: tuple[str, ...]
    read: RowsRead | None  # None when its rows were not asked for
    sequence_number: int | None = None


@dataclass(frozen=True)
class RefRead:
    """What Java read of one branch or tag (``useRef``)."""

    name: str
    type: str  # "branch" or "tag"
    snapshot_id: int
    read: RowsRead | None  # None when its snapshot's rows were not asked for


@dataclass(frozen=True)
class ManifestRead:
    """One manifest Java read in full, with its entries counted by status."""

    path: str
    content: str  # "data" or "deletes"
    spec_id: int
    added: int
    existing: int
    deleted: int
    snapshots: tuple[int, ...]
    # Live (added and existing) entries by kind: "data", "equality_deletes", "position_deletes"
    # (files), "deletion_vectors" (position deletes with a content offset: Puffin DVs).
    live_files: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class JavaRead:
    """Everything the Java reader reported for one metadata.json."""

    metadata_location: str
    format_version: int
    current_snapshot_id: int | None
    current: RowsRead
    snapshots: dict[int, SnapshotRead]
    refs: dict[str, RefRead]
    manifests: tuple[ManifestRead, ...]
    next_row_id: int | None = None  # the table's next-row-id (format v3), else None

    @property
    def snapshot_ids(self) -> list[int]:
        return list(self.snapshots)

    def lineage(self, snapshot_id: int | None = None) -> Counter[LineageRow]:
        """Each live row of ``snapshot_id`` (None: the current state) with its row lineage.

        Counts ``(canonical row, _row_id, _last_updated_sequence_number)`` as Iceberg Java reads
        them (see the module docstring). Raises ``ValueError`` for a table below format v3 or a
        read made with ``lineage=False``, ``KeyError`` for a snapshot whose rows were not read.
        """
        read = self.read(snapshot_id)
        if read.lineage is None:
            what = "the current table state" if snapshot_id is None else f"snapshot {snapshot_id}"
            why = (
                f"format v{self.format_version} has no row lineage"
                if self.format_version < 3
                else "the read was made with lineage=False"
            )
            raise ValueError(f"Java read no row lineage of {what}: {why}")
        return read.lineage

    def live_files(self, snapshot_id: int | None = None) -> Counter[str]:
        """Live files of ``snapshot_id`` (default: the current one) by kind, from its manifests."""
        snapshot_id = self.current_snapshot_id if snapshot_id is None else snapshot_id
        if snapshot_id is None:
            return Counter()
        by_path = {m.path: m for m in self.manifests}
        counts: Counter[str] = Counter()
        for path in self.snapshots[snapshot_id].manifests:
            counts.update(by_path[path].live_files)
        return counts

    def rows(self, snapshot_id: int | None = None) -> Counter[str]:
        """Canonical rows of ``snapshot_id``, or of the current table state for None."""
        return self.read(snapshot_id).rows

    def read(self, snapshot_id: int | None = None) -> RowsRead:
        """Columns and rows of ``snapshot_id``, or of the current table state for None."""
        if snapshot_id is None:
            return self.current
        read = self.snapshots[snapshot_id].read if snapshot_id in self.snapshots else None
        if read is None:
            raise KeyError(f"Java read no rows of snapshot {snapshot_id}")
        return read


def _rows(doc: dict[str, Any]) -> RowsRead | None:
    if "rows" not in doc:
        return None
    rows = Counter(doc["rows"])
    assert rows.total() == doc["row_count"]
    lineage: Counter[LineageRow] | None = None
    if "lineage" in doc:
        assert len(doc["lineage"]) == len(doc["rows"])
        lineage = Counter(
            (row, row_id, sequence)
            for row, (row_id, sequence) in zip(doc["rows"], doc["lineage"], strict=True)
        )
    return RowsRead(tuple(doc["columns"]), rows, lineage)


def parse_java_output(metadata_location: str, text: str) -> JavaRead:
    """The reader's JSON document as a :class:`JavaRead`."""
    return _java_read(metadata_location, json.loads(text))


def _java_read(metadata_location: str, doc: dict[str, Any]) -> JavaRead:
    snapshots = {
        int(key): SnapshotRead(
            snapshot_id=int(key),
            parent_id=value["parent_id"],
            schema_id=value["schema_id"],
            manifest_list=value["manifest_list"],
            manifests=tuple(value["manifests"]),
            read=_rows(value),
            sequence_number=value.get("sequence_number"),
        )
        for key, value in doc["snapshots"].items()
    }
    refs = {
        name: RefRead(name, value["type"], value["snapshot_id"], _rows(value))
        for name, value in doc["refs"].items()
    }
    manifests = tuple(
        ManifestRead(
            path=m["path"],
            content=m["content"],
            spec_id=m["spec_id"],
            added=m["added"],
            existing=m["existing"],
            deleted=m["deleted"],
            snapshots=tuple(m["snapshots"]),
            live_files=dict(m.get("live_files", {})),
        )
        for m in doc["manifests"]
    )
    return JavaRead(
        metadata_location=metadata_location,
        format_version=doc["format_version"],
        current_snapshot_id=doc["current_snapshot_id"],
        current=_rows(doc["current"]),
        snapshots=snapshots,
        refs=refs,
        manifests=manifests,
        next_row_id=doc.get("next_row_id"),
    )


def _server_environment() -> dict[str, str]:
    """This process's environment, with loopback in NO_PROXY and no EC2 metadata look-ups.

    The server lives for the session: whatever credentials and endpoint a read needs come with
    its request, never from this environment (S3 settings not in a request fall back to the AWS
    SDK's defaults).
    """
    env = dict(os.environ)
    for name in ("NO_PROXY", "no_proxy"):
        hosts = [h for h in env.get(name, "").split(",") if h.strip()]
        env[name] = ",".join([*hosts, *(h for h in LOOPBACK_HOSTS if h not in hosts)])
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    return env


class _Server:
    """The running ``IcebergReadCheck --serve`` process of this Python process."""

    def __init__(self, reader: JavaReader) -> None:
        # The server's stderr, for when it dies: an unlinked file, so nothing is left behind.
        fd, log = tempfile.mkstemp(prefix="compactor-java-reader-", suffix=".log")
        os.unlink(log)
        self._log_fd = fd
        self.classpath = reader.classpath
        self.owner = os.getpid()
        try:
            self.process = subprocess.Popen(
                reader.server_command(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=fd,
                env=_server_environment(),
            )
        except BaseException:
            os.close(fd)
            raise
        self._buffer = bytearray()

    def alive(self) -> bool:
        return self.process.poll() is None

    def stderr_tail(self, limit: int = 20_000) -> str:
        try:
            size = os.fstat(self._log_fd).st_size
            return os.pread(self._log_fd, limit, max(0, size - limit)).decode(errors="replace")
        except OSError:
            return ""

    def send(self, line: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + b"\n")
        self.process.stdin.flush()

    def receive(self, timeout_s: float) -> bytes | None:
        """The next answer line, or None when the server closed stdout (it died)."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        scanned = 0
        while (newline := self._buffer.find(b"\n", scanned)) < 0:
            scanned = len(self._buffer)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return None
                self._buffer += chunk
        line = bytes(self._buffer[:newline])
        del self._buffer[: newline + 1]
        return line

    def stop(self) -> None:
        """Close stdin (the server exits at its end), wait, kill if it hangs."""
        if self.owner != os.getpid():
            return
        try:
            if self.process.stdin is not None:
                with contextlib.suppress(OSError):
                    self.process.stdin.close()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            if self.process.stdout is not None:
                self.process.stdout.close()
        finally:
            with contextlib.suppress(OSError):
                os.close(self._log_fd)


_server_lock = threading.Lock()
_server: _Server | None = None


def _forget_server_in_child() -> None:
    # A forked child must not talk to (or stop) its parent's server: dropping the object closes
    # the child's copies of the pipes; the child starts a server of its own if it reads.
    global _server, _server_lock
    _server_lock = threading.Lock()
    _server = None


os.register_at_fork(after_in_child=_forget_server_in_child)


def stop_reader() -> None:
    """Stop this process's reader server, if one runs (the next read starts a new one)."""
    global _server
    with _server_lock:
        server, _server = _server, None
        if server is not None:
            server.stop()


atexit.register(stop_reader)


def reader_pid() -> int | None:
    """The process id of the running reader server, if any."""
    with _server_lock:
        return _server.process.pid if _server is not None and _server.alive() else None


def _running_server(reader: JavaReader) -> _Server:
    global _server
    if _server is not None and (not _server.alive() or _server.classpath != reader.classpath):
        old, _server = _server, None
        old.stop()
    if _server is None:
        _server = _Server(reader)
    return _server


def java_io_properties(properties: Mapping[str, Any]) -> dict[str, str]:
    """Iceberg Java's S3FileIO properties for pyiceberg FileIO ``properties``.

    ``s3.endpoint``, ``s3.access-key-id``, ``s3.secret-access-key``, ``s3.session-token`` keep
    their names (pyiceberg's ``client.*`` forms are the fall-backs), ``s3.region`` (or
    ``client.region``) becomes ``client.region``; ``s3.path-style-access`` is true unless
    pyiceberg was told ``s3.force-virtual-addressing`` (pyiceberg addresses paths by default, and
    a local S3 such as moto needs it). Nothing S3 given: an empty dict.
    """
    mapped: dict[str, str] = {}
    for java_name, names in S3_PROPERTY_MAP:
        value = next((properties[n] for n in names if properties.get(n) not in (None, "")), None)
        if value is not None:
            mapped[java_name] = str(value)
    if mapped:
        virtual = str(properties.get("s3.force-virtual-addressing", "")).strip().lower()
        mapped["s3.path-style-access"] = "false" if virtual in ("true", "1", "yes") else "true"
    return mapped


def redact(text: str, io_properties: Mapping[str, str]) -> str:
    """``text`` with every credential value of ``io_properties`` (Java's names) replaced."""
    for name in SECRET_PROPERTIES:
        value = io_properties.get(name)
        if value:
            text = text.replace(value, f"<redacted {name}>")
    return text


def java_read_location(
    metadata_location: str,
    snapshot_ids: Iterable[int] | None = None,
    io_properties: Mapping[str, Any] | None = None,
    lineage: bool | None = None,
) -> JavaRead:
    """Read one metadata.json with the session's Java reader.

    ``metadata_location`` is a ``file://`` URI or local path, or an ``s3://`` (``s3a://``,
    ``s3n://``) location read with S3FileIO as configured by ``io_properties``: pyiceberg FileIO
    properties (see :func:`java_io_properties`; default: the AWS SDK's own configuration).
    Every manifest list and manifest is read; rows are read for the current state and for
    ``snapshot_ids`` (default: every snapshot; an empty list: none) and the refs pointing at them.
    ``lineage``: read the row lineage of the current state and of those snapshots (see
    :meth:`JavaRead.lineage`); None (default) reads it for format v3 tables only.
    """
    global _server
    reader = ensure_reader()
    io = java_io_properties(io_properties or {})
    request = json.dumps(
        {
            "metadata_location": metadata_location,
            "snapshot_ids": None if snapshot_ids is None else [int(i) for i in snapshot_ids],
            "io": io,
            "lineage": lineage,
        }
    ).encode()
    with _server_lock:
        # A server found dead (killed between reads, or dying as this read starts) is started
        # again and the read sent once more; dying on that second try is this read's error.
        for attempt in (1, 2):
            server = _running_server(reader)
            try:
                server.send(request)
                line = server.receive(READ_TIMEOUT_S)
            except TimeoutError as e:
                _server = None
                server.process.kill()
                server.stop()
                raise JavaReadError(f"Java reader timed out after {READ_TIMEOUT_S}s", "", -1) from e
            except OSError:  # BrokenPipeError: it is gone
                line = None
            if line is not None:
                break
            _server = None
            returncode = server.process.wait()
            stderr = server.stderr_tail()
            server.stop()
            if attempt == 2:
                stderr = redact(stderr, io)
                last = next((x for x in reversed(stderr.splitlines()) if x.strip()), "")
                raise JavaReadError(
                    f"the Java reader died (exit {returncode}) reading {metadata_location}: {last}",
                    stderr,
                    returncode if returncode != 0 else -1,
                )
    assert line is not None
    answer = json.loads(line)
    if not answer["ok"]:
        stderr = redact(answer["error"], io)  # the reader redacts too
        first = next((x for x in stderr.splitlines() if x.strip()), "")
        raise JavaReadError(
            f"Iceberg Java failed to read {metadata_location} (exit 1): {first}", stderr, 1
        )
    return _java_read(metadata_location, answer["result"])


def java_read(
    table: Table, snapshot_ids: Iterable[int] | None = None, lineage: bool | None = None
) -> JavaRead:
    """Run the Java reader on ``table``'s current metadata.json (see :func:`java_read_location`).

    S3 settings come from the table's FileIO properties (``table.io.properties``).
    """
    return java_read_location(table.metadata_location, snapshot_ids, table.io.properties, lineage)


# --------------------------------------------------------------------------------------------
# The canonical row form (must match IcebergReadCheck.canon)
# --------------------------------------------------------------------------------------------


def _float(value: float) -> str:
    if math.isnan(value):
        return '"NaN"'
    if math.isinf(value):
        return '"Infinity"' if value > 0 else '"-Infinity"'
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    # The fewest significant digits, correctly rounded, that read back as the same double. No
    # string shorter than repr's (the shortest that reads back) does, so the search starts there.
    text = f"{value:.16e}"
    for digits in range(_significant_digits(repr(value)), 17):
        if float(shorter := f"{value:.{digits - 1}e}") == value:
            text = shorter
            break
    return format(Decimal(text).normalize(), "f")


def _significant_digits(text: str) -> int:
    """How many significant digits a float's repr (``1.25e-07``, ``1250.0``, ``-0.5``) has."""
    mantissa = text.partition("e")[0].lstrip("-").replace(".", "").strip("0")
    return max(len(mantissa), 1)


def _time(value: dt.time) -> str:
    return f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}.{value.microsecond:06d}"


def canonical_value(field_type: IcebergType, value: Any) -> str:
    """One value (as pyarrow's ``to_pylist`` gives it) in the canonical text form.

    JSON without spaces; strings as ``json.dumps``; floats as the shortest plain decimal that
    reads back as the same double, NaN/Infinity/-Infinity as strings; decimals as plain strings
    at their scale; binary, fixed as lowercase hex; uuid, date as strings; time and timestamps
    with 6 fraction digits (timestamptz in UTC, "+00:00"); structs as objects in field order,
    lists as arrays, maps as arrays of [key, value] pairs sorted by their text.
    """
    if value is None:
        return "null"
    match field_type:
        case BooleanType():
            return "true" if value else "false"
        case IntegerType() | LongType():
            return str(int(value))
        case FloatType() | DoubleType():
            return _float(float(value))
        case DecimalType():
            return json.dumps(format(value, "f"))
        case StringType():
            return json.dumps(value)
        case UUIDType():
            return json.dumps(
                str(value if isinstance(value, uuid.UUID) else uuid.UUID(bytes=value))
            )
        case BinaryType() | FixedType():
            return json.dumps(bytes(value).hex())
        case DateType():
            return json.dumps(value.isoformat())
        case TimeType():
            return json.dumps(_time(value))
        case TimestampType():
            return json.dumps(f"{value.date().isoformat()}T{_time(value.time())}")
        case TimestamptzType():
            utc = value.astimezone(dt.UTC)
            return json.dumps(f"{utc.date().isoformat()}T{_time(utc.time())}+00:00")
        case StructType():
            parts = (
                f"{json.dumps(f.name)}:{canonical_value(f.field_type, value.get(f.name))}"
                for f in field_type.fields
            )
            return "{" + ",".join(parts) + "}"
        case ListType():
            return "[" + ",".join(canonical_value(field_type.element_type, v) for v in value) + "]"
        case MapType():
            items = value.items() if isinstance(value, Mapping) else value
            pairs = sorted(
                f"[{canonical_value(field_type.key_type, k)},"
                f"{canonical_value(field_type.value_type, v)}]"
                for k, v in items
            )
            return "[" + ",".join(pairs) + "]"
        case UnknownType():
            return "null"
    raise UnsupportedCanonicalType(
        f"the Java/Python canonical row form does not support {field_type}"
    )


def _canonical_column(field_type: IcebergType, values: list[Any]) -> list[str]:
    """:func:`canonical_value` of each value of one column, the type dispatched once."""
    match field_type:
        case IntegerType() | LongType():
            convert: Any = str
        case FloatType() | DoubleType():
            convert = _float
        case StringType():
            convert = encode_basestring_ascii  # what json.dumps does with a str
        case _:
            return [canonical_value(field_type, v) for v in values]
    return ["null" if v is None else convert(v) for v in values]


def canonical_rows(data: pa.Table, schema: Schema) -> Counter[str]:
    """Every row of ``data`` in the canonical form, columns in ``schema``'s order, counted."""
    fields = schema.fields
    names = [f.name for f in fields]
    if sorted(data.column_names) != sorted(names):
        raise AssertionError(f"columns {data.column_names} are not the schema's {names}")
    columns = [_canonical_column(f.field_type, data.column(f.name).to_pylist()) for f in fields]
    if not columns:
        return Counter({"[]": data.num_rows}) if data.num_rows else Counter()
    return Counter("[" + ",".join(parts) + "]" for parts in zip(*columns, strict=True))


# --------------------------------------------------------------------------------------------
# Comparing with pyiceberg
# --------------------------------------------------------------------------------------------


def _diff(java: Counter[str], python: Counter[str], limit: int = 5) -> str:
    missing = list((python - java).items())[:limit]
    extra = list((java - python).items())[:limit]
    return (
        f"Java read {java.total()} rows, Python {python.total()}; "
        f"only Python (row, count): {missing}; only Java: {extra}"
    )


def _python_rows(
    table: Table,
    snapshot_id: int | None,
    schema: Schema,
    expected: Mapping[int | None, pa.Table | None],
) -> Counter[str] | None:
    key: int | None = snapshot_id
    if key is None and None not in expected:
        key = table.metadata.current_snapshot_id  # the current state defaults to its snapshot
    if key in expected:
        data = expected[key]
        return None if data is None else canonical_rows(data, schema)
    what = "the current table state" if snapshot_id is None else f"snapshot {snapshot_id}"
    try:
        scan = table.scan() if snapshot_id is None else table.scan(snapshot_id=snapshot_id)
        data = scan.to_arrow()
    except Exception as e:  # e.g. pyiceberg 0.12 cannot apply equality deletes
        raise AssertionError(
            f"pyiceberg cannot read {what} ({type(e).__name__}: {e}); "
            f"pass its rows as expected={{{snapshot_id}: pa.Table}}"
        ) from e
    return canonical_rows(data, schema)


def assert_java_reads_same(
    table: Table,
    expected: Mapping[int | None, pa.Table | None] | None = None,
    snapshot_ids: Iterable[int] | None = None,
) -> JavaRead:
    """Iceberg Java reads the same rows as pyiceberg for the current state and every snapshot.

    ``expected`` replaces pyiceberg's scan where it cannot be trusted or cannot read (equality
    deletes): keys are snapshot ids, or None for the current table state (which otherwise falls
    back to the current snapshot's entry); a value of None means "Java must read it without
    failing, rows not compared". Also checks Java sees the same snapshots, current snapshot and
    refs as pyiceberg, and that each ref reads the same rows as its snapshot when their columns
    agree (a branch is read in the current schema, a snapshot in its own). ``snapshot_ids``
    limits the row comparison to those snapshots (and the current state); every manifest is
    read whatever it says. Returns the read.
    """
    expected = expected or {}
    metadata = table.metadata
    chosen = None if snapshot_ids is None else sorted(set(snapshot_ids))
    java = java_read(table, chosen)
    assert java.current_snapshot_id == metadata.current_snapshot_id, (
        f"Java's current snapshot {java.current_snapshot_id}, "
        f"pyiceberg's {metadata.current_snapshot_id}"
    )
    python_ids = [s.snapshot_id for s in metadata.snapshots]
    assert sorted(java.snapshot_ids) == sorted(python_ids), (
        f"Java read snapshots {java.snapshot_ids}, the metadata has {python_ids}"
    )
    java_refs = {name: ref.snapshot_id for name, ref in java.refs.items()}
    python_refs = {name: ref.snapshot_id for name, ref in metadata.refs.items()}
    assert java_refs == python_refs, f"Java's refs {java_refs}, pyiceberg's {python_refs}"
    unknown = set(expected) - {None, *python_ids}
    assert not unknown, f"expected rows for snapshots not in the table: {sorted(unknown)}"

    python_reads: dict[tuple[int | None, int], Counter[str] | None] = {}
    for snapshot_id in [None, *(python_ids if chosen is None else chosen)]:
        if snapshot_id is None:
            schema = table.schema()
        else:
            snapshot = metadata.snapshot_by_id(snapshot_id)
            assert snapshot is not None
            schema_id = snapshot.schema_id
            found = None if schema_id is None else metadata.schema_by_id(schema_id)
            schema = found or table.schema()
        read = java.read(snapshot_id)
        names = tuple(f.name for f in schema.fields)
        what = "current table state" if snapshot_id is None else f"snapshot {snapshot_id}"
        assert read.columns == names, f"{what}: Java's columns {read.columns}, pyiceberg's {names}"
        # The current state is the current snapshot's: pyiceberg's rows are read once for both.
        current = snapshot_id is None and None not in expected
        memo = (metadata.current_snapshot_id if current else snapshot_id, schema.schema_id)
        if memo not in python_reads:
            python_reads[memo] = _python_rows(table, snapshot_id, schema, expected)
        python = python_reads[memo]
        if python is not None and read.rows != python:
            raise AssertionError(f"{what}: rows differ: {_diff(read.rows, python)}")

    for name, ref in java.refs.items():
        snapshot_read = java.snapshots[ref.snapshot_id].read
        if ref.read is None or snapshot_read is None:
            continue
        if ref.read.columns == snapshot_read.columns and ref.read.rows != snapshot_read.rows:
            raise AssertionError(
                f"ref {name}: rows differ from its snapshot {ref.snapshot_id}: "
                f"{_diff(ref.read.rows, snapshot_read.rows)}"
            )
    return java
