"""Every file a table's metadata can reach: the ground truth for deciding what may be deleted."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from pyiceberg.manifest import ManifestFile
from pyiceberg.table import Table

MANIFEST_READERS = 8


@dataclass
class References:
    """Paths reachable from the snapshots of a table's metadata, by kind."""

    manifest_lists: set[str] = field(default_factory=set)
    manifests: set[str] = field(default_factory=set)
    content_files: set[str] = field(default_factory=set)
    statistics: set[str] = field(default_factory=set)

    def all(self) -> set[str]:
        return self.manifest_lists | self.manifests | self.content_files | self.statistics


def table_references(table: Table) -> References:
    """Files reachable from any snapshot still in ``table``'s metadata (every ref, every entry).

    Entries of every status count (a DELETED entry still names a file its snapshot's parent
    reads), and so do statistics files.
    """
    refs = References()
    metadata, io = table.metadata, table.io
    manifests: dict[str, ManifestFile] = {}
    for snapshot in metadata.snapshots:
        refs.manifest_lists.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(io):
            manifests.setdefault(manifest.manifest_path, manifest)
    refs.manifests = set(manifests)
    refs.statistics = {s.statistics_path for s in metadata.statistics}
    refs.statistics |= {s.statistics_path for s in metadata.partition_statistics}

    def paths(manifest: ManifestFile) -> list[str]:
        return [
            e.data_file.file_path for e in manifest.fetch_manifest_entry(io, discard_deleted=False)
        ]

    with ThreadPoolExecutor(MANIFEST_READERS) as pool:
        for found in pool.map(paths, manifests.values()):
            refs.content_files.update(found)
    return refs
