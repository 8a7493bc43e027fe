"""Plan a manifest rewrite: which of the current snapshot's manifests to rewrite, and into how many.

Spark's ``RewriteManifestsSparkAction``: a snapshot's manifests are grouped by content (data,
deletes) and partition spec; a group's live entries are rewritten clustered by partition into
manifests of about the target size (``commit.manifest.target-size-bytes``). A group is
rewritten only when it is out of order (:func:`rewrite_reasons`), decided from the manifest list
alone:

- **too many manifests**: more than its bytes fill at ``MIN_MANIFEST_FILL`` (80%) of the target
  each, ``ceil(bytes / (0.8 x target))`` (so many small manifests are merged, and what a rewrite
  writes, about ``ceil(bytes / target)`` manifests, is left alone);
- **an oversized manifest**: one with more than one live entry, over ``MAX_MANIFEST_FILL`` (150%)
  of the target;
- **a manifest without a live entry** (only DELETED entries);
- **not clustered**: two manifests whose ranges of the spec's first partition field (first
  non-``void`` field; the manifest list's partition summaries, nulls first, NaN last) overlap
  by more than one boundary value. A rewrite sorts entries by the whole partition tuple, so its
  manifests' ranges meet at most at one value: a partition large enough to span two manifests.
  Unpartitioned specs are always clustered.

:func:`clustered_entries` reads a group's live entries, sorted by partition (as Java orders
partition values, :func:`~compactor.iceberg.value_keys.partition_sort_key`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import (
    ManifestContent,
    ManifestEntry,
    ManifestFile,
    PartitionFieldSummary,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import VoidTransform
from pyiceberg.types import PrimitiveType

from compactor.errors import UsageError
from compactor.iceberg.pyiceberg_compat import snapshot_manifests
from compactor.iceberg.value_keys import partition_sort_key, value_sort_key
from compactor.options.defaults import MAX_MANIFEST_FILL, MIN_MANIFEST_FILL
from compactor.planning.planner import read_manifests
from compactor.sizes import format_size

CONTENT_NAMES = {ManifestContent.DATA: "data", ManifestContent.DELETES: "deletes"}

# A manifest's range of one partition field: (lowest, highest) as value_sort_key keys.
Range = tuple[tuple[Any, ...], tuple[Any, ...]]


def content_name(content: ManifestContent) -> str:
    """``data`` or ``deletes``."""
    return CONTENT_NAMES[ManifestContent(content or ManifestContent.DATA)]


def live_entries(manifest: ManifestFile) -> int:
    """The manifest's live (added and existing) entries, from the manifest list."""
    return (manifest.added_files_count or 0) + (manifest.existing_files_count or 0)


def has_no_live_entry(manifest: ManifestFile) -> bool:
    """Whether the manifest list says ``manifest`` holds DELETED entries only."""
    return (
        manifest.added_files_count == 0
        and manifest.existing_files_count == 0
        and bool(manifest.deleted_files_count)
    )


def count_by_content(manifests: Iterable[ManifestFile]) -> dict[str, int]:
    """Manifests by content: ``{"data": n, "deletes": n}``."""
    counts = dict.fromkeys(CONTENT_NAMES.values(), 0)
    for manifest in manifests:
        counts[content_name(manifest.content)] += 1
    return counts


def entries_by_content(manifests: Iterable[ManifestFile]) -> dict[str, int]:
    """Live entries by content: ``{"data": n, "deletes": n}``, from the manifest list."""
    counts = dict.fromkeys(CONTENT_NAMES.values(), 0)
    for manifest in manifests:
        counts[content_name(manifest.content)] += live_entries(manifest)
    return counts


@dataclass(frozen=True)
class ManifestGroup:
    """The manifests of one content and one partition spec, and why they are rewritten (none:
    they are in order and left alone)."""

    group_id: int
    content: ManifestContent
    spec_id: int
    manifests: tuple[ManifestFile, ...]
    reasons: tuple[str, ...] = ()

    @property
    def paths(self) -> frozenset[str]:
        return frozenset(m.manifest_path for m in self.manifests)

    @property
    def bytes(self) -> int:
        return sum(m.manifest_length for m in self.manifests)

    @property
    def entries(self) -> int:
        """Live entries, from the manifest list."""
        return sum(live_entries(m) for m in self.manifests)

    @property
    def content_name(self) -> str:
        return content_name(self.content)


@dataclass(frozen=True)
class ManifestPlan:
    """What a manifest rewrite starts from: one snapshot, its manifests, and their groups."""

    snapshot_id: int | None
    target_size: int
    manifests: tuple[ManifestFile, ...] = ()
    # Groups out of order (rewritten) and in order (left alone), of the spec asked for.
    groups: tuple[ManifestGroup, ...] = ()
    in_order: tuple[ManifestGroup, ...] = ()

    @property
    def start_manifests(self) -> frozenset[str]:
        return frozenset(m.manifest_path for m in self.manifests)


def plan_manifest_rewrite(
    table: Table, target_size: int, spec_id: int | None = None
) -> ManifestPlan:
    """Group the current snapshot's manifests by (content, spec) and decide which groups to
    rewrite; only spec ``spec_id``'s when given. Reads the manifest list only."""
    metadata = table.metadata
    specs = metadata.specs()
    if spec_id is not None and spec_id not in specs:
        known = ", ".join(str(s) for s in sorted(specs))
        raise UsageError(
            f"spec_id {spec_id}: the table has no partition spec {spec_id} (its specs: {known})",
            "spec_id",
        )
    snapshot = table.current_snapshot()
    if snapshot is None:
        return ManifestPlan(None, target_size)
    manifests = snapshot_manifests(table.io, snapshot, metadata.format_version)
    by_key: dict[tuple[ManifestContent, int], list[ManifestFile]] = defaultdict(list)
    for manifest in manifests:
        if spec_id is None or manifest.partition_spec_id == spec_id:
            # (a v1 manifest list has no content: it reads as 0, data)
            content = ManifestContent(manifest.content or ManifestContent.DATA)
            by_key[(content, manifest.partition_spec_id)].append(manifest)
    schema = metadata.schema()
    groups: list[ManifestGroup] = []
    in_order: list[ManifestGroup] = []
    for n, ((content, spec), found) in enumerate(
        sorted(by_key.items(), key=lambda kv: (kv[0][0].value, kv[0][1]))
    ):
        ranges = first_field_ranges(specs.get(spec), schema, found)
        reasons = rewrite_reasons(found, target_size, ranges)
        group = ManifestGroup(n, content, spec, tuple(found), tuple(reasons))
        (groups if reasons else in_order).append(group)
    return ManifestPlan(
        snapshot.snapshot_id, target_size, tuple(manifests), tuple(groups), tuple(in_order)
    )


def rewrite_reasons(
    manifests: Sequence[ManifestFile], target_size: int, ranges: Sequence[Range | None]
) -> list[str]:
    """Why a group's ``manifests`` (``ranges``: each one's range of the first partition field,
    None where unknown or unpartitioned) should be rewritten; empty when they are in order."""
    reasons = []
    count = len(manifests)
    total = sum(m.manifest_length for m in manifests)
    enough = max(1, math.ceil(total / (MIN_MANIFEST_FILL * target_size)))
    if count > enough:
        reasons.append(f"{count} manifests where {enough} would hold their {format_size(total)}")
    oversized = [
        m
        for m in manifests
        if live_entries(m) > 1 and m.manifest_length > MAX_MANIFEST_FILL * target_size
    ]
    if oversized:
        reasons.append(
            f"{len(oversized)} over {MAX_MANIFEST_FILL:.0%} of the target size "
            f"{format_size(target_size)}"
        )
    empty = sum(1 for m in manifests if has_no_live_entry(m))
    if empty:
        reasons.append(f"{empty} without a live entry")
    if count > 1 and overlapping(ranges):
        reasons.append("partition ranges overlap")
    return reasons


def overlapping(ranges: Iterable[Range | None]) -> bool:
    """Whether two of ``ranges`` (the unknown ones left out) share more than a boundary value."""
    known = sorted(r for r in ranges if r is not None)
    highest: tuple[Any, ...] | None = None
    for lowest, upper in known:
        if highest is not None and lowest < highest:
            return True
        highest = upper if highest is None else max(highest, upper)
    return False


def first_field_ranges(
    spec: PartitionSpec | None, schema: Schema, manifests: Sequence[ManifestFile]
) -> list[Range | None]:
    """Each manifest's range of the spec's first non-``void`` partition field, from its
    partition summary; all None for an unpartitioned spec or a field whose type is unknown."""
    field = _first_field(spec, schema)
    if field is None:
        return [None] * len(manifests)
    position, kind = field
    return [_summary_range(m, position, kind) for m in manifests]


def _first_field(spec: PartitionSpec | None, schema: Schema) -> tuple[int, PrimitiveType] | None:
    if spec is None:
        return None
    for position, field in enumerate(spec.fields):
        if isinstance(field.transform, VoidTransform):
            continue
        try:
            kind = field.transform.result_type(schema.find_type(field.source_id))
        except ValueError:  # its source column was dropped: the range is unknown
            return None
        return (position, kind) if isinstance(kind, PrimitiveType) else None
    return None


_NAN = float("nan")
_UNKNOWN = object()


def _summary_range(manifest: ManifestFile, position: int, kind: PrimitiveType) -> Range | None:
    """The range of one partition field in ``manifest``: nulls lowest, NaN highest."""
    summaries = manifest.partitions or []
    if position >= len(summaries):
        return None
    summary = summaries[position]
    try:
        lower, upper = _lower(summary, kind), _upper(summary, kind)
    except Exception:  # a bound that does not decode as the field's type
        return None
    if lower is _UNKNOWN or upper is _UNKNOWN:
        return None
    return value_sort_key(lower), value_sort_key(upper)


def _lower(summary: PartitionFieldSummary, kind: PrimitiveType) -> Any:
    if summary.contains_null:
        return None
    if summary.lower_bound is not None:
        return from_bytes(kind, summary.lower_bound)
    return _NAN if summary.contains_nan else _UNKNOWN


def _upper(summary: PartitionFieldSummary, kind: PrimitiveType) -> Any:
    if summary.contains_nan:
        return _NAN
    if summary.upper_bound is not None:
        return from_bytes(kind, summary.upper_bound)
    return None if summary.contains_null else _UNKNOWN


def clustered_entries(
    table: Table, group: ManifestGroup, on_read: Callable[[], None] | None = None
) -> list[ManifestEntry]:
    """The live entries of ``group``'s manifests, sorted by partition (stable: entries of one
    partition keep the manifest list's order); ``on_read()`` after each manifest read."""
    entries: list[ManifestEntry] = []
    for _, found in read_manifests(table, group.manifests):
        entries.extend(found)
        if on_read is not None:
            on_read()
    entries.sort(key=lambda e: partition_sort_key(e.data_file.partition))
    return entries


def split_evenly(count: int, parts: int) -> list[int]:
    """``count`` entries in ``parts`` consecutive runs whose sizes differ by at most one."""
    parts = max(1, min(parts, count))
    base, extra = divmod(count, parts)
    return [base + (1 if n < extra else 0) for n in range(parts)] if count else []


@dataclass(frozen=True)
class ManifestStats:
    """A table's manifests, from its current manifest list, and its metadata files."""

    manifests: dict[str, int]  # by content: data, deletes
    entries: dict[str, int]  # live entries, by content
    metadata_files: int  # metadata.json files the table lists: the current one and its log

    @property
    def total(self) -> int:
        return sum(self.manifests.values())

    @property
    def average_entries(self) -> float:
        """Live entries per manifest (0 without manifests)."""
        return sum(self.entries.values()) / self.total if self.total else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "manifests": dict(self.manifests),
            "manifest_entries": dict(self.entries),
            "average_entries_per_manifest": round(self.average_entries, 1),
            "metadata_files": self.metadata_files,
        }


def manifest_stats(table: Table) -> ManifestStats:
    """How many manifests the current snapshot has and what they hold. Reads the manifest
    list only."""
    metadata = table.metadata
    snapshot = table.current_snapshot()
    manifests = snapshot_manifests(table.io, snapshot, metadata.format_version) if snapshot else []
    return ManifestStats(
        count_by_content(manifests),
        entries_by_content(manifests),
        len(metadata.metadata_log) + 1,
    )
