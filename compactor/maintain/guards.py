"""What must hold before compactor deletes a table's files: the files are the table's alone.

Two table-level refusals and one per-file fence:

- ``gc.enabled=false`` (registered copies, tables sharing files) forbids any deletion, as in
  Iceberg's Java actions.
- Another table of the same catalog at the very same location (a table registered from this
  one's metadata, say) may reference any file there: nothing is deleted. An orphan sweep lists a
  whole location, so it also refuses a location holding the catalog's warehouse or a
  namespace's location, and a catalog whose tables cannot be listed.
- Every location of another table that lies inside this table's location (``db.child`` at
  ``.../shared/child`` inside ``db.parent`` at ``.../shared``) is fenced off: nothing under it
  is deleted. A table's locations are its ``location``, its ``write.data.path`` and
  ``write.metadata.path`` (and the deprecated ``write.object-storage.path`` /
  ``write.folder-storage.path``) and the directory of its current metadata file. A sweep also
  fences off any directory in the listing that holds ``metadata/*.metadata.json``: a table of
  another catalog, or one no catalog knows any more.

Finding the fences loads every table of the catalog (in parallel): one metadata read per table,
at most once per expiry or orphan sweep that has something to delete.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyiceberg.table import Table

from compactor.errors import CompactorError, GcDisabledError, UnsafeLocationError, first_line
from compactor.iceberg.catalogs import all_namespaces
from compactor.storage.paths import UnsafePathError, location_key

GC_ENABLED = "gc.enabled"
# Properties that place a table's files outside ``<location>/data`` and ``<location>/metadata``.
PATH_PROPERTIES = (
    "write.data.path",
    "write.metadata.path",
    "write.object-storage.path",
    "write.folder-storage.path",
)
LOAD_THREADS = 8
EXPIRE = "expire snapshots"
REMOVE_ORPHANS = "remove orphan files"


def gc_enabled(properties: dict[str, str]) -> bool:
    """Iceberg's rule: enabled unless ``gc.enabled`` is set to anything but ``true``."""
    value = properties.get(GC_ENABLED)
    return value is None or value.strip().lower() == "true"


def check_gc_enabled(table: Table, identifier: str, action: str) -> None:
    """Raise :class:`GcDisabledError` when the table forbids deleting its files."""
    properties = table.metadata.properties
    if not gc_enabled(properties):
        raise GcDisabledError(
            f"table {identifier}: cannot {action}: {GC_ENABLED}={properties[GC_ENABLED]} "
            "(deleting files may corrupt other tables that share them)"
        )


def _key(location: str, owner: str) -> str:
    try:
        return location_key(location).rstrip("/")
    except UnsafePathError as exc:
        raise UnsafeLocationError(f"table {owner}: {exc}") from None


def _within_or_equal(key: str, root: str) -> bool:
    return key == root or key.startswith(root + "/")


@dataclass
class Fences:
    """Directories inside a table's location that belong to other tables."""

    owners: dict[str, str] = field(default_factory=dict)  # location key -> owning table

    def add(self, key: str, owner: str) -> None:
        self.owners.setdefault(key.rstrip("/"), owner)

    def owner(self, location: str) -> str | None:
        """The table whose fenced directory holds ``location``, or None."""
        if not self.owners:
            return None
        try:
            return self.owner_of(location_key(location))
        except UnsafePathError:
            return None  # odd locations are refused anyway

    def owner_of(self, key: str) -> str | None:
        """The table whose fenced directory holds the file of location key ``key``, or None."""
        if not self.owners:
            return None
        scheme, _, rest = key.partition("://")
        authority, _, path = rest.partition("/")
        parts = path.split("/")
        for depth in range(len(parts), 0, -1):
            owner = self.owners.get(f"{scheme}://{authority}/" + "/".join(parts[:depth]))
            if owner is not None:
                return owner
        return None


def _locations(table: Table) -> list[str]:
    metadata = table.metadata
    found = [metadata.location]
    found += [metadata.properties[p] for p in PATH_PROPERTIES if metadata.properties.get(p)]
    if table.metadata_location:
        found.append(posixpath.dirname(table.metadata_location))
    return found


def _listing_failed(catalog: Catalog, identifier: str, exc: Exception) -> CompactorError:
    return CompactorError(
        f"table {identifier}: cannot list the tables of catalog {catalog.name!r} to keep out of "
        f"their locations ({first_line(exc)}); deleting nothing"
    )


def _namespaces(catalog: Catalog, identifier: str) -> list[tuple[str, ...]]:
    try:
        return all_namespaces(catalog)
    except Exception as exc:
        raise _listing_failed(catalog, identifier, exc) from exc


def _load_others(
    catalog: Catalog, namespaces: list[tuple[str, ...]], own: tuple[str, ...], identifier: str
) -> list[Table]:
    """Every other table of ``catalog``; a refusal when they cannot all be listed and loaded."""
    identifiers: list[tuple[str, ...]] = []
    for namespace in namespaces:
        try:
            identifiers += [tuple(t) for t in catalog.list_tables(namespace)]
        except NoSuchNamespaceError:
            continue  # dropped meanwhile
        except Exception as exc:
            raise _listing_failed(catalog, identifier, exc) from exc

    def load(other: tuple[str, ...]) -> Table | None:
        try:
            return catalog.load_table(other)
        except NoSuchTableError:
            return None  # dropped meanwhile
        except Exception as exc:
            raise CompactorError(
                f"table {identifier}: cannot load table {'.'.join(other)} of catalog "
                f"{catalog.name!r} to learn its location ({first_line(exc)}); deleting nothing"
            ) from exc

    others = [t for t in identifiers if t != own]
    with ThreadPoolExecutor(LOAD_THREADS) as pool:
        return [t for t in pool.map(load, others) if t is not None]


def _check_not_a_root(
    catalog: Catalog, namespaces: list[tuple[str, ...]], table: Table, identifier: str, own: str
) -> None:
    """Refuse a location that holds the warehouse or a namespace's location."""
    roots = {"warehouse": catalog.properties.get("warehouse")}
    for namespace in namespaces:
        try:
            location = catalog.load_namespace_properties(namespace).get("location")
        except NoSuchNamespaceError:
            continue
        except Exception as exc:
            raise _listing_failed(catalog, identifier, exc) from exc
        roots[f"namespace {'.'.join(namespace)}'s location"] = location
    for what, location in roots.items():
        try:  # a REST catalog's warehouse may be a name, not a location
            key = location_key(location).rstrip("/") if location else None
        except UnsafePathError:
            continue
        if key is not None and _within_or_equal(key, own):
            raise UnsafeLocationError(
                f"table {identifier}: location {table.metadata.location} holds the {what} "
                f"{location} of catalog {catalog.name!r}; refusing to sweep it for orphans"
            )


def other_tables_fences(
    catalog: Catalog, table: Table, identifier: str, *, sweep: bool = False
) -> Fences:
    """The fences inside ``table``'s location; raise when deleting there is unsafe at all.

    Another table keeping files at this very location or in its metadata directory (a table
    registered from this one's metadata) is refused. With ``sweep`` (an orphan sweep, which
    lists the whole location) a location holding the catalog's warehouse or a namespace's
    location is refused too.
    """
    own = _key(table.metadata.location, identifier)
    namespaces = _namespaces(catalog, identifier)
    if sweep:
        _check_not_a_root(catalog, namespaces, table, identifier, own)
    fences = Fences()
    for other in _load_others(catalog, namespaces, tuple(table.name()), identifier):
        name = ".".join(other.name())
        for location in _locations(other):
            key = _key(location, name)
            if key in (own, own + "/metadata"):
                raise UnsafeLocationError(
                    f"table {identifier}: table {name} of catalog {catalog.name!r} keeps files "
                    f"in this table's location {table.metadata.location}; refusing to delete any"
                )
            if key.startswith(own + "/"):
                fences.add(key, name)
    return fences


def tables_in_listing(table: Table, keys: Iterable[str], fences: Fences) -> None:
    """Fence off directories of a listing (its files' location keys) that hold
    ``metadata/*.metadata.json`` (not ours)."""
    own = location_key(table.metadata.location).rstrip("/")
    for key in keys:
        directory, _, name = key.rpartition("/")
        root, _, leaf = directory.rpartition("/")
        if leaf == "metadata" and name.endswith(".metadata.json") and root.startswith(own + "/"):
            fences.add(root, f"a table at {root}")
