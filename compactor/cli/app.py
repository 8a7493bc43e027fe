"""The ``compactor`` command line: the root command and its global options.

The commands live with their family: ``compact_commands`` (run, inspect), ``maintain_commands``
(expire, orphans, rewrite-deletes), ``service_commands`` (daemon, status, jobs),
``quarantine_commands`` (quarantine list, clear), ``demo`` and ``bench``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Annotated

import typer

from compactor import __version__
from compactor.cli import (
    compact_commands,
    demo,
    maintain_commands,
    quarantine_commands,
    service_commands,
)
from compactor.cli.bench import bench_app
from compactor.cli.output import fail, out, state
from compactor.errors import UsageError
from compactor.iceberg.catalog_probe import CATALOG_TIMEOUT_VARIABLE, catalog_timeout_s
from compactor.options.defaults import DEFAULT_CATALOG_TIMEOUT
from compactor.redaction import protect

app = typer.Typer(
    help="Keep Apache Iceberg tables fast: compact small files into large ones.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
# In this order in --help: the commands, then the groups.
app.add_typer(compact_commands.commands)
app.add_typer(maintain_commands.commands)
app.add_typer(demo.commands)
app.add_typer(service_commands.commands)
app.add_typer(bench_app, name="bench")
app.add_typer(service_commands.jobs_app, name="jobs")
app.add_typer(quarantine_commands.quarantine_app, name="quarantine")


def _print_version(value: bool) -> None:
    if value:
        out.print(f"compactor {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show debug logs and full tracebacks.")
    ] = False,
    catalog_timeout: Annotated[
        str | None,
        typer.Option(
            "--catalog-timeout",
            help="How long a catalog's server (REST, SQL, Glue, Hive) may take to accept a "
            f"connection before it is reported unreachable, e.g. 3s. Default: "
            f"${CATALOG_TIMEOUT_VARIABLE}, else {DEFAULT_CATALOG_TIMEOUT}.",
        ),
    ] = None,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,  # before click asks for the missing command
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    state["verbose"] = verbose
    if catalog_timeout is not None:
        try:
            catalog_timeout_s(catalog_timeout)
        except UsageError as exc:
            fail(exc)
        os.environ[CATALOG_TIMEOUT_VARIABLE] = catalog_timeout  # for the daemon's catalogs too
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    for handler in logging.getLogger().handlers:
        protect(handler)


# The global options taken after the command too, and how many values each takes.
GLOBAL_FLAGS = {"--verbose": 0, "-v": 0, "--catalog-timeout": 1}


def hoist_global_flags(args: list[str]) -> list[str]:
    """``args`` with the global options (:data:`GLOBAL_FLAGS`) moved before the command."""
    end = args.index("--") if "--" in args else len(args)
    flags: list[str] = []
    rest: list[str] = []
    i = 0
    while i < end:
        name = args[i].split("=", 1)[0]
        arity = GLOBAL_FLAGS.get(name)
        if arity is None:
            rest.append(args[i])
            i += 1
            continue
        take = 1 if "=" in args[i] else 1 + arity
        flags += args[i : i + take]
        i += take
    return flags + rest + args[end:]


def main() -> None:
    """Console-script entry point: the global options are taken after the command too."""
    app(args=hoist_global_flags(sys.argv[1:]))
