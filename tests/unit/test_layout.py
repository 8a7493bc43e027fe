"""The package's shape: stages in folders, no import cycles, one declaration of every option."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from compactor.daemon.jobfiles import CompactAction
from compactor.options import CompactOptions

from support import REPOSITORY

PACKAGE = REPOSITORY / "compactor"
STAGES = ("planning", "rewrite", "execute", "commit", "maintain", "iceberg", "storage", "daemon")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Every compactor module and the compactor modules it imports, at any depth of its code."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[_module_name(path)] = {name for name in found if name.startswith("compactor")}
    modules = set(graph)
    return {name: {m for m in found if m in modules} for name, found in graph.items()}


def test_every_stage_is_a_folder_and_the_top_level_is_small() -> None:
    for stage in STAGES:
        assert (PACKAGE / stage / "__init__.py").is_file(), stage
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 8, top


def test_nothing_outside_the_command_line_imports_it() -> None:
    for module, imported in _imports().items():
        if not module.startswith("compactor.cli"):
            assert not {m for m in imported if m.startswith("compactor.cli")}, module


def test_every_command_reports_failures_through_the_one_decorator() -> None:
    """Each command of the command line, in whichever family module, is wrapped by ``guarded``
    (one error line, the exit code, the JSON error document), right under its registration."""
    found = []
    for path in (PACKAGE / "cli").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.FunctionDef):
                continue
            names = [ast.unparse(d) for d in node.decorator_list]
            if any(".command(" in name for name in names):
                found.append(node.name)
                assert names[-1] == "guarded", (path.name, node.name, names)
    assert {"run", "inspect", "expire", "orphans", "rewrite_deletes", "status"} <= set(found)


def test_modules_import_each_other_without_cycles() -> None:
    graph = _imports()
    done: set[str] = set()

    def visit(module: str, trail: list[str]) -> None:
        if module in trail:
            pytest.fail("import cycle: " + " -> ".join([*trail[trail.index(module) :], module]))
        if module in done:
            return
        for imported in sorted(graph[module]):
            if imported != "compactor" and not module.startswith(imported + "."):
                visit(imported, [*trail, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_private_pyiceberg_apis_stay_in_one_module() -> None:
    allowed = PACKAGE / "iceberg" / "pyiceberg_compat.py"
    for path in PACKAGE.rglob("*.py"):
        if path == allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pyiceberg"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private and "._" not in (node.module or ""), (path, node.module)


def test_job_files_take_exactly_the_library_options() -> None:
    options = set(CompactOptions.model_fields)
    assert options <= set(CompactAction.model_fields)
    job_only = set(CompactAction.model_fields) - options
    assert job_only == {"every", "cron", "min_small_files", "min_small_bytes"} | {
        "min_delete_files",
        "cooldown",
    }
