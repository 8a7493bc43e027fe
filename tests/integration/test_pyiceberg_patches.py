"""compactor's four fixes to pyiceberg: applied by ``install()`` alone, and still needed.

The ``test_pyiceberg_still_*`` tests run pyiceberg as released, in a new interpreter where
nothing installed the fixes, and assert that it still has the problem a fix works around. When
one fails, the pyiceberg in use has solved that problem itself: remove the fix from
``compactor.iceberg.pyiceberg_compat.install`` and its tests from this module.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog import Catalog
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField

import compactor
from compactor.bench.sample import create_events_table
from compactor.errors import CompactorError
from compactor.iceberg import pyiceberg_compat
from compactor.planning.tasks import RewriteTask
from compactor.rewrite.task_runner import run_task

# pyiceberg's patched attributes, as a new interpreter finds them.
PATCHED = """
from pyiceberg.avro.reader import DoubleReader
from pyiceberg.io import pyarrow
from pyiceberg.table.metadata import TableMetadataV3

def patched():
    return [
        pyarrow._get_file_format.__module__,
        TableMetadataV3.model_dump_json.__module__,
        DoubleReader.read.__module__,
        pyarrow.ArrowProjectionVisitor.list.__module__,
        pyarrow.ArrowProjectionVisitor.map.__module__,
    ]
"""


def _run_python(code: str, *args: str) -> Any:
    """What ``code``, run by a new interpreter with ``args``, prints as JSON."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_importing_compactor_changes_nothing_in_pyiceberg_until_install() -> None:
    code = f"""{PATCHED}
import json
import compactor.api, compactor.cli.app, compactor.daemon.service, compactor.rewrite.task_runner
from compactor.iceberg import pyiceberg_compat

imported = patched()
pyiceberg_compat.install()
installed = patched()
pyiceberg_compat.install()
print(json.dumps([imported, installed, patched()]))
"""
    imported, installed, again = _run_python(code)

    assert imported == [
        "pyiceberg.io.pyarrow",
        "pyiceberg.table.metadata",
        "pyiceberg.avro.reader",
        "pyiceberg.io.pyarrow",
        "pyiceberg.io.pyarrow",
    ]
    assert installed == [pyiceberg_compat.__name__] * 5
    assert again == installed


def _damaged_checksummed_file(path: Path) -> pa.Table:
    """A Parquet file with page checksums, one bit flipped in a page that still decodes;
    returns the rows written."""
    rows = pa.table({"x": np.random.default_rng(3).random(2000)})
    pq.write_table(rows, path, compression="none", use_dictionary=False, write_page_checksum=True)
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(0)
    data = bytearray(path.read_bytes())
    data[chunk.data_page_offset + chunk.total_compressed_size // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return rows


# Adds the file to a new table of a new catalog and reads it back through pyiceberg's scan.
SCAN_ADDED_FILE = """
import json, sys
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog

path, workdir = sys.argv[1:]
catalog = SqlCatalog("scan", uri=f"sqlite:///{workdir}/catalog.db", warehouse=f"file://{workdir}")
catalog.create_namespace("db")
table = catalog.create_table("db.t", pq.read_schema(path))
table.add_files([path])
try:
    print(json.dumps({"x": table.scan().to_arrow().column("x").to_pylist()}))
except OSError as exc:
    print(json.dumps({"error": str(exc)}))
"""


def test_pyiceberg_still_reads_a_damaged_checksummed_page_as_other_values(tmp_path: Path) -> None:
    written = _damaged_checksummed_file(tmp_path / "damaged.parquet")

    read = _run_python(SCAN_ADDED_FILE, str(tmp_path / "damaged.parquet"), str(tmp_path))

    assert "error" not in read, (
        "pyiceberg now verifies Parquet page checksums itself: remove the page-checksum fix "
        f"from pyiceberg_compat.install() ({read['error']})"
    )
    assert len(read["x"]) == written.num_rows
    assert sorted(read["x"]) != sorted(written.column("x").to_pylist())


def test_once_installed_a_damaged_checksummed_page_is_an_error(
    catalog: Catalog, tmp_path: Path
) -> None:
    path = tmp_path / "damaged.parquet"
    _damaged_checksummed_file(path)
    table = catalog.create_table("db.t", pq.read_schema(path))
    table.add_files([str(path)])
    pyiceberg_compat.install()

    with pytest.raises(OSError, match="CRC checksum verification failed"):
        table.scan().to_arrow()


CREATE_V3_TABLE = """
import json, sys
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.types import LongType, NestedField

workdir = sys.argv[1]
catalog = SqlCatalog("v3", uri=f"sqlite:///{workdir}/catalog.db", warehouse=f"file://{workdir}")
catalog.create_namespace("db")
schema = Schema(NestedField(1, "id", LongType()))
try:
    catalog.create_table("db.t", schema, properties={"format-version": "3"})
except NotImplementedError as exc:
    print(json.dumps({"refused": str(exc)}))
else:
    print(json.dumps({"written": True}))
"""


def test_pyiceberg_still_refuses_to_write_v3_metadata(tmp_path: Path) -> None:
    outcome = _run_python(CREATE_V3_TABLE, str(tmp_path))

    assert "refused" in outcome, (
        "pyiceberg now writes v3 table metadata itself: remove the v3-metadata fix from "
        "pyiceberg_compat.install()"
    )


def test_once_installed_v3_metadata_is_written_and_reads_back_equal(catalog: Catalog) -> None:
    pyiceberg_compat.install()

    table = catalog.create_table(
        "db.t", Schema(NestedField(1, "id", LongType())), properties={"format-version": "3"}
    )

    assert table.metadata.format_version == 3
    assert catalog.load_table("db.t").metadata == table.metadata


ACTIONS = {
    "plan": lambda table: compactor.plan(table),
    "compact": lambda table: compactor.compact(table, dry_run=True),
    "expire_snapshots": lambda table: compactor.expire_snapshots(table, dry_run=True),
    "remove_orphans": lambda table: compactor.remove_orphans(table, dry_run=True),
    "rewrite_deletes": lambda table: compactor.rewrite_deletes(table, dry_run=True),
}


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_every_library_action_installs_the_fixes(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch, action: str
) -> None:
    table = create_events_table(catalog, "db.events", commits=2, rows_per_commit=10)
    calls: list[str] = []
    monkeypatch.setattr(pyiceberg_compat, "install", lambda: calls.append(action))

    ACTIONS[action](table)

    assert calls


def test_a_task_installs_the_fixes_in_whatever_process_runs_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(pyiceberg_compat, "install", lambda: calls.append("install"))
    task = RewriteTask(
        run_id="run",
        task_id=0,
        table="db.t",
        metadata_location=str(tmp_path / "missing.metadata.json"),
        io_properties={},
        spec_id=0,
        partition=Record(),
        partition_types={0: ()},
        target_file_size=1 << 20,
        row_group_size=1 << 20,
        read_ahead=1 << 20,
        memory_limit=1 << 28,
        file_prefix="run-0",
        inputs=(),
    )

    with pytest.raises(CompactorError, match="cannot read its metadata"):
        run_task(task)

    assert calls == ["install"]


# Reads an Avro double (0.1) with pyiceberg's reader and its default decoder.
READ_DOUBLE = """
import json, struct
from pyiceberg.avro.decoder import new_decoder
from pyiceberg.avro.reader import DoubleReader

print(json.dumps(DoubleReader().read(new_decoder(struct.pack("<d", 0.1)))))
"""


def test_pyiceberg_still_reads_avro_doubles_at_single_precision() -> None:
    read = _run_python(READ_DOUBLE)

    assert read != 0.1, (
        "pyiceberg now reads Avro doubles at full precision: remove the Avro-double fix from "
        "pyiceberg_compat.install()"
    )
    assert read == float(np.float32(0.1))


def test_once_installed_avro_doubles_are_read_at_full_precision() -> None:
    from pyiceberg.avro.decoder import new_decoder
    from pyiceberg.avro.reader import DoubleReader

    pyiceberg_compat.install()

    for value in (0.1, -0.0, 1.7976931348623157e308, 5e-324):
        read = DoubleReader().read(new_decoder(struct.pack("<d", value)))
        assert struct.pack("<d", read) == struct.pack("<d", value)


# A file with a null list of structs and a null map of structs, added to a new table and read
# back through pyiceberg's scan; with "install", after compactor's fixes.
READ_NULL_NESTED = """
import json, sys
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog

workdir, install = sys.argv[1:]
if install == "install":
    from compactor.iceberg import pyiceberg_compat

    pyiceberg_compat.install()
inner = pa.struct([("a", pa.int64())])
rows = pa.table({
    "l": pa.array([None, [{"a": 1}], []], pa.list_(inner)),
    "m": pa.array([None, [("k", {"a": 2})], []], pa.map_(pa.string(), inner)),
})
pq.write_table(rows, f"{workdir}/f.parquet")
catalog = SqlCatalog("n", uri=f"sqlite:///{workdir}/catalog.db", warehouse=f"file://{workdir}")
catalog.create_namespace("db")
table = catalog.create_table("db.t", rows.schema)
table.add_files([f"{workdir}/f.parquet"])
read = table.scan().to_arrow()
print(json.dumps({"l": read["l"].to_pylist(), "m": [None if m is None else len(m) for m in read["m"].to_pylist()]}))
"""


def test_pyiceberg_still_reads_a_null_list_or_map_of_structs_as_empty(tmp_path: Path) -> None:
    read = _run_python(READ_NULL_NESTED, str(tmp_path), "released")

    assert read != {"l": [None, [{"a": 1}], []], "m": [None, 1, 0]}, (
        "pyiceberg now keeps null lists and maps of structs: remove the null-lists fix from "
        "pyiceberg_compat.install()"
    )
    assert read == {"l": [[], [{"a": 1}], []], "m": [0, 1, 0]}


def test_once_installed_a_null_list_or_map_of_structs_stays_null(tmp_path: Path) -> None:
    read = _run_python(READ_NULL_NESTED, str(tmp_path), "install")

    assert read == {"l": [None, [{"a": 1}], []], "m": [None, 1, 0]}
