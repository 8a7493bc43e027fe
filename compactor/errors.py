"""One exception hierarchy; the CLI maps it to a one-line message and an exit code."""

from __future__ import annotations

EXIT_RUNTIME = 1
EXIT_USAGE = 2


class CompactorError(Exception):
    """An expected failure: printed as one line, no stack trace unless --verbose."""

    exit_code = EXIT_RUNTIME


class UsageError(CompactorError):
    """Bad flags, settings or references (catalog, namespace, table, filter)."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """A setting from a file, an environment variable or a table property is invalid."""


class TableNotFoundError(UsageError):
    """The catalog, namespace or table named on the command line does not exist."""


class UnsupportedTableError(CompactorError):
    """The table uses a feature compactor cannot yet rewrite safely."""


class DataFileError(CompactorError):
    """A data or delete file of the table is missing or unreadable."""


class CommitConflictError(CompactorError):
    """A concurrent commit makes this rewrite unsafe; nothing was committed."""
