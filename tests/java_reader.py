"""An independent reader: Apache Iceberg's Java library reads a table and reports what it sees.

The Maven project in ``tests/java`` (``compactor.readcheck.IcebergReadCheck``) opens a table
from its metadata.json, reads the live rows of the current state, of every snapshot still in the
metadata and of every branch and tag with ``IcebergGenerics`` (Java's own position delete,
equality delete and deletion vector semantics), reads every manifest list and every entry of
every manifest in full, and prints JSON. :func:`assert_java_reads_same` compares that with
pyiceberg's scans of the same snapshots.

The reader is built once per source version (hash of ``pom.xml`` and ``src/``) into
``~/.cache/compactor-tests/java-reader/<hash>/`` (``COMPACTOR_TEST_CACHE`` moves the root) under
a file lock, so parallel pytest workers and later sessions reuse it. Maven's local repository
(``~/.m2``) caches the dependencies; the first build needs Maven Central. A failed build raises
:class:`JavaReaderBuildError`: tests using the reader error out, they are never skipped.

Rows are compared as multisets of canonical strings, one per row: a JSON array of the top-level
values, written identically by both sides (see :func:`canonical_value`). Supported Iceberg types:
boolean, int, long, float, double (NaN, infinities and -0 kept apart), decimal, string, uuid,
binary, fixed, date, time, timestamp, timestamptz, struct, list, map, and null values of any of
them. timestamp_ns, timestamptz_ns, variant, geometry and geography raise
:class:`UnsupportedCanonicalType`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import math
import os
import shutil
import subprocess
import threading
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
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
# Short-lived JVM: C1 only and the serial collector start faster on two cores.
JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


class JavaReaderBuildError(RuntimeError):
    """The Java reader could not be built (no Maven Central and no cache, or a compile error)."""


class JavaReadError(AssertionError):
    """Iceberg's Java library failed to read the table; ``stderr`` holds the exception."""

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
        """The command line that reads the table at ``metadata_location``."""
        return [self.java, *JVM_OPTIONS, "-cp", self.classpath, MAIN_CLASS, metadata_location]


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
def _file_lock(path: Path) -> Iterator[None]:
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
            with _file_lock(build_dir.with_name(f"{build_dir.name}.lock")):
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


@dataclass(frozen=True)
class RowsRead:
    """The rows one Java read returned: column names and canonical rows, counted."""

    columns: tuple[str, ...]
    rows: Counter[str]

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

    @property
    def snapshot_ids(self) -> list[int]:
        return list(self.snapshots)

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
    return RowsRead(tuple(doc["columns"]), rows)


def parse_java_output(metadata_location: str, text: str) -> JavaRead:
    """The reader's JSON document as a :class:`JavaRead`."""
    doc = json.loads(text)
    snapshots = {
        int(key): SnapshotRead(
            snapshot_id=int(key),
            parent_id=value["parent_id"],
            schema_id=value["schema_id"],
            manifest_list=value["manifest_list"],
            manifests=tuple(value["manifests"]),
            read=_rows(value),
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
    )


def java_read_location(
    metadata_location: str, snapshot_ids: Iterable[int] | None = None
) -> JavaRead:
    """Run the Java reader on one metadata.json (``file://`` URI or local path).

    Every manifest list and manifest is read; rows are read for the current state and for
    ``snapshot_ids`` (default: every snapshot) and the refs pointing at them.
    """
    reader = ensure_reader()
    selected = [str(i) for i in snapshot_ids] if snapshot_ids is not None else []
    try:
        done = subprocess.run(
            [*reader.command(metadata_location), *selected],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=READ_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise JavaReadError(f"Java reader timed out after {READ_TIMEOUT_S}s", "", -1) from e
    stderr = done.stderr.decode(errors="replace")
    if done.returncode != 0:
        first = next((line for line in stderr.splitlines() if line.strip()), "")
        raise JavaReadError(
            f"Iceberg Java failed to read {metadata_location} (exit {done.returncode}): {first}",
            stderr,
            done.returncode,
        )
    return parse_java_output(metadata_location, done.stdout.decode())


def java_read(table: Table, snapshot_ids: Iterable[int] | None = None) -> JavaRead:
    """Run the Java reader on ``table``'s current metadata.json (see :func:`java_read_location`)."""
    return java_read_location(table.metadata_location, snapshot_ids)


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
    # The fewest significant digits, correctly rounded, that read back as the same double.
    text = f"{value:.16e}"
    for digits in range(1, 17):
        if float(shorter := f"{value:.{digits - 1}e}") == value:
            text = shorter
            break
    return format(Decimal(text).normalize(), "f")


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


def canonical_rows(data: pa.Table, schema: Schema) -> Counter[str]:
    """Every row of ``data`` in the canonical form, columns in ``schema``'s order, counted."""
    fields = schema.fields
    names = [f.name for f in fields]
    if sorted(data.column_names) != sorted(names):
        raise AssertionError(f"columns {data.column_names} are not the schema's {names}")
    rows: Counter[str] = Counter()
    for row in data.select(names).to_pylist():
        rows["[" + ",".join(canonical_value(f.field_type, row[f.name]) for f in fields) + "]"] += 1
    return rows


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
        python = _python_rows(table, snapshot_id, schema, expected)
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
