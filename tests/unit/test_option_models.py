"""Each option declared once: a command's flags are its model's fields, its job-file section
takes them, docs/cli.md lists them, and no module keeps its own copy of a default."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from pydantic import BaseModel
from typer.main import get_command

from compactor.cli.app import app
from compactor.daemon.jobfiles import (
    CompactAction,
    ExpireAction,
    OrphansAction,
    RewriteDeletesAction,
    RewriteManifestsAction,
    Schedule,
)
from compactor.options import (
    CompactOptions,
    ExpireOptions,
    OrphansOptions,
    RewriteDeletesOptions,
    RewriteManifestsOptions,
    defaults,
)

from support import REPOSITORY

PACKAGE = REPOSITORY / "compactor"
# Every table command's own parameters, besides its options: the table, what it acts on, output.
COMMON = {"table", "catalog", "as_json"}
COMMANDS = {
    "run": (CompactOptions, set(CompactOptions.model_fields), {"dry_run", "exit_code_if_busy"}),
    "inspect": (CompactOptions, {"target_file_size", "allow_small_target"}, set()),
    "expire": (ExpireOptions, set(ExpireOptions.model_fields), {"snapshot_ids", "dry_run"}),
    "orphans": (
        OrphansOptions,
        set(OrphansOptions.model_fields),
        {"location", "dry_run", "list_all"},
    ),
    "rewrite-deletes": (
        RewriteDeletesOptions,
        set(RewriteDeletesOptions.model_fields),
        {"dry_run", "exit_code_if_busy"},
    ),
    "rewrite-manifests": (
        RewriteManifestsOptions,
        set(RewriteManifestsOptions.model_fields),
        {"dry_run", "exit_code_if_busy"},
    ),
}
SECTIONS: list[tuple[type[BaseModel], type[BaseModel], set[str]]] = [
    (CompactAction, CompactOptions, {"min_small_files", "min_small_bytes"}),
    (
        RewriteDeletesAction,
        RewriteDeletesOptions,
        {"min_equality_delete_files", "min_position_delete_files"},
    ),
    (RewriteManifestsAction, RewriteManifestsOptions, {"min_manifests", "max_average_entries"}),
    (ExpireAction, ExpireOptions, {"on_table_globs"}),
    (OrphansAction, OrphansOptions, {"on_table_globs"}),
]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_commands_flags_are_its_models_fields(command: str) -> None:
    model, fields, targets = COMMANDS[command]
    click = get_command(app).commands[command]  # type: ignore[attr-defined]
    params = {p.name: p for p in click.params}
    assert set(params) == fields | COMMON | targets
    for name in fields:
        field = model.model_fields[name]
        assert params[name].help == field.description, name  # the help is the model's
        assert params[name].default == field.default, name  # and so is the default


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_docs_list_every_flag_of_a_command(command: str) -> None:
    text = (REPOSITORY / "docs" / "cli.md").read_text()
    section = text.split(f"## `compactor {command}`", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `(--[a-z-]+)`", section, re.MULTILINE))
    _, fields, targets = COMMANDS[command]
    click = get_command(app).commands[command]  # type: ignore[attr-defined]
    flags = {p.opts[0] for p in click.params if p.name in fields | targets}
    assert flags <= rows


@pytest.mark.parametrize(("section", "model", "job_only"), SECTIONS)
def test_a_job_sections_keys_are_its_actions_options(
    section: type[BaseModel], model: type[BaseModel], job_only: set[str]
) -> None:
    schedule = set(Schedule.model_fields)
    extra = set(section.model_fields) - set(model.model_fields) - schedule
    assert issubclass(section, model)
    if section is CompactAction:
        job_only = job_only | {"min_delete_files", "cooldown"}
    assert extra == job_only


def test_no_module_keeps_its_own_copy_of_a_default() -> None:
    """Every name options/defaults.py defines is assigned there only."""
    declared = {
        target.id
        for node in ast.parse(Path(defaults.__file__).read_text()).body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }
    for path in PACKAGE.rglob("*.py"):
        if path == Path(defaults.__file__):
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = {t.id for t in targets if isinstance(t, ast.Name)}
                assert not names & declared, (path, names & declared)
