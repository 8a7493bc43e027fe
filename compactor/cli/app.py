"""The ``compactor`` command line: the root command and its global options.

The commands live with their family: ``compact_commands`` (run, inspect), ``maintain_commands``
(expire, orphans, rewrite-deletes), ``service_commands`` (daemon, status, jobs), ``demo`` and
``bench``.
"""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from compactor import __version__
from compactor.cli import compact_commands, demo, maintain_commands, service_commands
from compactor.cli.bench import bench_app
from compactor.cli.output import out, state
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


def _print_version(value: bool) -> None:
    if value:
        out.print(f"compactor {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Show debug logs and full tracebacks.")
    ] = False,
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
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    for handler in logging.getLogger().handlers:
        protect(handler)


VERBOSE_FLAGS = ("--verbose", "-v")


def main() -> None:
    """Console-script entry point: ``--verbose`` (``-v``) is taken after the command too."""
    args = sys.argv[1:]
    end = args.index("--") if "--" in args else len(args)
    flags = [a for a in args[:end] if a in VERBOSE_FLAGS][:1]
    rest = [a for a in args[:end] if a not in VERBOSE_FLAGS] + args[end:]
    app(args=flags + rest)
