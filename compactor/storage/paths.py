"""Comparable forms of file locations, and the rule that nothing outside a table is touched.

Iceberg metadata and storage listings spell the same file differently: ``s3a://``/``s3n://``
versus ``s3://``, ``file:/x`` versus ``file:///x`` versus ``/x``, percent-encoded characters,
doubled slashes. Deletion decisions compare :func:`location_key` values, which erase those
differences and keep the authority (bucket) and path.
"""

from __future__ import annotations

import posixpath
from urllib.parse import unquote, urlsplit

from compactor.errors import CompactorError

_SAME_SCHEME = {"s3a": "s3", "s3n": "s3", "gs": "gs", "gcs": "gs", "abfss": "abfs", "wasbs": "wasb"}
_LOCAL = {"", "file"}


class UnsafePathError(CompactorError):
    """A location compactor refuses to delete: odd, outside the table, or escaping it."""


def location_key(location: str) -> str:
    """``scheme://authority/path`` with equivalent schemes merged, decoded, slashes collapsed.

    Raises :class:`UnsafePathError` for locations that cannot be compared safely: ``..``
    segments, empty paths, or characters that decode to control characters.
    """
    parts = urlsplit(location)
    scheme = parts.scheme.lower()
    if len(scheme) == 1:  # a Windows drive letter is not a scheme
        raise UnsafePathError(f"refusing odd location {location!r}")
    scheme = "file" if scheme in _LOCAL else _SAME_SCHEME.get(scheme, scheme)
    path = unquote(parts.path)
    if not path or any(ord(c) < 32 for c in path) or parts.query or parts.fragment:
        raise UnsafePathError(f"refusing odd location {location!r}")
    if ".." in path.split("/"):
        raise UnsafePathError(f"refusing location with '..' segments {location!r}")
    normal = posixpath.normpath("/" + path.lstrip("/"))
    authority = "" if scheme == "file" else parts.netloc.lower()
    return f"{scheme}://{authority}{normal}"


def is_within(location: str, root: str) -> bool:
    """True when ``location`` lies strictly under ``root`` (compared as location keys)."""
    try:
        key, base = location_key(location), location_key(root).rstrip("/")
    except UnsafePathError:
        return False
    return key.startswith(base + "/")
