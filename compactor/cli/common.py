"""What the table commands share: the --table, --catalog and --json options, opening a table."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from compactor.cli.output import err

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

    from compactor.commit.inflight import PendingCommit

# pyiceberg, and every module built on it, is imported inside the commands, after
# check_pyiceberg_config(): pyiceberg reads ~/.pyiceberg.yaml on import, and a broken file must
# fail as one error line, not a traceback. --help and --version stay quick too.

CatalogOpt = Annotated[
    str | None,
    typer.Option(
        "--catalog",
        "-c",
        help="Catalog name from ~/.pyiceberg.yaml or PYICEBERG_CATALOG__<NAME>__* variables. "
        "Default: pyiceberg's default catalog if configured, else the embedded SQLite catalog "
        "in $COMPACTOR_HOME (~/.local/share/compactor).",
    ),
]
TableOpt = Annotated[
    str, typer.Option("--table", "-t", help="Table to work on, as NAMESPACE.TABLE.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document instead of tables.")]
BusyExitOpt = Annotated[
    int,
    typer.Option(
        "--exit-code-if-busy",
        min=0,
        max=255,
        help="Exit with this code, not 0, when another run holds the table and this one backs "
        "off (for wrappers that retry later).",
    ),
]


def back_off(reason: str, as_json: bool, exit_code: int) -> NoReturn:
    """End a run that backed off because another holds the table: the reason on stderr (the
    JSON document, printed before, says it with ``--json``), exit ``--exit-code-if-busy``."""
    if not as_json:
        err.print(reason, markup=False, highlight=False)
    raise typer.Exit(exit_code)


def open_catalog_and_table(catalog: str | None, table: str) -> tuple[Catalog, Table]:
    """The catalog and the table; an unreachable catalog's error names the table too."""
    from compactor.errors import CatalogUnreachableError
    from compactor.iceberg.catalogs import open_catalog, open_table

    try:
        opened = open_catalog(catalog)
    except CatalogUnreachableError as exc:
        raise CatalogUnreachableError(f"table {table}: {exc}") from exc
    return opened, open_table(opened, table)


def open_table(catalog: str | None, table: str) -> Table:
    return open_catalog_and_table(catalog, table)[1]


def warn_in_doubt(table: str, commits: Iterable[PendingCommit]) -> None:
    """One warning line per commit of an earlier run that may still land (its files are kept)."""
    for c in commits:
        err.print(
            f"warning: {table}: kept the files of run {c.run_id}: its commit of snapshot "
            f"{c.snapshot_id} on {c.branch} got no answer and may still land; a later run "
            "removes them once it has landed or can no longer land",
            markup=False,
            highlight=False,
        )
