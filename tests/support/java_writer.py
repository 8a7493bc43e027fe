"""An independent writer: Apache Iceberg's Java library writes change-data-capture tables.

``compactor.cdcwriter.CdcTableWriter`` (in the Maven project ``tests/support/java``, built and
cached with the Java reader, see java_reader.py) writes a small table with Iceberg Java 1.11's own writers
(``GenericFileWriterFactory``, ``BaseDVFileWriter``, ``RowDelta`` commits) at a local location,
with HadoopTables-style metadata (``metadata/vN.metadata.json``, ``metadata/version-hint.text``)
and ``file://`` paths, no catalog. Register it with ``catalog.register_table(("db", "t"),
write_cdc_table(...))``. One JVM runs per table (a few seconds).

The writer keeps its own in-memory model of the live rows (key ``id`` -> row) as it commits and
writes it, in java_reader's canonical row form, next to the table: :func:`read_expected`. Compare
it with what the Java reader reads (pyiceberg 0.12 cannot apply equality deletes). Rows, keys,
file names and snapshot ids depend only on ``seed``; timestamps and the table uuid do not.

Every scenario has the schema ``id long (required, the key), region string (required), name
string, amount double, qty int (nullable), day date``; values are random per version of a row.

``upsert``
    Format v2, identity(region) over 4 regions; the region is fixed by the key (``id % 4``), so a
    key lives in one partition, as Flink requires of upsert keys. 30 commits like Flink's upsert
    sink: every upsert is an equality delete of ``id`` (key-only delete schema, one delete file
    per partition per commit) plus the new row in the same commit; a key upserted twice in one
    commit has its first row deleted by a position delete instead (Flink's
    BaseEqualityDeltaWriter), so some commits also add position-delete files. Commit 0 inserts
    160 keys; every 5th commit (3, 8, ...) only deletes; commits 4, 9, ... re-insert deleted
    keys; the others upsert live keys, add new ones, re-insert a few and delete a few.
    ~100 data, ~120 equality-delete and ~30 position-delete files.
``merge-on-read``
    Format v2, identity(region) over 3 regions, like Spark merge-on-read: 4 append commits of one
    data file per region, then 6 commits of position deletes; even ones write one delete file
    per partition referencing several data files, odd ones one delete file per data file and are
    UPDATEs: half of the deleted rows come back with new values in new data files of the same
    commit. Some data files get deletes from several commits. No equality deletes.
``dv``
    Format v3, identity(region) over 3 regions: 3 append commits, then 6 commits of deletion
    vectors (Puffin ``deletion-vector-v1`` blobs from ``BaseDVFileWriter``, one Puffin file per
    commit holding a DV per data file touched). A data file that already has a DV gets a new one
    merging the old positions, and the commit removes the old DV (at most one DV per data file, as
    v3 requires). Every third DV commit also re-adds a third of its deleted rows (an UPDATE).
``void-spec``
    Format v2: identity(region) over 4 regions (key-determined), 4 upsert commits as in
    ``upsert``; then the partition spec is replaced by one whose field (same field id 1000, same
    name) has the ``void`` transform, as Iceberg does for removed fields in v1 (Iceberg Java's
    ``UpdatePartitionSpec.removeField`` drops the field from a v2 spec instead, so the spec is
    built with ``PartitionSpec.Builder.alwaysNull`` and committed with
    ``TableMetadata.updatePartitionSpec``). Then a delete-only commit of 40 keys and 4 upsert
    commits under the void spec: those equality deletes are global (spec 1 is unpartitioned)
    and must delete rows of the old spec's partitioned data files.
``schema-change``
    Format v2, unpartitioned: 4 upsert commits; then ``name`` is renamed ``title`` and an optional
    ``note string`` is added; then a delete-only commit of 40 keys and 4 upsert commits (new rows
    have ``note``). The equality key stays ``id`` (field id 1); rows of the old files read
    ``note`` as null.
``v2-to-v3``
    Format v2, identity(region) over 3 regions, like ``merge-on-read``: 3 append commits of one
    data file per region (60 rows each), a commit of partition-scoped position deletes (one file
    per region, referencing several data files), then an UPDATE of keys of the first two appends
    with file-scoped position deletes (one file per data file) and the new rows in new data
    files. Then the table is upgraded to format v3 as Spark's ``ALTER TABLE ... SET TBLPROPERTIES
    ('format-version' = '3')`` does (``updateProperties().set("format-version", "3")``: a new
    metadata.json, no snapshot). Nothing written before carries ``first_row_id``, and
    ``next-row-id`` starts at 0. Then 2 v3 commits: an append (40 rows per region), whose manifest
    list assigns the old data manifests their ``first_row_id`` (Java numbers rows in manifest
    list order: the new manifest first, then the old ones newest first, every row of an old live
    data file whether deleted or not), and an UPDATE with deletion vectors (one Puffin file, as in
    ``dv``; a third of its deleted rows re-added): DVs for a data file with a file-scoped v2
    delete file (its positions are merged into the DV and the v2 file is removed, as
    ``BaseDVFileWriter`` reports it rewritten), for one with partition-scoped v2 deletes only
    (merged into the DV; the v2 file stays for its other data files: Java ignores position-delete
    files for a data file that has a DV) and for data files without earlier deletes. The other
    old data files keep their v2 deletes only, so both kinds apply in the current state.
    7 snapshots; ~16 data files, 9 position-delete files (8 live), ~5 DVs.
``v2-upgraded``
    Like the first 5 commits of ``v2-to-v3`` (not the same rows for the same seed), then
    upgraded to format v3 as the last operation: the current snapshot, its manifest list and
    manifests are v2's, without ``first_row_id``, ``next-row-id`` is 0, and Java reads a null
    ``_row_id`` and ``_last_updated_sequence_number`` for every row.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from support.java_reader import JVM_OPTIONS, ensure_reader

WRITER_CLASS = "compactor.cdcwriter.CdcTableWriter"
SCENARIOS = (
    "upsert",
    "merge-on-read",
    "dv",
    "void-spec",
    "schema-change",
    "v2-to-v3",
    "v2-upgraded",
)
WRITE_TIMEOUT_S = 600


class JavaWriteError(RuntimeError):
    """The Java writer failed; ``stderr`` holds its exception."""

    def __init__(self, message: str, stderr: str) -> None:
        super().__init__(message)
        self.stderr = stderr


@dataclass(frozen=True)
class ExpectedTable:
    """What the writer's own model says the table holds after its last commit."""

    scenario: str
    seed: int
    metadata_location: str
    format_version: int
    commits: int
    written: dict[str, int]  # files written by kind: data_files, equality_delete_files, ...
    columns: tuple[str, ...]
    by_key: dict[int, str]  # id -> canonical row (java_reader's form), in the current schema

    @property
    def rows(self) -> Counter[str]:
        """The live rows as java_reader's ``JavaRead.rows()`` counts them."""
        return Counter(self.by_key.values())


def expected_path(location: Path) -> Path:
    """Where the writer leaves its expected rows: a file next to (not in) the table location."""
    location = Path(location)
    return location.with_name(f"{location.name}.expected.json")


def write_cdc_table(scenario: str, location: Path, seed: int = 0) -> str:
    """Write ``scenario``'s table at ``location`` (a new or empty directory) with Iceberg Java.

    Returns the ``file://`` location of its final metadata.json; the expected rows are in
    :func:`read_expected`. Raises :class:`JavaWriteError` if Java fails.
    """
    return write_cdc_tables({scenario: location}, seed)[0]


def write_cdc_tables(tables: Mapping[str, Path], seed: int = 0) -> list[str]:
    """:func:`write_cdc_table` of each scenario at its location, all in one JVM."""
    reader = ensure_reader()
    command = [reader.java, *JVM_OPTIONS, "-cp", reader.classpath, WRITER_CLASS]
    for scenario, given in tables.items():
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}: one of {', '.join(SCENARIOS)}")
        location = Path(given).resolve()
        if location.exists() and any(location.iterdir()):
            raise ValueError(f"{location} is not empty")
        command += [scenario, location.as_uri(), str(seed), str(expected_path(location))]
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=WRITE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise JavaWriteError(f"the Java writer timed out after {WRITE_TIMEOUT_S}s", "") from e
    if done.returncode != 0:
        first = next((x for x in done.stderr.splitlines() if x.strip()), "")
        raise JavaWriteError(
            f"Iceberg Java failed to write {', '.join(tables)} at "
            f"{', '.join(str(p) for p in tables.values())} (exit {done.returncode}): {first}",
            done.stderr,
        )
    return done.stdout.strip().splitlines()[-len(tables) :]


def read_expected(location: Path) -> ExpectedTable:
    """The live rows and file counts the writer expects of the table it wrote at ``location``."""
    doc = json.loads(expected_path(Path(location).resolve()).read_text())
    return ExpectedTable(
        scenario=doc["scenario"],
        seed=doc["seed"],
        metadata_location=doc["metadata_location"],
        format_version=doc["format_version"],
        commits=doc["commits"],
        written=dict(doc["written"]),
        columns=tuple(doc["columns"]),
        by_key={int(k): v for k, v in doc["rows"].items()},
    )
