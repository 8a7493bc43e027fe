"""What a daemon's scan records beside a table's score: the settings it scored the table under
and where each came from, shown by ``compactor status``; and quarantined files, which a
compaction leaves out, are not counted as small."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.table import Table
from typer.testing import CliRunner

from compactor.cli.app import app
from compactor.daemon.config import load_daemon_config
from compactor.daemon.fragmentation import FragmentationScanner, due_reasons
from compactor.daemon.history import SCHEMA, History
from compactor.daemon.jobfiles import CompactAction, load_job
from compactor.daemon.service import Daemon
from compactor.quarantine import QuarantinedFile, stored_state, write_quarantine

from support.json_output import assert_documented
from support.tables import live_data_files

SCHEMA_ARROW = pa.schema([pa.field("id", pa.int64(), nullable=False)])
JOB = """
tables = ["db.*"]

[compact]
every = "1h"
min_small_files = 2
min_input_files = 2
"""
TUNED = {
    "compactor.compact.target-file-size": "128MiB",
    "compactor.compact.min-small-files": "50",
}


def small_table(catalog: Catalog, name: str, files: int, properties: dict[str, str]) -> Table:
    """``name`` holding ``files`` small data files, one per append."""
    table = catalog.create_table(name, SCHEMA_ARROW, properties=properties)
    for start in range(files):
        table.append(pa.table({"id": [start]}, SCHEMA_ARROW))
    return catalog.load_table(name)


def scan_with_the_daemon(catalog: Catalog, tmp_path: Path, *tables: str) -> Path:
    """Let a daemon with the job ``JOB`` scan ``tables`` once (no schedule started); its
    settings file."""
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "nightly.toml").write_text(JOB)
    config_path = tmp_path / "compactor.toml"
    config_path.write_text('[daemon]\nstate = "state.db"\nlisten = ""\n')
    job = load_job(tmp_path / "jobs" / "nightly.toml")
    daemon = Daemon(load_daemon_config(config_path), [job])
    try:
        for name in tables:
            daemon._request(catalog, job, "compact", name)
    finally:
        daemon.history.close()
    return config_path


def status(config_path: Path, *args: str) -> str:
    result = CliRunner().invoke(app, ["status", "--config", str(config_path), *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_status_shows_where_each_setting_of_a_table_came_from(
    catalog: Catalog, tmp_path: Path
) -> None:
    small_table(catalog, "db.tuned", 3, TUNED)
    small_table(catalog, "db.plain", 3, {})
    config_path = scan_with_the_daemon(catalog, tmp_path, "db.tuned", "db.plain")

    document = json.loads(status(config_path, "--json"))
    text = status(config_path)

    assert_documented("status", document)
    tables = {t["table"]: t for t in document["tables"]}
    tuned = {s["option"]: (s["value"], s["source"]) for s in tables["db.tuned"]["settings"]}
    assert tuned["target_file_size"] == (
        "128MiB",
        "table property compactor.compact.target-file-size",
    )
    assert tuned["min_small_files"] == ("50", "table property compactor.compact.min-small-files")
    assert tuned["min_input_files"] == ("2", "job file")
    assert tuned["strategy"] == ("binpack", "default")
    assert tuned["enabled"] == ("True", "default")
    assert "every" not in tuned  # the schedule is the job's, shown with its ticks
    # min_small_files 50 (not the job file's 2) decided: 3 small files are not due.
    assert not tables["db.tuned"]["due"] and tables["db.plain"]["due"]
    plain = {s["option"]: s["source"] for s in tables["db.plain"]["settings"]}
    assert set(plain.values()) == {"default", "job file"}
    job_file = {o for o, source in plain.items() if source == "job file"}
    assert job_file == {"min_small_files", "min_input_files"}
    settings_shown = text[text.index("settings (") : text.index("jobs")]
    assert "compactor.compact.target-file-size" in settings_shown
    assert "min_input_files" in settings_shown and "db.plain" in settings_shown
    assert "strategy" not in settings_shown  # defaults are not listed


def test_status_shows_a_table_paused_by_its_property(catalog: Catalog, tmp_path: Path) -> None:
    small_table(catalog, "db.paused", 3, {"compactor.compact.enabled": "false"})
    config_path = scan_with_the_daemon(catalog, tmp_path, "db.paused")

    (table,) = json.loads(status(config_path, "--json"))["tables"]
    text = status(config_path)

    settings = {s["option"]: (s["value"], s["source"]) for s in table["settings"]}
    assert settings["enabled"] == ("False", "table property compactor.compact.enabled")
    assert (table["due"], table["data_files"], table["source"]) == (False, 3, "summary")
    assert "paused" in text and "compactor.compact.enabled" in text


def test_a_state_file_of_an_earlier_version_loads_its_scans_without_settings(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    old_schema = SCHEMA.replace(",\n    settings TEXT NOT NULL DEFAULT '[]'", "")
    assert old_schema != SCHEMA
    with sqlite3.connect(path) as db:
        db.executescript(old_schema)
        db.execute(
            "INSERT INTO tables VALUES (?, ?, ?, ?, ?)",
            ("db.old", "nightly", 1.0, json.dumps({"score": 3}), 1),
        )
    history = History(path)
    setting = {"option": "min_small_files", "value": "50", "source": "job file"}
    history.record_scan("db.new", "nightly", 2.0, {"score": 0}, False, [setting])

    scans = {s["table"]: s for s in history.scans()}
    history.close()

    assert scans["db.old"]["settings"] == [] and scans["db.old"]["score"] == 3
    assert scans["db.new"]["settings"] == [setting]


def test_a_table_whose_only_small_files_are_quarantined_is_not_due(catalog: Catalog) -> None:
    table = small_table(catalog, "db.q", 3, {})
    section = CompactAction(every="1h", min_small_files=2, min_input_files=2)
    target = 128 << 20
    scanner = FragmentationScanner()
    before = scanner.scan(table, "db.q", target, section)
    sizes = {d.file_path: d.file_size_in_bytes for d in live_data_files(table).values()}
    write_quarantine(
        table,
        {
            path: QuarantinedFile(path, size, *stored_state(table.io, path), "damaged", 1, 1)
            for path, size in sorted(sizes.items())[:2]  # the third file is alone: not small
        },
    )

    after = scanner.scan(table, "db.q", target, section)
    again = scanner.scan(table, "db.q", target, section)

    assert (before.small_files, bool(due_reasons(before, section))) == (3, True)
    assert (after.small_files, after.files_under_target) == (0, 1)
    assert due_reasons(after, section) == []
    assert (again.small_files, again.manifests_read) == (0, 0)  # found once per quarantine
