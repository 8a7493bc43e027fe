"""The remedy the daemon picks for each partition's delete files, and the reasons it gives."""

from __future__ import annotations

from typing import Any

from compactor.daemon.fragmentation import (
    MANIFESTS,
    Fragmentation,
    deletes_due_reasons,
    due_reasons,
)
from compactor.daemon.jobfiles import CompactAction, RewriteDeletesAction
from compactor.daemon.remedies import PartitionFiles, choose_remedies


def _deletes(**given: Any) -> RewriteDeletesAction:
    return RewriteDeletesAction(every="1h", **{"min_equality_delete_files": 4, **given})


def _part(name: str, data: int, small: int, equality: int = 0, position: int = 0) -> PartitionFiles:
    return PartitionFiles(name, data, small, equality, position)


def _fragmentation(*parts: PartitionFiles, format_version: int = 2) -> Fragmentation:
    return Fragmentation(
        "db.t",
        1,
        data_files=sum(p.data_files for p in parts),
        data_bytes=0,
        delete_files=sum(p.equality_delete_files + p.position_delete_files for p in parts),
        source=MANIFESTS,
        manifests_read=1,
        small_files=sum(p.small_files for p in parts),
        format_version=format_version,
        delete_partitions=parts,
    )


SIZED = _part("region=eu", data=10, small=0, equality=4)
SMALL = _part("region=us", data=10, small=10, equality=4)
MIXED = _part("region=apac", data=10, small=6, equality=5)  # some right-sized files stay
FEW = _part("region=latam", data=10, small=0, equality=3)


def test_equality_deletes_over_small_data_are_compacted_elsewhere_converted() -> None:
    found = choose_remedies([SIZED, SMALL, MIXED, FEW], 2, _deletes(), compacts=True)
    assert found.compact == (SMALL,)
    assert found.convert == (SIZED, MIXED)
    assert found.rewrite_deletes == ()
    assert found.left_to_conversion == 4 + 5 + 3  # FEW's too: below the threshold, not compacted


def test_without_a_compaction_every_partition_due_is_converted() -> None:
    found = choose_remedies([SIZED, SMALL, FEW], 2, _deletes(), compacts=False)
    assert (found.compact, found.convert) == ((), (SIZED, SMALL))


def test_a_partition_without_data_files_is_converted() -> None:
    """Global deletes sit in the partition of an unpartitioned spec, with no data file."""
    only_deletes = _part("(unpartitioned)", data=0, small=0, equality=4)
    assert choose_remedies([only_deletes], 2, _deletes(), compacts=True).convert == (only_deletes,)


def test_no_conversion_when_the_job_keeps_equality_deletes() -> None:
    found = choose_remedies([SIZED, SMALL], 2, _deletes(convert_equality_deletes=False), True)
    assert (found.compact, found.convert, found.left_to_conversion) == ((), (), 0)


def test_position_delete_files_are_rewritten_on_format_2_only() -> None:
    many = _part("region=eu", data=10, small=0, position=5)
    few = _part("region=us", data=10, small=0, position=4)
    assert choose_remedies([many, few], 2, _deletes(), True).rewrite_deletes == (many,)
    assert choose_remedies([many, few], 3, _deletes(), True).rewrite_deletes == ()


def test_no_deletes_section_no_remedy() -> None:
    found = choose_remedies([SIZED, SMALL], 2, None, compacts=True)
    assert found == choose_remedies([], 2, None, compacts=True)


def test_compaction_does_not_count_the_equality_deletes_a_conversion_takes() -> None:
    compact = CompactAction(every="1m", min_small_files=100, min_delete_files=8)
    sized = _part("region=eu", data=10, small=0, equality=6, position=3)
    found = _fragmentation(sized)
    assert due_reasons(found, compact) == ["9 delete files >= min_delete_files 8"]
    assert due_reasons(found, compact, _deletes()) == []
    reasons, convert = deletes_due_reasons(found, compact, _deletes())
    assert convert
    assert reasons == [
        "6 equality-delete files in 1 partition (most: 'region=eu', 6) >= "
        "min_equality_delete_files 4: converted"
    ]


def test_equality_deletes_over_small_data_make_a_compaction_due() -> None:
    compact = CompactAction(every="1m", min_small_files=100, min_delete_files=100)
    found = _fragmentation(SMALL, _part("region=eu", data=10, small=10, equality=6))
    assert due_reasons(found, compact) == []
    assert due_reasons(found, compact, _deletes()) == [
        "10 equality-delete files in 2 partitions (most: 'region=eu', 6) whose data files a "
        "compaction rewrites anyway >= min_equality_delete_files 4"
    ]
    assert deletes_due_reasons(found, compact, _deletes()) == ([], False)
