"""Plan the conversion of equality deletes into position deletes: what each one applies to.

:func:`plan_equality_conversion` reads the manifests of a branch's head once and returns an
:class:`EqualityPlan`: one :class:`EqualityGroup` per (spec id, partition) of the data files
that equality deletes apply to, and of the partitions whose equality deletes apply to nothing.
Which delete applies to which data file is the data-file planner's rule
(:class:`~compactor.planning.planner.EqualityDeleteIndex`): a delete applies to the data files
with a strictly lower data sequence number, in its partition, or in every partition when its
spec is unpartitioned (a *global* delete). A group's inputs are those data files, each with
the deletes that apply to it; its deletes go once its positions are committed. A global delete
goes once every group whose inputs it applies to is committed, and only from a run without a
row filter, which sees every file it could apply to. On format 3 each input also carries the
position deletes that apply to it (its deletion vector, else its position delete files): the
deletion vector the conversion writes for it must hold them too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestEntry
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.typedef import Record

from compactor.iceberg.pyiceberg_compat import (
    FilePruner,
    PositionDeleteIndex,
    delete_file_key,
    is_deletion_vector,
    referenced_data_file,
    snapshot_manifests,
)
from compactor.iceberg.value_keys import PartitionKey, partition_key
from compactor.planning.delete_groups import LiveData, sequence_number
from compactor.planning.health import delete_file_kinds
from compactor.planning.planner import (
    EqualityDeleteIndex,
    InputFile,
    branch_head,
    is_unpartitioned,
    partition_path,
    read_manifests,
)

# Why an equality delete is left alone.
COLUMNS_NOT_IN_SCHEMA = "equality_deletes_on_columns_no_longer_in_the_schema"
GLOBAL_WITH_WHERE = "global_equality_deletes_with_a_row_filter"
NOT_PARQUET = "equality_deletes_not_in_parquet"


@dataclass(frozen=True)
class EqualityGroup:
    """The data files of one (spec, partition) that equality deletes apply to, and the
    partition's own equality deletes, converted together."""

    group_id: int
    spec_id: int
    partition: Record
    partition_path: str
    # Each data file an equality delete applies to, with those deletes (its ``delete_files``).
    inputs: tuple[InputFile, ...]
    # The partition's own (not global) equality deletes: removed when the group is committed.
    equality_deletes: tuple[ManifestEntry, ...]
    # The start snapshot's manifests that list ``equality_deletes``.
    manifests: frozenset[str] = frozenset()
    # The data sequence number of every equality delete converted, by path.
    sequence_numbers: Mapping[str, int] = field(default_factory=dict)
    # Format 3: the position deletes that apply to each input (its deletion vector, else its
    # position delete files), merged into the deletion vector the conversion writes for it;
    # and the start snapshot's manifest of each of those (by ``delete_file_key``).
    previous: Mapping[str, tuple[DataFile, ...]] = field(default_factory=dict)
    previous_manifests: Mapping[str, str] = field(default_factory=dict)

    @property
    def paths(self) -> set[str]:
        """The partition's equality deletes (paths) that the group removes."""
        return {e.data_file.file_path for e in self.equality_deletes}

    @property
    def global_deletes(self) -> set[str]:
        """The global equality deletes (paths) that apply to the group's inputs."""
        own = self.paths
        return {d.file_path for f in self.inputs for d in f.delete_files} - own

    @property
    def input_paths(self) -> set[str]:
        return {f.path for f in self.inputs}

    @property
    def key_bytes(self) -> int:
        """Stored bytes of the key columns the conversion reads (the files' column sizes)."""
        total = 0
        for f in self.inputs:
            sizes = f.data_file.column_sizes or {}
            ids = {i for d in f.delete_files for i in (d.equality_ids or ())}
            total += sum(sizes.get(i, 0) for i in ids)
        return total

    @property
    def data_sequence_number(self) -> int:
        """The largest data sequence number of an equality delete that applies to an input:
        the position deletes written for the group keep it (the spec lets a position delete
        apply to data files of a sequence number up to its own)."""
        seqs = [self.sequence_numbers[d.file_path] for f in self.inputs for d in f.delete_files]
        return max(seqs, default=0)


@dataclass(frozen=True)
class EqualityPlan:
    """What a conversion starts from: a branch head, its groups, and its global deletes."""

    snapshot_id: int | None = None
    branch: str = MAIN_BRANCH
    start_manifests: frozenset[str] = frozenset()
    groups: tuple[EqualityGroup, ...] = ()
    # Global equality deletes converted: entry and start manifest, by path.
    global_deletes: Mapping[str, tuple[ManifestEntry, str]] = field(default_factory=dict)
    # Data sequence number of every equality delete converted, by path.
    sequence_numbers: Mapping[str, int] = field(default_factory=dict)
    # Live data files by path: (data sequence number, spec id, partition) of each entry.
    live: LiveData = field(default_factory=dict)
    # Equality delete files left alone, by reason.
    skipped: Mapping[str, int] = field(default_factory=dict)
    # Live delete files of the head by kind (position, equality, deletion_vector).
    delete_files: Mapping[str, int] = field(default_factory=dict)
    format_version: int = 2

    @property
    def equality_deletes(self) -> int:
        """Equality delete files the plan converts."""
        return sum(len(g.equality_deletes) for g in self.groups) + len(self.global_deletes)

    def global_targets(self) -> dict[str, set[int]]:
        """Global delete path -> the groups whose inputs it applies to (all must commit)."""
        targets: dict[str, set[int]] = {path: set() for path in self.global_deletes}
        for group in self.groups:
            for path in group.global_deletes:
                targets[path].add(group.group_id)
        return targets


def _convertible(delete_file: DataFile, top_level: set[int]) -> str | None:
    """Why an equality delete cannot be converted, or None."""
    if not set(delete_file.equality_ids or ()) <= top_level:
        return COLUMNS_NOT_IN_SCHEMA
    if delete_file.file_format != FileFormat.PARQUET:
        return NOT_PARQUET
    return None


def plan_equality_conversion(
    table: Table,
    identifier: str,
    row_filter: BooleanExpression,
    branch: str = MAIN_BRANCH,
) -> EqualityPlan:
    """The equality deletes of ``branch``'s head and the data files each applies to, by
    (spec, partition) of those data files; only the partitions ``row_filter`` may touch (then
    global deletes are left alone: a filtered run does not see every file they apply to)."""
    metadata = table.metadata
    snapshot = branch_head(table, identifier, branch)
    if snapshot is None:
        return EqualityPlan(branch=branch, format_version=metadata.format_version)
    manifests = snapshot_manifests(table.io, snapshot, metadata.format_version)
    pruner = FilePruner(metadata, row_filter)
    specs = metadata.specs()
    top_level = {f.field_id for f in metadata.schema().fields}
    filtered = not isinstance(row_filter, AlwaysTrue)
    data: list[ManifestEntry] = []
    live: defaultdict[str, list[tuple[int, int, Record]]] = defaultdict(list)
    deletes: list[tuple[ManifestEntry, str]] = []
    all_deletes: list[DataFile] = []
    skipped: defaultdict[str, int] = defaultdict(int)
    # Format 3: deletion vectors by the data file they name, and position delete files.
    dvs: defaultdict[str, list[tuple[int, DataFile]]] = defaultdict(list)
    positions = PositionDeleteIndex()
    delete_manifests: dict[str, str] = {}
    for manifest, entries in read_manifests(table, manifests):
        for entry in entries:
            data_file = entry.data_file
            if data_file.content == DataFileContent.DATA:
                live[data_file.file_path].append(
                    (sequence_number(entry), data_file.spec_id, data_file.partition)
                )
                if pruner.partition_may_match(data_file):
                    data.append(entry)
                continue
            all_deletes.append(data_file)
            if data_file.content == DataFileContent.POSITION_DELETES:
                if metadata.format_version >= 3:
                    delete_manifests[delete_file_key(data_file)] = manifest.manifest_path
                    if is_deletion_vector(data_file):
                        target = referenced_data_file(data_file) or ""
                        dvs[target].append((sequence_number(entry), data_file))
                    else:
                        positions.add_delete_file(entry)
                continue
            is_global = is_unpartitioned(specs[data_file.spec_id])
            if not is_global and not pruner.partition_may_match(data_file):
                continue
            reason = _convertible(data_file, top_level)
            if reason is None and is_global and filtered:
                reason = GLOBAL_WITH_WHERE
            if reason is not None:
                skipped[reason] += 1
                continue
            deletes.append((entry, manifest.manifest_path))

    index = EqualityDeleteIndex(specs, [e for e, _ in deletes])
    sequence_numbers = index.sequence_numbers
    # (spec id, partition key) -> inputs; the partition-scoped deletes and their manifests.
    inputs: dict[tuple[int, PartitionKey], list[InputFile]] = defaultdict(list)
    partitions: dict[tuple[int, PartitionKey], Record] = {}
    own: dict[tuple[int, PartitionKey], list[tuple[ManifestEntry, str]]] = defaultdict(list)
    global_deletes: dict[str, tuple[ManifestEntry, str]] = {}
    for entry, manifest_path in deletes:
        delete_file = entry.data_file
        if is_unpartitioned(specs[delete_file.spec_id]):
            global_deletes[delete_file.file_path] = (entry, manifest_path)
            continue
        key = (delete_file.spec_id, partition_key(delete_file.partition))
        own[key].append((entry, manifest_path))
        partitions.setdefault(key, delete_file.partition)
    for entry in data:
        applying = index.for_data_file(entry)
        if not applying:
            continue
        data_file = entry.data_file
        key = (data_file.spec_id, partition_key(data_file.partition))
        partitions.setdefault(key, data_file.partition)
        inputs[key].append(
            InputFile(
                data_file,
                sequence_number(entry),
                tuple(sorted(applying, key=lambda d: (sequence_numbers[d.file_path], d.file_path))),
                entry.file_sequence_number,
                entry=entry,
            )
        )

    schema = metadata.schema()
    groups = []
    for key, partition in partitions.items():
        spec_id = key[0]
        found = sorted(own.get(key, []), key=lambda item: item[0].data_file.file_path)
        files = sorted(inputs.get(key, []), key=lambda f: (f.data_sequence_number, f.path))
        previous: dict[str, tuple[DataFile, ...]] = {}
        if metadata.format_version >= 3:
            for f in files:
                seq = f.data_sequence_number
                # A DV holds every deleted position of its file; readers then ignore the
                # position delete files (as the data-file planner does).
                dv = [d for d_seq, d in dvs.get(f.path, []) if d_seq >= seq]
                applying = dv or sorted(
                    positions.for_data_file(seq, f.data_file), key=lambda d: d.file_path
                )
                if applying:
                    previous[f.path] = tuple(applying)
        groups.append(
            EqualityGroup(
                group_id=0,
                spec_id=spec_id,
                partition=partition,
                partition_path=partition_path(specs[spec_id], schema, partition),
                inputs=tuple(files),
                equality_deletes=tuple(e for e, _ in found),
                manifests=frozenset(m for _, m in found),
                sequence_numbers=sequence_numbers,
                previous=previous,
                previous_manifests={
                    delete_file_key(d): delete_manifests[delete_file_key(d)]
                    for found_deletes in previous.values()
                    for d in found_deletes
                },
            )
        )
    if not groups and global_deletes:  # global deletes that apply to nothing: one group takes them
        entry, _ = next(iter(global_deletes.values()))
        spec_id = entry.data_file.spec_id
        groups.append(
            EqualityGroup(0, spec_id, Record(), "", (), (), sequence_numbers=sequence_numbers)
        )
    groups.sort(
        key=lambda g: (-len(g.inputs), -len(g.equality_deletes), g.spec_id, g.partition_path)
    )
    return EqualityPlan(
        snapshot_id=snapshot.snapshot_id,
        branch=branch,
        start_manifests=frozenset(m.manifest_path for m in manifests),
        groups=tuple(replace(g, group_id=n) for n, g in enumerate(groups)),
        global_deletes=global_deletes,
        sequence_numbers=sequence_numbers,
        live=live,
        skipped=dict(skipped),
        delete_files=delete_file_kinds(all_deletes),
        format_version=metadata.format_version,
    )
