"""``compactor quarantine list`` and ``clear``: the unreadable files compaction leaves out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from compactor.cli.common import CatalogOpt, JsonOpt, TableOpt, open_catalog_and_table, open_table
from compactor.cli.output import guarded, out, print_json, print_table
from compactor.sizes import count

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

quarantine_app = typer.Typer(
    help="The unreadable files compaction leaves out of its plans, per table.",
    no_args_is_help=True,
)


def _tables(catalog: Catalog) -> list[Table]:
    """Every table of ``catalog``."""
    from compactor.iceberg.catalogs import all_namespaces

    return [
        catalog.load_table(identifier)
        for namespace in all_namespaces(catalog)
        for identifier in catalog.list_tables(namespace)
    ]


@quarantine_app.command("list")
@guarded
def quarantine_list(
    table: Annotated[
        str | None,
        typer.Option(
            "--table", "-t", help="Only this table, as NAMESPACE.TABLE. Default: every table."
        ),
    ] = None,
    catalog: CatalogOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the quarantined files: found unreadable by a compaction, left out of its plans
    until storage holds other bytes for them or they are cleared.

    `changed` files hold other bytes now: the next run plans them again.

    Example: compactor quarantine list --table db.events
    """
    from compactor.durations import format_time
    from compactor.iceberg.catalogs import identifier_of, open_catalog
    from compactor.quarantine import Quarantine

    tables = (
        [open_catalog_and_table(catalog, table)[1]] if table else _tables(open_catalog(catalog))
    )
    rows = []
    for tbl in tables:
        quarantine = Quarantine.load(tbl)
        for changed, entries in ((False, quarantine.held), (True, quarantine.released)):
            rows += [
                {"table": identifier_of(tbl), **f.to_dict(), "changed": changed}
                for f in entries.values()
            ]
    rows.sort(key=lambda r: (r["table"], r["path"]))
    if as_json:
        print_json({"files": rows})
        return
    print_table(
        "quarantined files",
        ("table", "file", "reason", "first seen", "last seen", "changed"),
        (
            (
                r["table"],
                Text(r["path"]),  # no markup
                Text(r["reason"]),
                format_time(r["first_seen_ms"]),
                format_time(r["last_seen_ms"]),
                "yes" if r["changed"] else "no",
            )
            for r in rows
        ),
        fold=("table", "file", "reason"),
        skip_empty=True,
    )
    out.print(f"{count(len(rows), 'quarantined file')}")


@quarantine_app.command("clear")
@guarded
def quarantine_clear(
    table: TableOpt,
    path: Annotated[
        list[str] | None,
        typer.Option(
            "--path", "-p", help="Clear only this file (repeatable). Default: every file."
        ),
    ] = None,
    catalog: CatalogOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Take files out of a table's quarantine: the next run plans them again (and quarantines
    them again if they still cannot be read).

    Example: compactor quarantine clear --table db.events --path s3://lake/db/events/data/f.parquet
    """
    from compactor.quarantine import clear_quarantine

    cleared = clear_quarantine(open_table(catalog, table), path or None)
    if as_json:
        print_json({"table": table, "cleared": cleared})
        return
    for cleared_path in cleared:
        out.print(f"cleared: {cleared_path}", markup=False, highlight=False)
    out.print(f"{table}: {count(len(cleared), 'file')} cleared; the next run plans them again")
