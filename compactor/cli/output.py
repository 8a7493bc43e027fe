"""What every command shares: the consoles, tables, JSON, one-line errors with exit codes."""

from __future__ import annotations

import functools
import json
import re
import sys
import traceback
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, ParamSpec

import typer
from rich.console import Console, RenderableType
from rich.table import Table

from compactor.errors import EXIT_RUNTIME, CompactorError, UsageError
from compactor.options.environment import check_pyiceberg_config
from compactor.options.table_properties import TableDisabledError
from compactor.redaction import redact

# soft_wrap: lines are never broken at the terminal's width. Piped output has no width limit
# (rich would assume 80 columns), so tables written to files and logs are never cut short.
PIPE_WIDTH = 1000
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else PIPE_WIDTH)
err = Console(stderr=True, soft_wrap=True)
state = {"verbose": False}


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def flag(option: str) -> str:
    """The command-line flag of a library option: ``target_file_size`` -> ``--target-file-size``."""
    return "--" + option.replace("_", "-")


def with_flags(message: str, options: tuple[str, ...]) -> str:
    """``message`` with each option name it mentions (outside quoted values) shown as a flag."""
    if not options:
        return message
    names = re.compile(r"\b(" + "|".join(map(re.escape, options)) + r")\b")
    parts = re.split(r"('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")", message)
    return "".join(
        part if index % 2 else names.sub(lambda m: flag(m.group(1)), part)
        for index, part in enumerate(parts)
    )


def fail(exc: BaseException, as_json: bool = False) -> None:
    """Print ``exc`` as one ``error:`` line (after its traceback with --verbose) and exit.

    With ``as_json`` the same message also goes to stdout as ``{"error": ..., "exit_code": ...}``,
    so that a script reading the command's JSON always gets JSON.
    """
    verbose = state["verbose"]
    if verbose:
        sys.stderr.write(redact("".join(traceback.format_exception(exc))))
    if isinstance(exc, CompactorError):
        message, code = _one_line(str(exc)) or type(exc).__name__, exc.exit_code
        if isinstance(exc, UsageError):
            message = with_flags(message, exc.options)
    else:
        lines = str(exc).strip().splitlines()
        message = f"{type(exc).__name__}: {lines[0].strip()}" if lines else type(exc).__name__
        if not verbose:
            message += " (run with --verbose for details)"
        code = EXIT_RUNTIME
    err.print(f"error: {redact(message)}", markup=False, highlight=False)
    if as_json:
        print(json.dumps({"error": redact(message), "exit_code": code}))
    raise typer.Exit(code)


P = ParamSpec("P")


def guarded(command: Callable[P, None]) -> Callable[P, None]:
    """A command whose failures become one ``error:`` line and an exit code.

    Its ``as_json`` parameter, when true, also sends the error to stdout as a JSON document.
    Ctrl-C exits 130; pyiceberg's configuration is checked first.
    """

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            check_pyiceberg_config()
            command(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except KeyboardInterrupt:
            err.print(
                "interrupted: unfinished groups were not committed; the next run cleans up after it"
            )
            raise typer.Exit(130) from None
        except TableDisabledError as exc:  # the table's owner paused it: not a failure
            err.print(f"{exc}; nothing done", markup=False, highlight=False)
            if kwargs.get("as_json"):
                print_json({"table": exc.table, "paused_by": exc.setting, "exit_code": 0})
            raise typer.Exit(0) from None
        except Exception as exc:
            fail(exc, bool(kwargs.get("as_json", False)))

    return run


def print_json(document: Any) -> None:
    """The ``--json`` output: one indented document on stdout."""
    print(json.dumps(document, indent=2))


def print_table(
    title: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[RenderableType]],
    *,
    right: Collection[str] = (),
    fold: Collection[str] = (),
    skip_empty: bool = False,
    console: Console | None = None,
) -> None:
    """A titled table of ``rows`` (plain strings take rich markup; pass ``Text`` for values
    printed as they are): the ``right`` columns right-justified, the ``fold`` columns folded
    rather than cut short. With ``skip_empty``, no rows print nothing."""
    table = Table(title=title)
    for column in columns:
        table.add_column(
            column,
            justify="right" if column in right else "left",
            overflow="fold" if column in fold else "ellipsis",
        )
    for row in rows:
        table.add_row(*row)
    if table.row_count or not skip_empty:
        (console or out).print(table)
