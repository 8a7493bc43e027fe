"""Helpers for the compaction correctness suite.

Row comparison is by multiset of canonicalised rows (NaN-safe, nested-safe), never by counts.
pyiceberg 0.12 cannot write merge-on-read deletes, so :func:`commit_delete_files` commits
position and equality delete files with pyiceberg's low-level manifest/snapshot pieces.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from java_reader import assert_java_reads_same
from pyiceberg.catalog import Catalog
from pyiceberg.expressions import BooleanExpression
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    ManifestContent,
    ManifestEntry,
)
from pyiceberg.table import Table
from pyiceberg.table.snapshots import (
    Operation,
    Snapshot,
)
from pyiceberg.typedef import Record

from compactor import __version__
from compactor.compaction import RunResult, compact_table
from compactor.iceberg import delete_files
from compactor.iceberg.references import table_references
from compactor.iceberg.value_keys import PartitionKey, partition_key, value_key
from compactor.options import SNAPSHOT_PROPERTY_TOOL, resolve_options

# Small targets keep the suite fast; tests override single options where they need to.
DEFAULT_OPTIONS: dict[str, Any] = {
    "target_file_size": "1MiB",
    "allow_small_target": True,
    "min_input_files": 2,
    "parallelism": 2,
}


# --------------------------------------------------------------------------------------------
# Row comparison
# --------------------------------------------------------------------------------------------


def _canon(value: Any) -> Any:
    """A hashable, equality-faithful form of one value (NaN equals NaN, -0.0 is not 0.0, nested
    types flattened), as Iceberg Java compares values."""
    if isinstance(value, float):
        return ("float", "nan") if math.isnan(value) else ("float", value, math.copysign(1, value))
    if isinstance(value, dict):  # struct
        return ("struct", tuple((k, _canon(v)) for k, v in sorted(value.items())))
    if isinstance(value, list | tuple):  # list, or map as a list of (key, value) pairs
        return ("seq", tuple(_canon(v) for v in value))
    return value


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The unsigned variable-length integer at ``pos`` (Avro, Thrift's compact protocol) and
    the position after it."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def unzigzag(value: int) -> int:
    """A zigzag-encoded integer's value (Avro's int and long, Thrift's compact integers)."""
    return (value >> 1) ^ -(value & 1)


def row_multiset(data: pa.Table) -> Counter[tuple[Any, ...]]:
    """Every row of ``data`` as a canonical tuple, counted."""
    names = data.column_names
    return Counter(tuple(_canon(row[n]) for n in names) for row in data.to_pylist())


def assert_same_rows(before: pa.Table, after: pa.Table) -> None:
    """The two tables hold exactly the same multiset of rows, under the same schema."""
    assert after.schema.equals(before.schema), (
        f"schema changed:\n{before.schema}\n!=\n{after.schema}"
    )
    assert after.num_rows == before.num_rows, (
        f"{before.num_rows} rows before, {after.num_rows} after"
    )
    b, a = row_multiset(before), row_multiset(after)
    if a != b:
        missing = list((b - a).items())[:5]
        extra = list((a - b).items())[:5]
        raise AssertionError(f"rows differ: missing {missing} ... extra {extra} ...")


def scan_rows(table: Table, row_filter: str | BooleanExpression | None = None) -> pa.Table:
    """Everything the current snapshot returns (after deletes), optionally filtered."""
    if row_filter is None:
        return table.scan().to_arrow()
    return table.scan(row_filter=row_filter).to_arrow()


# --------------------------------------------------------------------------------------------
# Snapshot and file inspection
# --------------------------------------------------------------------------------------------


def live_entries(table: Table, snapshot: Snapshot | None = None) -> list[ManifestEntry]:
    """Live (added or existing) manifest entries of ``snapshot`` (default: current)."""
    snapshot = snapshot or table.current_snapshot()
    if snapshot is None:
        return []
    return [
        entry
        for manifest in snapshot.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
    ]


def snapshot_entries(table: Table, snapshot: Snapshot | None = None) -> list[ManifestEntry]:
    """Every manifest entry of ``snapshot`` (default: current), DELETED ones included."""
    snapshot = snapshot or table.current_snapshot()
    assert snapshot is not None
    return [
        entry
        for manifest in snapshot.manifests(table.io)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False)
    ]


def live_data_files(table: Table, snapshot: Snapshot | None = None) -> dict[str, DataFile]:
    """Path -> DataFile of every live data file."""
    return {
        e.data_file.file_path: e.data_file
        for e in live_entries(table, snapshot)
        if e.data_file.content == DataFileContent.DATA
    }


def live_delete_files(table: Table, snapshot: Snapshot | None = None) -> dict[str, DataFile]:
    """Path -> DataFile of every live position or equality delete file."""
    return {
        e.data_file.file_path: e.data_file
        for e in live_entries(table, snapshot)
        if e.data_file.content != DataFileContent.DATA
    }


def records_by_partition(table: Table) -> Counter[tuple[int, PartitionKey]]:
    """(spec id, partition key) -> records in live data files (as the manifests record them)."""
    counts: Counter[tuple[int, PartitionKey]] = Counter()
    for data_file in live_data_files(table).values():
        counts[(data_file.spec_id, partition_key(data_file.partition))] += data_file.record_count
    return counts


def files_by_partition(table: Table) -> Counter[tuple[int, PartitionKey]]:
    """(spec id, partition key) -> number of live data files."""
    return Counter((f.spec_id, partition_key(f.partition)) for f in live_data_files(table).values())


def assert_manifests_consistent(table: Table) -> None:
    """Each manifest of the current snapshot tracks one content type, as the spec requires.

    Also checks the manifests' spec ids match their entries'.
    """
    snapshot = table.current_snapshot()
    assert snapshot is not None
    for manifest in snapshot.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
            is_data = entry.data_file.content == DataFileContent.DATA
            expected = ManifestContent.DATA if is_data else ManifestContent.DELETES
            assert manifest.content == expected, (
                f"{entry.data_file.content} file {entry.data_file.file_path} "
                f"is tracked by a {manifest.content} manifest {manifest.manifest_path}"
            )
            assert entry.data_file.spec_id == manifest.partition_spec_id


def local_path(uri: str) -> Path:
    """Local filesystem path of a ``file://`` URI (or of a plain path)."""
    return Path(uri.removeprefix("file://"))


def list_files(root: Path) -> dict[str, int]:
    """Relative path -> size of every file under ``root``, recursively."""
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def read_data_file(table: Table, data_file: DataFile) -> pa.Table:
    """One data file's contents as written (no schema projection)."""
    with table.io.new_input(data_file.file_path).open() as stream:
        return pq.read_table(stream)


def assert_rows_match_partition(table: Table, data_file: DataFile) -> None:
    """Every row of ``data_file`` transforms to the file's partition value under its spec."""
    spec = table.metadata.specs()[data_file.spec_id]
    schema = table.schema()
    contents = read_data_file(table, data_file)
    for position, field in enumerate(spec.fields):
        source = schema.find_field(field.source_id)
        column = contents.column(source.name).combine_chunks()
        if pa.types.is_large_binary(column.type):  # pyiceberg's truncate takes no large_binary
            column = column.cast(pa.binary())
        if str(field.transform) == "void":
            assert data_file.partition[position] is None
            continue
        transformed = field.transform.pyarrow_transform(source.field_type)(column)
        values = {value_key(v) for v in transformed.to_pylist()}
        assert values == {value_key(data_file.partition[position])}, (
            f"{data_file.file_path}: {field.name} values {values} "
            f"outside partition {data_file.partition}"
        )


# --------------------------------------------------------------------------------------------
# Running compaction
# --------------------------------------------------------------------------------------------


def run_compaction(
    catalog: Catalog,
    identifier: str,
    *,
    dry_run: bool = False,
    grown_before: frozenset[frozenset[str]] = frozenset(),
    **overrides: Any,
) -> tuple[RunResult, Table]:
    """Compact ``identifier`` with the suite's small defaults (overridable); reload the table."""
    table = catalog.load_table(identifier)
    opts = resolve_options(
        identifier, table.metadata.properties, **{**DEFAULT_OPTIONS, **overrides}
    )
    result = compact_table(table, opts, dry_run=dry_run, grown_before=grown_before)
    return result, catalog.load_table(identifier)


def compact_and_verify(
    catalog: Catalog, identifier: str, **overrides: Any
) -> tuple[RunResult, Table, pa.Table]:
    """Compact and check the invariants every successful run must keep.

    - the scan returns exactly the same multiset of rows;
    - exactly one new snapshot, a ``replace`` whose parent is the previous head, tagged with
      ``compactor.version``;
    - fewer live data files; per (spec, partition) record totals unchanged but for deletes;
    - every manifest tracks a single content type;
    - Iceberg's Java library reads every manifest, and the rows pyiceberg gets before and after.

    Returns the run result, the reloaded table and the rows scanned before compaction.
    """
    table = catalog.load_table(identifier)
    before_snapshot = table.current_snapshot()
    assert before_snapshot is not None
    before_rows = scan_rows(table)
    before_files = live_data_files(table)
    before_records = records_by_partition(table)
    before_snapshots = len(table.metadata.snapshots)

    result, table = run_compaction(catalog, identifier, **overrides)

    snapshot = table.current_snapshot()
    assert snapshot is not None
    summary = result.to_dict()
    assert summary["snapshot_id"] == snapshot.snapshot_id
    assert len(table.metadata.snapshots) == before_snapshots + 1
    assert snapshot.parent_snapshot_id == before_snapshot.snapshot_id
    assert snapshot.summary is not None
    assert snapshot.summary.operation == Operation.REPLACE
    assert snapshot.summary.additional_properties[SNAPSHOT_PROPERTY_TOOL] == __version__

    after_files = live_data_files(table)
    assert len(after_files) < len(before_files)
    assert summary["rewritten_files"] > 0
    assert summary["added_files"] > 0
    assert (
        len(after_files) == len(before_files) - summary["rewritten_files"] + summary["added_files"]
    )
    # Per partition, records only drop by the rows position deletes removed.
    expected_records = Counter(before_records)
    for group_result in result.committed:
        group = result.plan.group(group_result.task_id)
        expected_records[(group.spec_id, partition_key(group.partition))] -= (
            group_result.rows_deleted
        )
    assert records_by_partition(table) == +expected_records
    assert_manifests_consistent(table)
    assert_same_rows(before_rows, scan_rows(table))
    # The snapshot summary totals agree with the manifests.
    assert int(snapshot.summary.additional_properties["total-data-files"]) == len(after_files)
    assert int(snapshot.summary.additional_properties["total-records"]) == sum(
        f.record_count for f in after_files.values()
    )
    # An independent reader (Iceberg Java) reads every manifest and the same rows before and after.
    assert_java_reads_same(table, snapshot_ids=[snapshot.snapshot_id, before_snapshot.snapshot_id])
    return result, table, before_rows


def new_data_files(before: Table, after: Table) -> list[DataFile]:
    """Data files live in ``after`` that were not live in ``before``."""
    old = live_data_files(before)
    return [f for path, f in live_data_files(after).items() if path not in old]


# --------------------------------------------------------------------------------------------
# Merge-on-read deletes (pyiceberg 0.12 cannot write them)
# --------------------------------------------------------------------------------------------


# The spec's position delete schema (pyiceberg's POSITIONAL_DELETE_SCHEMA types ``pos`` as int).
def write_position_delete_file(
    table: Table, deletes: Mapping[DataFile, Iterable[int]], *, path_bounds: bool = True
) -> DataFile:
    """Write a Parquet position delete file deleting ``positions`` of each data file.

    All data files must share one spec and partition. With ``path_bounds`` the file carries
    ``file_path`` bounds (as Java writes them), otherwise it applies partition-wide by metrics.
    """
    files = list(deletes)
    assert files, "no data files given"
    spec_ids = {f.spec_id for f in files}
    partitions = {partition_key(f.partition) for f in files}
    assert len(spec_ids) == 1 and len(partitions) == 1, "delete file must cover one partition"
    rows = [(f.file_path, int(p)) for f in files for p in deletes[f]]
    data = pa.table({"file_path": [r[0] for r in rows], "pos": [r[1] for r in rows]})
    return delete_files.write_position_delete_file(
        table, data, spec_id=files[0].spec_id, partition=files[0].partition, path_bounds=path_bounds
    )


def write_equality_delete_file(
    table: Table,
    columns: Sequence[str],
    rows: Sequence[tuple[Any, ...]],
    *,
    spec_id: int,
    partition: Record,
) -> DataFile:
    """Write a Parquet equality delete file on ``columns`` (table column names)."""
    schema = table.schema().as_arrow()
    keys = pa.table(
        {
            name: pa.array([r[i] for r in rows], schema.field(name).type)
            for i, name in enumerate(columns)
        }
    )
    return delete_files.write_equality_delete_file(
        table, keys, spec_id=spec_id, partition=partition
    )


commit_delete_files = delete_files.commit_delete_files


def unreferenced_files(table: Table) -> list[str]:
    """Local paths of files under the table's location that no snapshot of ``table`` references.

    Table metadata files (``*.metadata.json``) are not snapshot files and are left out; so is a
    live run's record (``compactor-run.*.json``).
    """
    referenced = {str(local_path(uri)) for uri in table_references(table).all()}
    root = local_path(table.metadata.location)
    return sorted(
        str(path)
        for path in root.rglob("*")
        if path.is_file()
        and not path.name.endswith(".metadata.json")
        and not path.name.startswith("compactor-run.")
        and str(path) not in referenced
    )


# What a dry run reports it would delete, and a real run that it deleted.
WOULD_DELETE = ("would_delete", "would_delete_files", "would_delete_bytes", "would_delete_paths")
DELETED = ("deleted", "files_deleted", "bytes_deleted", "deleted_paths")


def assert_dry_run_predicts(dry: dict[str, Any], real: dict[str, Any]) -> None:
    """The dry run deleted nothing and would delete exactly what the real run deleted."""
    assert [dry[key] for key in DELETED] == [{}, 0, 0, []]
    assert [real[key] for key in WOULD_DELETE] == [{}, 0, 0, []]
    assert [dry[key] for key in WOULD_DELETE] == [real[key] for key in DELETED]


# --- the documented --json schemas -----------------------------------------------------------

JSON_OUTPUT_DOC = Path(__file__).resolve().parents[1] / "docs" / "json-output.md"


def documented_fields(command: str) -> dict[str, str]:
    """The fields docs/json-output.md lists for ``compactor COMMAND --json``: path -> type."""
    text = JSON_OUTPUT_DOC.read_text()
    section = re.search(
        rf"^## `compactor {re.escape(command)}`$(.*?)(?=^## |\Z)", text, re.M | re.S
    )
    assert section, f"docs/json-output.md has no section for compactor {command}"
    rows = re.finditer(r"^\| `([^`]+)` +\| ([^|]+?) +\|", section[1], re.M)
    return {row[1]: row[2] for row in rows}


def _has_type(value: Any, kind: str) -> bool:
    """Whether ``value`` is of the documented type ``kind``, e.g. ``list of string or null``."""
    if " or " in kind:
        return any(_has_type(value, option) for option in kind.split(" or "))
    outer, _, inner = kind.partition(" of ")
    if outer == "list":
        return isinstance(value, list) and all(_has_type(v, inner) for v in value)
    if outer == "map":
        return isinstance(value, dict) and all(_has_type(v, inner) for v in value.values())
    simple = {"null": type(None), "string": str, "integer": int, "boolean": bool, "record": dict}
    if outer == "number":
        return type(value) in (int, float)
    return type(value) is simple[outer]


def assert_documented(command: str, document: dict[str, Any]) -> None:
    """``document``, printed by ``compactor COMMAND --json``, has exactly the fields (nested
    ones as ``a.b`` and ``a[].b``) and the types docs/json-output.md lists for the command."""
    fields = documented_fields(command)
    seen, opened = set(), {""}

    def walk(record: dict[str, Any], prefix: str) -> None:
        for key, value in record.items():
            path = prefix + key
            assert path in fields, f"compactor {command} --json: {path} is not documented"
            assert _has_type(value, fields[path]), f"{path}: {value!r} is not {fields[path]}"
            seen.add(path)
            if fields[path].startswith("record") and isinstance(value, dict):
                opened.add(path)
                walk(value, path + ".")
            elif fields[path].startswith("list of record"):
                for item in value:
                    opened.add(path + "[]")
                    walk(item, path + "[].")

    walk(document, "")
    expected = {path for path in fields if re.sub(r"\.?[^.]+$", "", path) in opened}
    assert expected <= seen, f"compactor {command} --json lacks {sorted(expected - seen)}"
