"""One exception hierarchy; the CLI maps it to a one-line message and an exit code."""

from __future__ import annotations

EXIT_RUNTIME = 1
EXIT_USAGE = 2


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type's name when it has none.

    A KeyError's message comes without the quotes ``str()`` puts around it.
    """
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    text = text.strip()
    return text.splitlines()[0] if text else type(exc).__name__


class CompactorError(Exception):
    """An expected failure: printed as one line, no stack trace unless --verbose."""

    exit_code = EXIT_RUNTIME


class UsageError(CompactorError):
    """Bad flags, settings or references (catalog, namespace, table, filter).

    ``options`` are the option names the message mentions, spelled as the library spells them
    (``target_file_size``): the command line shows its flags (``--target-file-size``) instead.
    """

    exit_code = EXIT_USAGE

    def __init__(self, message: str = "", *options: str) -> None:
        super().__init__(message)
        self.options = options


class ConfigError(UsageError):
    """A setting from a file, an environment variable or a table property is invalid."""


class GcDisabledError(ConfigError):
    """The table sets ``gc.enabled=false``: none of its files may be deleted."""


class UnsafeLocationError(ConfigError):
    """Deleting under the table's location could hit another table's files or the warehouse."""


class TableNotFoundError(UsageError):
    """The catalog, namespace or table named on the command line does not exist."""


class UnsupportedTableError(CompactorError):
    """The table uses a feature compactor cannot yet rewrite safely."""


class DataFileError(CompactorError):
    """A data or delete file of the table is missing or unreadable."""


class CommitConflictError(CompactorError):
    """A concurrent commit makes this rewrite unsafe; nothing was committed."""


class CommitStateUnknownError(CompactorError):
    """The catalog did not say whether a commit was applied; its files are kept."""
