"""Equality-delete keys probed batch by batch: which rows a set of deleted keys names, and with
which sequence number, compared as Iceberg Java compares them; and the applier that filters a
data file's batches with them, row order and schema kept."""

from __future__ import annotations

import datetime as dt
import random
import uuid
from collections.abc import Callable, Hashable, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType

from compactor.iceberg.value_keys import value_key
from compactor.planning.planner import TaskInput
from compactor.rewrite import deleted_keys
from compactor.rewrite.deleted_keys import NO_DELETE, DeletedKeys
from compactor.rewrite.equality_deletes import FIELD_ID, EqualityDeleteApplier


def reference(
    deletes: Sequence[pa.Array], sequences: Sequence[int], batch: Sequence[pa.Array]
) -> list[int]:
    """The newest deleting sequence number of each row's key, by Python value keys (floats by
    their canonical bits, None equal to None)."""
    newest: dict[tuple[Hashable, ...], int] = {}
    for row, sequence in zip(
        zip(*(c.to_pylist() for c in deletes), strict=True), sequences, strict=True
    ):
        key = tuple(value_key(v) for v in row)
        newest[key] = max(newest.get(key, NO_DELETE), sequence)
    return [
        newest.get(tuple(value_key(v) for v in row), NO_DELETE)
        for row in zip(*(c.to_pylist() for c in batch), strict=True)
    ]


def newest(
    deletes: Sequence[pa.Array], sequences: Sequence[int], batch: Sequence[pa.Array]
) -> list[int]:
    result: list[int] = DeletedKeys(deletes, sequences).newest(batch).tolist()
    return result


def floats(bits: Sequence[int], kind: pa.DataType | None = None) -> pa.Array:
    """Floats (doubles unless ``kind`` says otherwise) of the given bit patterns (NaNs with any
    payload, signed zeros)."""
    if kind is None or kind == pa.float64():
        return pa.array(np.array(bits, np.uint64).view(np.float64), pa.float64())
    return pa.array(np.array(bits, np.uint32).view(np.float32), kind)


def test_a_null_key_deletes_null_rows_and_only_them() -> None:
    deletes = [pa.array([None, 5], pa.int64())]
    batch = [pa.array([None, 0, 5, None, 6], pa.int64())]

    assert newest(deletes, [3, 3], batch) == [3, NO_DELETE, 3, 3, NO_DELETE]
    # Without a null among the deletes, a null row (its value slot zero) is not value 0's.
    assert newest([pa.array([0], pa.int64())], [3], batch) == [-1, 3, -1, -1, -1]


def test_every_nan_is_one_key_and_signed_zeros_are_two() -> None:
    quiet, payload, negative = 0x7FF8000000000000, 0x7FF0000000000001, 0xFFF8000000000123
    deletes = [floats([payload, 0x8000000000000000])]  # a NaN and -0.0
    batch = [floats([quiet, negative, 0, 0x8000000000000000, 0x3FF0000000000000])]

    assert newest(deletes, [4, 4], batch) == [4, 4, NO_DELETE, 4, NO_DELETE]


def test_float32_nans_and_zeros_compare_by_their_canonical_bits() -> None:
    deletes = [floats([0x7FC00001, 0], pa.float32())]  # a NaN with a payload and 0.0
    batch = [floats([0xFFC00000, 0x7F800001, 0x80000000, 0, 0x3F800000], pa.float32())]

    assert newest(deletes, [2, 2], batch) == [2, 2, NO_DELETE, 2, NO_DELETE]


def test_a_multi_column_key_matches_on_every_column_nulls_included() -> None:
    deletes = [pa.array([1, None, 1, None], pa.int64()), pa.array(["a", "a", None, None])]
    batch = [
        pa.array([1, 1, None, None, 1, None, 2, 2], pa.int64()),
        pa.array(["a", None, "a", None, "b", "b", "a", None]),
    ]

    assert newest(deletes, [1, 2, 3, 4], batch) == [1, 3, 2, 4] + [NO_DELETE] * 4


def test_strings_and_binary_match_byte_for_byte() -> None:
    long = "x" * 5000 + "y"  # longer than the hash's table of position weights
    deleted = ["", "a", "é", long, "a\x00"]
    batch = ["", None, "a", "a\x00", "a\x00\x00", "\x00", "é", "e", long, long[:-1] + "z"]
    for kind in (pa.string(), pa.large_string()):
        keys = DeletedKeys([pa.array(deleted, kind)], [1] * len(deleted))
        assert keys.newest([pa.array(batch, kind)]).tolist() == [1, -1, 1, 1, -1, -1, 1, -1, 1, -1]
    raw = [b"", b"\x00", b"\xff", b"ab"]
    probe = [b"\x00", b"", b"\x00\x00", b"a", b"ab", b"ba", b"\xff", None]
    for kind in (pa.binary(), pa.large_binary()):
        keys = DeletedKeys([pa.array(raw, kind)], [2] * len(raw))
        assert keys.newest([pa.array(probe, kind)]).tolist() == [2, 2, -1, -1, 2, -1, 2, -1]


def _with_nulls_over(values: list[Any], kind: pa.DataType, nulls: list[int]) -> pa.Array:
    """``values`` with the rows ``nulls`` made null, their bytes left where they are."""
    array = pa.array(values, kind)
    validity = pa.array([i not in nulls for i in range(len(values))]).buffers()[1]
    return pa.Array.from_buffers(kind, len(values), [validity, *array.buffers()[1:]])


def test_the_bytes_under_a_null_are_not_part_of_its_key() -> None:
    for kind, values in [
        (pa.int64(), [7, 8, 9]),
        (pa.binary(16), [b"a" * 16, b"b" * 16, b"c" * 16]),
        (pa.string(), ["seven", "eight", "nine"]),
    ]:
        deletes = [_with_nulls_over(values[:2], kind, [0]), pa.array([1, 1], pa.int32())]
        batch = [_with_nulls_over(values, kind, [2]), pa.array([1, 1, 1], pa.int32())]
        assert batch[0].to_pylist() == [values[0], values[1], None]

        assert newest(deletes, [4, 5], batch) == [NO_DELETE, 5, 4]


def test_sliced_and_chunked_columns_are_read_from_their_offsets() -> None:
    deletes = [pa.array([10, 30], pa.int32()), pa.array(["q", "s"]), pa.array([True, False])]
    whole = [
        pa.array([99, 10, 20, 30, 10], pa.int32()),
        pa.array(["z", "q", "r", "s", "q"]),
        pa.array([False, True, True, False, False]),
    ]
    sliced = [c.slice(1) for c in whole]
    chunked = [pa.chunked_array([c.slice(1, 2), c.slice(3)]) for c in whole]

    expected = [5, NO_DELETE, 5, NO_DELETE]  # the last row's boolean differs
    assert newest(deletes, [5, 5], sliced) == expected
    assert DeletedKeys(deletes, [5, 5]).newest(chunked).tolist() == expected


def test_the_newest_of_several_deletes_of_a_key_wins() -> None:
    deletes = [pa.array([7, 7, 8, 7, 9], pa.int64())]
    keys = DeletedKeys(deletes, [3, 9, 2, 5, 4])
    batch = [pa.array([8, 7, 9, 6], pa.int64())]

    assert keys.newest(batch).tolist() == [2, 9, 4, NO_DELETE]
    # A row is deleted when a delete newer than its file's data sequence number names it.
    assert keys.deleted(batch, 3).tolist() == [False, True, True, False]
    assert keys.deleted(batch, 8).tolist() == [False, True, False, False]
    assert keys.deleted(batch, 9).tolist() == [False, False, False, False]
    assert len(keys) == 3


KINDS: dict[str, tuple[pa.DataType, Callable[[random.Random], Any]]] = {
    "long": (pa.int64(), lambda r: r.randint(-3, 3)),
    "int": (pa.int32(), lambda r: r.choice([0, -1, 2**31 - 1, 5])),
    "bool": (pa.bool_(), lambda r: r.random() < 0.5),
    "double": (pa.float64(), lambda r: r.choice([0.0, -0.0, float("nan"), 1.5, float("inf")])),
    "float": (pa.float32(), lambda r: r.choice([0.0, -0.0, float("nan"), -2.5])),
    "string": (pa.string(), lambda r: r.choice(["", "a", "ab", "\x00", "a\x00", "é"])),
    "binary": (pa.large_binary(), lambda r: r.choice([b"", b"\x00", b"\x00\x00", b"ab"])),
    "decimal": (pa.decimal128(9, 2), lambda r: Decimal(r.randint(-4, 4)).scaleb(-2)),
    "uuid": (pa.binary(16), lambda r: uuid.UUID(int=r.randint(0, 3) << r.choice([0, 64])).bytes),
    "fixed3": (pa.binary(3), lambda r: bytes([r.randint(0, 1)] * 2 + [r.randint(0, 2)])),
    "date": (pa.date32(), lambda r: dt.date(1970, 1, 1) + dt.timedelta(days=r.randint(-2, 2))),
    "timestamp": (
        pa.timestamp("us", "UTC"),
        lambda r: (
            dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=r.randint(0, 3))
        ),
    ),
    "time": (pa.time64("us"), lambda r: dt.time(0, 0, r.randint(0, 3))),
}


@pytest.mark.parametrize("seed", range(6))
def test_random_keys_of_every_type_match_the_reference(seed: int) -> None:
    rng = random.Random(seed)

    def column(name: str, rows: int) -> pa.Array:
        kind, value = KINDS[name]
        return pa.array([None if rng.random() < 0.15 else value(rng) for _ in range(rows)], kind)

    deleted = kept = 0
    for _ in range(40):
        names = rng.sample(sorted(KINDS), rng.randint(1, 3))
        rows = rng.randint(1, 25)
        deletes = [column(n, rows) for n in names]
        sequences = [rng.randint(1, 6) for _ in range(rows)]
        offset = rng.randint(0, 20)
        batch = [column(n, 120).slice(offset) for n in names]

        expected = reference(deletes, sequences, batch)
        assert newest(deletes, sequences, batch) == expected
        deleted += sum(s != NO_DELETE for s in expected)
        kept += expected.count(NO_DELETE)
    assert deleted > 100 and kept > 100  # both outcomes were tried


def test_keys_whose_combined_codes_would_overflow_are_made_dense_first() -> None:
    rng = np.random.default_rng(7)
    # Seven columns of 2,000 distinct values each: 2,000**7 combinations, far past 2**63.
    deletes = [pa.array(rng.integers(0, 2**62, 2_000)) for _ in range(7)]
    sequences = rng.integers(1, 9, 2_000).tolist()
    picked = pa.array(rng.integers(0, 2_000, 300))
    batch = [c.take(picked) for c in deletes]
    # Rows that share six columns with a deleted key but not the seventh are not deleted.
    batch[6] = pa.concat_arrays([batch[6].slice(0, 200), pa.array(rng.integers(0, 2**62, 100))])

    got = newest(deletes, sequences, batch)
    assert got == reference(deletes, sequences, batch)
    assert sum(s != NO_DELETE for s in got) == 200


def test_combined_codes_made_dense_at_every_word(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deleted_keys, "_RADIX_LIMIT", 4)
    rng = random.Random(3)
    deletes = [
        pa.array([rng.randint(0, 5) for _ in range(30)], pa.int64()),
        pa.array([rng.choice(["a", "b", None]) for _ in range(30)]),
        pa.array([uuid.UUID(int=rng.randint(0, 3) << 64).bytes for _ in range(30)], pa.binary(16)),
    ]
    batch = [
        pa.array([rng.randint(0, 6) for _ in range(300)], pa.int64()),
        pa.array([rng.choice(["a", "b", "c", None]) for _ in range(300)]),
        pa.array([uuid.UUID(int=rng.randint(0, 4) << 64).bytes for _ in range(300)], pa.binary(16)),
    ]
    sequences = [rng.randint(1, 4) for _ in range(30)]

    got = newest(deletes, sequences, batch)
    assert got == reference(deletes, sequences, batch)
    assert 0 < got.count(NO_DELETE) < 300


def test_a_hash_collision_never_deletes_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    # A hash of the length only: "b" and "c" collide with the deleted "a", and are kept.
    def by_length(self: Any, array: pa.Array) -> np.ndarray:
        return np.asarray(pa.compute.binary_length(array).fill_null(0), np.uint64)

    monkeypatch.setattr(deleted_keys._BytesHash, "__call__", by_length)
    keys = DeletedKeys([pa.array(["a", "dd"])], [1, 1])

    batch = [pa.array(["b", "a", "c", None, "dd", "de"])]
    assert keys.newest(batch).tolist() == [-1, 1, -1, -1, 1, -1]


def test_deleted_values_sharing_a_hash_under_every_seed_are_coded_exactly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def by_length(self: Any, array: pa.Array) -> np.ndarray:
        return np.asarray(pa.compute.binary_length(array).fill_null(0), np.uint64)

    monkeypatch.setattr(deleted_keys._BytesHash, "__call__", by_length)
    deletes = [pa.array(["a", "b", None, "cc"]), pa.array([1, 1, 1, 2], pa.int32())]
    batch = [pa.array(["b", "a", "c", None, "cc", "cc"]), pa.array([1, 2, 1, 1, 2, 1], pa.int32())]

    assert newest(deletes, [3, 4, 5, 6], batch) == [4, -1, -1, 5, 6, -1]


def test_strings_hashed_in_several_chunks_match(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(deleted_keys, "_HASH_CHUNK_BYTES", 5)
    values = ["", "abc", "abcdefgh", "x", "", "xyz" * 4, "abd"]
    keys = DeletedKeys([pa.array(values[1:4])], [1, 1, 1])
    batch = [pa.array(values + ["abce", "abcdefgi"])]

    assert keys.newest(batch).tolist() == reference([pa.array(values[1:4])], [1, 1, 1], batch)
    assert keys.newest(batch).tolist() == [-1, 1, 1, 1, -1, -1, -1, -1, -1]


def test_dictionary_columns_compare_by_their_values() -> None:
    kind = pa.dictionary(pa.int32(), pa.string())
    deletes = [pa.array(["a", "b"]).dictionary_encode()]
    batch = [pa.array(["b", "c", None, "a"], kind)]

    assert newest(deletes, [1, 2], batch) == [2, NO_DELETE, NO_DELETE, 1]


def test_no_deletes_and_no_rows() -> None:
    empty = DeletedKeys([pa.array([], pa.int64())], [])
    assert len(empty) == 0
    assert empty.newest([pa.array([1, None], pa.int64())]).tolist() == [NO_DELETE] * 2
    keys = DeletedKeys([pa.array([1], pa.int64())], [1])
    assert keys.newest([pa.array([], pa.int64())]).tolist() == []


def test_batch_columns_of_other_types_are_refused() -> None:
    keys = DeletedKeys([pa.array([1], pa.int64())], [1])
    with pytest.raises(TypeError, match="int32"):
        keys.newest([pa.array([1], pa.int32())])


# The applier: delete files on local disk, batches of a data file filtered in memory.

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "name", StringType(), required=False),
)


def _delete_file(
    directory: Path, name: str, ids: list[int], rows: list[tuple[Any, ...]]
) -> DataFile:
    fields = {1: pa.field("id", pa.int64()), 2: pa.field("name", pa.string())}
    schema = pa.schema([fields[i].with_metadata({FIELD_ID: str(i).encode()}) for i in ids])
    path = directory / name
    pq.write_table(
        pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema), path
    )
    return DataFile.from_args(
        content=DataFileContent.EQUALITY_DELETES,
        file_path=str(path),
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=len(rows),
        file_size_in_bytes=path.stat().st_size,
        equality_ids=ids,
    )


def _data_file(name: str) -> DataFile:
    return DataFile.from_args(
        content=DataFileContent.DATA,
        file_path=f"/nowhere/{name}",
        file_format=FileFormat.PARQUET,
        partition=Record(),
        record_count=8,
        file_size_in_bytes=100,
    )


def test_the_applier_keeps_row_order_and_schema_and_each_files_sequence(tmp_path: Path) -> None:
    by_id_3 = _delete_file(tmp_path, "d3.parquet", [1], [(2,), (5,), (None,)])
    by_id_6 = _delete_file(tmp_path, "d6.parquet", [1], [(7,)])
    by_name_5 = _delete_file(tmp_path, "n5.parquet", [2, 1], [("b", 1), (None, 6)])
    sequences = {by_id_3.file_path: 3, by_id_6.file_path: 6, by_name_5.file_path: 5}
    old = TaskInput(_data_file("old.parquet"), 2, (by_id_3, by_id_6, by_name_5))
    newer = TaskInput(_data_file("newer.parquet"), 4, (by_id_6, by_name_5))
    applier = EqualityDeleteApplier(PyArrowFileIO(), SCHEMA, [old, newer], sequences)
    schema = pa.schema(
        [pa.field("id", pa.int64()), pa.field("name", pa.string())], metadata={b"k": b"v"}
    )
    batch = pa.record_batch(
        [
            pa.array([1, 2, None, 4, 5, 6, 7, 1]),
            pa.array(["b", "x", "y", "z", "w", None, "v", "c"]),
        ],
        schema=schema,
    )

    drop_old, drop_newer = applier.filter_for(old), applier.filter_for(newer)
    assert drop_old is not None and drop_newer is not None
    kept_old, kept_newer = drop_old(batch), drop_newer(batch)

    # old (sequence 2): ids 2, 5 and null (sequence 3), 7 (6), (1, "b") and (6, null) (5).
    assert kept_old.to_pydict() == {"id": [4, 1], "name": ["z", "c"]}
    # newer (sequence 4): the deletes at sequence 3 are older than it, and no longer apply.
    assert kept_newer.to_pydict() == {"id": [2, None, 4, 5, 1], "name": ["x", "y", "z", "w", "c"]}
    assert kept_old.schema.equals(schema, check_metadata=True)
    assert kept_newer.schema.equals(schema, check_metadata=True)
    untouched = batch.slice(3, 1)
    assert drop_old(untouched) is untouched
    assert drop_old(batch.slice(0, 0)).num_rows == 0


def test_the_applier_compares_keys_cast_to_the_datas_type(tmp_path: Path) -> None:
    deleted = _delete_file(tmp_path, "d.parquet", [1], [(3,), (4,)])
    data = TaskInput(_data_file("a.parquet"), 1, (deleted,))
    applier = EqualityDeleteApplier(PyArrowFileIO(), SCHEMA, [data], {deleted.file_path: 2})
    drop = applier.filter_for(data)
    assert drop is not None
    # A column read as int32 (before a promotion) and as large strings is matched all the same.
    batch = pa.record_batch(
        [pa.array([3, 5, 4], pa.int32()), pa.array(["a", "b", "c"], pa.large_string())],
        names=["id", "name"],
    )

    assert drop(batch).to_pydict() == {"id": [5], "name": ["b"]}
