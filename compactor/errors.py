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


class CatalogUnreachableError(CompactorError):
    """The catalog did not answer (connection refused or reset, timeout, unknown host): exit 1
    whatever the catalog's type, since the same settings may work once it is back."""


class TableMetadataMissingError(CompactorError):
    """The catalog points at a table metadata file that storage no longer holds."""


class UnsupportedTableError(CompactorError):
    """The table uses a feature compactor cannot yet rewrite safely."""


class DataFileError(CompactorError):
    """A data or delete file of the table is missing or unreadable."""


# What storage and pyarrow say of a file that is missing or not valid Parquet, where a retry
# cannot help (unlike a throttled or failing store, which the storage retries handle).
MISSING_MARKERS = ("NoSuchKey", "NO_SUCH_KEY")
CORRUPT_MARKERS = (
    "Parquet magic bytes not found",
    "Couldn't deserialize thrift",
    "Parquet file size is",
    # A valid footer over damaged pages: a page header, compressed data or encoded values.
    "Invalid page header",
    "decompression failed",  # ZSTD, LZ4, Brotli
    "Corrupt snappy compressed data",
    "GZipCodec failed",
    "Unexpected end of stream",
    "CRC checksum verification failed",  # a page that decodes, but not to what was written
)


class UnreadableFileError(DataFileError):
    """A file of a group is missing from storage or not valid Parquet: the group is skipped."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(path, reason)
        self.path, self.reason = path, reason

    def __str__(self) -> str:
        return f"unreadable file {self.path}: {self.reason}"


def file_error(kind: str, path: str, exc: BaseException) -> DataFileError:
    """``exc``, raised reading ``path`` (a ``kind`` file), as one error naming the file.

    An :class:`UnreadableFileError` when it says the file is missing or not valid Parquet;
    otherwise (a storage failure, a bug) a plain :class:`DataFileError`.
    """
    text = first_line(exc)
    if isinstance(exc, FileNotFoundError) or any(m in text for m in MISSING_MARKERS):
        return UnreadableFileError(path, f"missing {kind} file: {text}")
    if isinstance(exc, OSError | ValueError) and any(m in text for m in CORRUPT_MARKERS):
        return UnreadableFileError(path, f"corrupt {kind} file: {text}")
    return DataFileError(f"{kind} file {path}: {text}")


# What local storage and object stores say when a write is refused for good.
NOT_WRITABLE_MARKERS = (
    "Read-only file system",
    "Permission denied",
    "AccessDenied",
    "Access Denied",
)


class StorageNotWritableError(CompactorError):
    """The table's storage refuses writes: nothing was written."""


def not_writable_error(table: str, exc: BaseException) -> CompactorError | None:
    """A :class:`StorageNotWritableError` naming ``table`` when ``exc``, raised writing one of its
    files, says its storage refuses writes; None otherwise."""
    text = first_line(exc)
    if isinstance(exc, PermissionError) or any(m in text for m in NOT_WRITABLE_MARKERS):
        return StorageNotWritableError(f"table {table}: its storage is not writable: {text}")
    return None


class CommitConflictError(CompactorError):
    """A concurrent commit makes this rewrite unsafe; nothing was committed."""


class CommitStateUnknownError(CompactorError):
    """The catalog did not say whether a commit was applied; its files are kept."""
