"""A table's own ``compactor.*`` properties pause or tune its maintenance; flags win over them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from pyiceberg.table import Table

from compactor.bench.sample import create_events_table

from support.cli import assert_one_error_line, compactor, embedded
from support.json_output import assert_documented

TABLE = "db.events"
ACTIONS = {
    "compact": ("run", "--min-input-files", "2"),
    "expire": ("expire", "--older-than", "0s", "--retain-last", "1"),
    "orphans": ("orphans", "--older-than", "0s", "--allow-short-older-than"),
    "rewrite-deletes": ("rewrite-deletes",),
    "rewrite-manifests": ("rewrite-manifests",),
}


def run(home: Path, action: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """The command of ``action`` on the table, with its arguments of :data:`ACTIONS`."""
    command, *args = ACTIONS[action]
    return compactor(home, command, "--table", TABLE, *args, *extra)


def events(home: Path, **properties: str) -> Table:
    table = create_events_table(embedded(home), TABLE, commits=4, rows_per_commit=50, days=1)
    with table.transaction() as tx:
        tx.set_properties(properties)
    return embedded(home).load_table(TABLE)


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_compactor_enabled_false_pauses_every_action(tmp_path: Path, action: str) -> None:
    before = events(tmp_path, **{"compactor.enabled": "false"}).metadata_location
    text = run(tmp_path, action)
    as_json = run(tmp_path, action, "--json")

    assert text.returncode == 0 and as_json.returncode == 0, text.stderr + as_json.stderr
    assert f"table {TABLE}: {action} is paused by its property compactor.enabled=false" in (
        text.stderr
    )
    assert json.loads(as_json.stdout) == {
        "table": TABLE,
        "paused_by": "compactor.enabled=false",
        "exit_code": 0,
    }
    assert embedded(tmp_path).load_table(TABLE).metadata_location == before


def test_an_actions_own_switch_pauses_it_alone(tmp_path: Path) -> None:
    events(tmp_path, **{"compactor.compact.enabled": "off"})

    paused = run(tmp_path, "compact")
    expired = run(tmp_path, "expire")

    assert paused.returncode == 0 and "compactor.compact.enabled=off" in paused.stderr
    assert expired.returncode == 0, expired.stderr
    assert len(embedded(tmp_path).load_table(TABLE).metadata.snapshots) == 1


def test_options_set_by_the_table_apply_and_a_flag_wins_over_them(tmp_path: Path) -> None:
    events(tmp_path, **{"compactor.compact.min-input-files": "100"})

    by_table = compactor(tmp_path, "run", "--table", TABLE, "--dry-run", "--json")
    by_flag = compactor(
        tmp_path, "run", "--table", TABLE, "--dry-run", "--json", "--min-input-files", "2"
    )

    assert by_table.returncode == 0 and by_flag.returncode == 0, by_table.stderr + by_flag.stderr
    assert json.loads(by_table.stdout)["plan"]["groups"] == []
    assert json.loads(by_flag.stdout)["plan"]["groups"]


def test_a_sort_order_set_by_the_table_is_used(tmp_path: Path) -> None:
    events(
        tmp_path,
        **{"compactor.compact.strategy": "sort", "compactor.compact.sort-order": "event_id"},
    )

    result = compactor(tmp_path, "run", "--table", TABLE, "--min-input-files", "2", "--json")

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["strategy"] == "sort"


@pytest.mark.parametrize(
    ("key", "value", "fragments"),
    [
        ("compactor.enabled", "maybe", ("compactor.enabled='maybe'", "true or false")),
        ("compactor.compact.min-input-files", "lots", ("compactor.compact.min-input-files",)),
        ("compactor.compact.strategy", "shuffle", ("compactor.compact.strategy", "'binpack'")),
    ],
)
def test_a_bad_property_is_one_error_naming_table_and_property(
    tmp_path: Path, key: str, value: str, fragments: tuple[str, ...]
) -> None:
    events(tmp_path, **{key: value})
    result = compactor(tmp_path, "run", "--table", TABLE, "--min-input-files", "2")
    assert_one_error_line(result, 2, f"table {TABLE}: property", *fragments)


def test_inspect_shows_each_setting_with_its_source_and_the_paused_actions(tmp_path: Path) -> None:
    events(
        tmp_path,
        **{
            "compactor.compact.min-input-files": "9",
            "compactor.compact.target-file-size": "128MiB",
            "compactor.expire.enabled": "false",
        },
    )

    result = compactor(
        tmp_path, "inspect", "--table", TABLE, "--target-file-size", "64MiB", "--json"
    )
    text = compactor(tmp_path, "inspect", "--table", TABLE)

    assert result.returncode == 0 and text.returncode == 0, result.stderr + text.stderr
    document = json.loads(result.stdout)
    assert_documented("inspect", document)
    assert document["settings"] == [
        {
            "option": "min_input_files",
            "value": "9",
            "source": "table property compactor.compact.min-input-files",
        },
        {"option": "target_file_size", "value": "64MiB", "source": "flag"},
    ]
    assert document["paused"] == ["expire"]
    assert document["min_input_files"] == 9 and document["target_file_size"] == 64 * 2**20
    assert "setting: min_input_files = 9 (table property compactor.compact.min-input-files)" in (
        text.stdout
    )
    assert "paused by the table's properties: expire" in text.stdout
