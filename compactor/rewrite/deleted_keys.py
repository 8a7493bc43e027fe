"""Equality-delete keys held once and probed batch by batch.

:class:`DeletedKeys` takes the key columns of a set of equality deletes, each row with the
sequence number of the delete file it came from, and answers for the rows of a data batch with
the newest sequence number that deletes each row's key (or :data:`NO_DELETE`). Keys compare as
Iceberg Java compares them (:mod:`compactor.iceberg.value_keys`): null equals null, floating
point values by their canonical bits (every NaN one value, -0.0 and 0.0 two).

How: each key column becomes one or more unsigned words of up to 64 bits per row — a
fixed-width value its own bytes (a uuid or a decimal two words), a string or binary value a
hash of its bytes — and, where the deletes hold nulls in it, a validity word. Each word is
looked up in a hash table of the distinct words of the deletes, which gives it a dense code;
the codes of a row's words are combined into one int64 (mixed radix over the words' counts,
made dense again through the deletes' own combinations before it could overflow), which is
looked up in a hash table of the combined codes of the deleted keys, giving the key's newest
sequence number. The tables are built once, with the keys; a batch only probes them, a few
numpy gathers per word (open addressing with linear probing, vectorised over the batch). A
hashed value that is found is confirmed by comparing its bytes with the deleted value of that
hash, so a hash collision never deletes a row; should two distinct deleted values share a hash
under every seed tried, their column is coded exactly with ``pc.index_in`` instead (slower:
it hashes the deleted values again for each batch).

Memory: a hash table holds n values in 2n to 4n slots of 12 bytes. So per distinct deleted key
32 to 56 bytes (its slots and newest sequence number), as much again at most per distinct
value of each key column (twice for a uuid or a decimal: two words), and for a string or binary
column its distinct deleted values: 288,634 keys of two integer columns take 22 MB. While the
keys are built, the delete rows are held with a few int64 arrays of their length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from compactor.iceberg.value_keys import canonical_array

NO_DELETE = -1
"""The newest deleting sequence number of a key no delete names (sequence numbers are >= 0)."""

Codes = npt.NDArray[np.int64]
Words = npt.NDArray[np.integer[Any]]
Mask = npt.NDArray[np.bool_]

# Combined codes stay below this before they are re-densified (int64, with room to multiply).
_RADIX_LIMIT = 1 << 62
# Strings and binary are hashed this many bytes at a time (a few temporaries of 8 bytes a byte).
_HASH_CHUNK_BYTES = 1 << 20
# Seeds tried until the distinct deleted values of a column have distinct hashes.
_HASH_SEEDS = (0, 1, 2, 3)
_POSITION_BITS = 12
_POSITIONS = 1 << _POSITION_BITS
_HIGH_POSITION = np.uint64(0x9E3779B97F4A7C15)
_LENGTH = np.uint64(0xD6E8FEB86659FD93)
_ABSENT = np.uint64(np.iinfo(np.uint64).max)
_FIBONACCI = np.uint64(0x9E3779B97F4A7C15)


def _plain(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``array`` as one array of a type words are made of: floats as their canonical bits,
    extension types as their storage, dictionaries decoded, views as their large types."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if isinstance(array.type, pa.BaseExtensionType):  # a uuid: its 16 bytes
        array = array.storage
    kind = array.type
    if pa.types.is_dictionary(kind):
        array = array.dictionary_decode()
    elif pa.types.is_string_view(kind):
        array = array.cast(pa.large_string())
    elif pa.types.is_binary_view(kind):
        array = array.cast(pa.large_binary())
    return canonical_array(array)


def _is_binary_like(kind: pa.DataType) -> bool:
    return (
        pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
        or pa.types.is_binary(kind)
        or pa.types.is_large_binary(kind)
    )


def _validity(array: pa.Array) -> Mask | None:
    """Per row, whether its value is valid; None when every one is."""
    if array.null_count == 0:
        return None
    if pa.types.is_null(array.type):
        return np.zeros(len(array), np.bool_)
    return np.asarray(array.is_valid().to_numpy(zero_copy_only=False), np.bool_)


def _fixed_words(array: pa.Array) -> list[Words]:
    """The values of a fixed-width ``array`` as words: its bytes, in one word of their width
    when that is 1, 2, 4 or 8 bytes, else in 8-byte words (the last one zero-padded)."""
    if pa.types.is_boolean(array.type):  # bit-packed: one byte a value
        array = pc.cast(array, pa.uint8())
    try:
        width = array.type.bit_width // 8
    except ValueError:
        raise TypeError(f"equality delete keys of type {array.type} are not supported") from None
    rows = len(array)
    if rows == 0:
        return [np.zeros(0, np.uint64)] * max(1, -(-width // 8))
    raw = np.frombuffer(array.buffers()[1], np.uint8, rows * width, array.offset * width)
    if width in (1, 2, 4, 8):
        return [raw.view(np.dtype(f"u{width}"))]
    padded = -width % 8
    matrix = raw.reshape(rows, width)
    if padded:
        matrix = np.concatenate([matrix, np.zeros((rows, padded), np.uint8)], axis=1)
    words = np.ascontiguousarray(matrix).view(np.uint64)
    return [np.ascontiguousarray(words[:, i]) for i in range(words.shape[1])]


class _BytesHash:
    """A 64-bit hash of each value of a string or binary array, vectorised: the sum over its
    bytes of (byte + 1) times a random odd weight of the byte's position, plus its length times
    a constant, all modulo 2**64. Equal values hash equally; distinct ones rarely do."""

    def __init__(self, seed: int) -> None:
        random = np.random.default_rng(seed)
        self.weights = random.integers(0, 2**64 - 1, _POSITIONS, np.uint64, True) | np.uint64(1)

    def __call__(self, array: pa.Array) -> Words:
        rows = len(array)
        large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
        offset_type = np.dtype(np.int64 if large else np.int32)
        if rows == 0:
            return np.zeros(0, np.uint64)
        offsets = np.frombuffer(
            array.buffers()[1], offset_type, rows + 1, array.offset * offset_type.itemsize
        ).astype(np.int64)
        lengths = np.diff(offsets)
        hashes = lengths.astype(np.uint64) * _LENGTH
        data_buffer = array.buffers()[2]
        if data_buffer is None or offsets[-1] == offsets[0]:
            return hashes
        data = np.frombuffer(data_buffer, np.uint8)
        start = 0
        while start < rows:
            limit = offsets[start] + _HASH_CHUNK_BYTES
            stop = int(np.searchsorted(offsets, limit, side="right")) - 1
            stop = min(rows, max(start + 1, stop))
            self._add(hashes, data, offsets, lengths, start, stop)
            start = stop
        return hashes

    def _add(
        self,
        hashes: Words,
        data: npt.NDArray[np.uint8],
        offsets: Codes,
        lengths: Codes,
        start: int,
        stop: int,
    ) -> None:
        """Add the bytes of rows ``start:stop`` into their ``hashes``."""
        low, high = int(offsets[start]), int(offsets[stop])
        if high == low:
            return
        starts = offsets[start:stop] - low
        position = np.arange(high - low, dtype=np.int64)
        position -= np.repeat(starts, lengths[start:stop])
        weight = self.weights[position & (_POSITIONS - 1)]
        if lengths[start:stop].max() > _POSITIONS:
            weight += (position >> _POSITION_BITS).astype(np.uint64) * _HIGH_POSITION
        weight *= data[low:high].astype(np.uint64) + np.uint64(1)
        filled = np.flatnonzero(lengths[start:stop])
        hashes[start + filled] += np.add.reduceat(weight, starts[filled])


class _Lookup:
    """The distinct ``values`` of some words, each with its index among them, in a hash table
    (open addressing, linear probing, at most half full) built once; :meth:`find` looks up a
    whole array of words at once, a few gathers per probe.

    ``column`` and ``word`` name the word of the key it codes; None: the combined codes of the
    words before it.
    """

    def __init__(self, values: Words, column: int | None = None, word: int = 0) -> None:
        self.column, self.word = column, word
        values = values.astype(np.uint64, copy=False)
        if len(values) >= 2**31:
            raise ValueError("equality delete keys: more than 2**31 distinct values")
        bits = max(3, (2 * len(values) - 1).bit_length())
        self._mask = np.int64((1 << bits) - 1)
        self._shift = np.uint64(64 - bits)
        self._keys = np.zeros(1 << bits, np.uint64)
        self._index = np.full(1 << bits, -1, np.int32)
        pending = np.arange(len(values), dtype=np.int64)
        at = self._slot(values)
        while len(pending):  # each round, the first of the keys waiting for a free slot takes it
            _, first = np.unique(at, return_index=True)
            placed = first[self._index[at[first]] < 0]
            self._keys[at[placed]] = values[pending[placed]]
            self._index[at[placed]] = pending[placed]
            waiting = np.ones(len(pending), np.bool_)
            waiting[placed] = False
            pending, at = pending[waiting], (at[waiting] + 1) & self._mask
        self.count = len(values)

    @property
    def nbytes(self) -> int:
        return int(self._keys.nbytes + self._index.nbytes)

    def _slot(self, words: Words) -> Codes:
        return ((words * _FIBONACCI) >> self._shift).astype(np.int64)

    def find(self, words: Words, miss: Mask) -> Codes:
        """Each word's index among the values (0 where it is none of them, and ``miss`` set)."""
        words = words.astype(np.uint64, copy=False)
        at = self._slot(words)
        index = self._index[at]
        match = self._keys[at] == words
        found = np.where(match, index, -1).astype(np.int64)
        rows = np.flatnonzero((index >= 0) & ~match)
        at = at[rows]
        while len(rows):  # the next slot of each word whose slot holds another value
            at = (at + 1) & self._mask
            index = self._index[at]
            match = self._keys[at] == words[rows]
            found[rows[match]] = index[match]
            more = (index >= 0) & ~match
            rows, at = rows[more], at[more]
        absent = found < 0
        miss |= absent
        found[absent] = 0
        return found


class _Column:
    """How the values of one key column become words, fixed when the keys are built."""

    def __init__(self, index: int, deleted: pa.Array) -> None:
        self.index, self.type = index, deleted.type
        self.nullable = deleted.null_count > 0
        self.hash: _BytesHash | None = None
        self.exact: pa.Array | None = None  # distinct deleted values, for pc.index_in
        self.distinct: pa.Array | None = None  # distinct deleted values, hashed
        self.by_code: pa.Array | None = None  # the deleted value of each code of the hash word
        if _is_binary_like(self.type):
            distinct = pc.unique(deleted.drop_null())
            for seed in _HASH_SEEDS:
                hashes = _BytesHash(seed)(distinct)
                if len(np.unique(hashes)) == len(distinct):
                    self.hash, self.distinct = _BytesHash(seed), distinct
                    break
            else:
                self.exact = distinct

    def words(self, array: pa.Array, valid: Mask | None) -> list[Words]:
        """The value words of ``array`` (zero where a value is null)."""
        if pa.types.is_null(array.type):
            return []
        if self.hash is not None:
            words = [self.hash(array)]
        elif self.exact is not None:
            found = pc.fill_null(pc.index_in(array, value_set=self.exact), -1).to_numpy()
            words = [np.where(found < 0, _ABSENT, found.astype(np.uint64))]
        else:
            words = _fixed_words(array)
        if valid is not None:
            words = [np.where(valid, w, w.dtype.type(0)) for w in words]
        return words

    def align(self, part: _Lookup) -> None:
        """Index the distinct deleted values by the codes of ``part``, their hash word, so that a
        hash found can be confirmed."""
        if self.hash is None or self.distinct is None:
            return
        codes = part.find(self.hash(self.distinct), np.zeros(len(self.distinct), np.bool_))
        value = np.full(part.count, -1, np.int64)
        value[codes] = np.arange(len(self.distinct))
        self.by_code = self.distinct.take(pa.array(value, mask=value < 0))
        self.distinct = None

    def confirm(self, array: pa.Array, valid: Mask | None, codes: Codes, miss: Mask) -> None:
        """Set ``miss`` where a value whose hash was found among the deletes' is not the deleted
        value of that hash (a collision), among the valid rows not missed yet."""
        if self.by_code is None:
            return
        candidates = ~miss if valid is None else ~miss & valid
        rows = np.flatnonzero(candidates)
        if len(rows) == 0:
            return
        same = pc.equal(array.take(pa.array(rows)), self.by_code.take(pa.array(codes[rows])))
        miss[rows] |= ~pc.fill_null(same, False).to_numpy(zero_copy_only=False)


class DeletedKeys:
    """The distinct keys of some equality deletes, each with the newest sequence number that
    deletes it: built once from the deletes' key columns, then probed batch by batch.

    ``columns`` are the deletes' key columns (of the types the data's columns will have, after
    :func:`compactor.iceberg.pyiceberg_compat.arrow_storage`), ``sequence_numbers`` each row's
    delete sequence number.
    """

    def __init__(
        self,
        columns: Sequence[pa.Array | pa.ChunkedArray],
        sequence_numbers: npt.ArrayLike,
    ) -> None:
        plain = [_plain(c) for c in columns]
        sequences = np.asarray(sequence_numbers, np.int64).reshape(-1)
        if not plain:
            raise ValueError("equality delete keys need at least one column")
        rows = len(plain[0])
        if any(len(c) != rows for c in plain) or len(sequences) != rows:
            raise ValueError("key columns and sequence numbers differ in length")
        self.types = tuple(c.type for c in plain)
        self._columns = [_Column(i, c) for i, c in enumerate(plain)]
        self._steps: list[_Lookup] = []
        self._keys = _Lookup(np.zeros(0, np.uint64))
        self._newest: Codes = np.zeros(0, np.int64)
        if rows == 0:
            return
        combined: Codes = np.zeros(rows, np.int64)
        miss: Mask = np.zeros(rows, np.bool_)
        count = 1
        for column, array in zip(self._columns, plain, strict=True):
            for index, deleted in enumerate(self._words(column, array, _validity(array))):
                part = _Lookup(np.unique(deleted), column.index, index)
                if index == 0:
                    column.align(part)
                if count * part.count >= _RADIX_LIMIT:
                    dense = _Lookup(np.unique(combined))
                    combined = dense.find(combined, miss)
                    count = dense.count
                    self._steps.append(dense)
                combined = combined * part.count + part.find(deleted, miss)
                count *= part.count
                self._steps.append(part)
        if miss.any():  # every delete's own key is among the deletes
            raise AssertionError("equality delete keys: a deleted key was not found")
        order = np.argsort(combined, kind="stable")
        combined, sequences = combined[order], sequences[order]
        first = np.flatnonzero(np.concatenate([[True], combined[1:] != combined[:-1]]))
        self._keys = _Lookup(combined[first])
        self._newest = np.maximum.reduceat(sequences, first)

    @staticmethod
    def _words(column: _Column, array: pa.Array, valid: Mask | None) -> list[Words]:
        """The words of one key column: its values', then, if the deletes hold nulls in it,
        its validity."""
        words = column.words(array, valid)
        if column.nullable:
            words.append(np.ones(len(array), np.uint8) if valid is None else valid.view(np.uint8))
        return words

    def __len__(self) -> int:
        """How many distinct keys."""
        return self._keys.count

    @property
    def nbytes(self) -> int:
        """Bytes held, about."""
        held = self._keys.nbytes + self._newest.nbytes
        held += sum(step.nbytes for step in self._steps)
        held += sum(c.by_code.nbytes for c in self._columns if c.by_code is not None)
        held += sum(c.exact.nbytes for c in self._columns if c.exact is not None)
        return held

    def newest(self, columns: Sequence[pa.Array | pa.ChunkedArray]) -> Codes:
        """Per row of ``columns`` (a batch's key columns, in the deletes' order and types), the
        newest sequence number deleting its key, or :data:`NO_DELETE`."""
        plain = [_plain(c) for c in columns]
        if tuple(c.type for c in plain) != self.types:
            raise TypeError(f"key columns of types {[c.type for c in plain]}, not {self.types}")
        rows = len(plain[0])
        if any(len(c) != rows for c in plain):
            raise ValueError("key columns differ in length")
        newest: Codes = np.full(rows, NO_DELETE, np.int64)
        if rows == 0 or self._keys.count == 0:
            return newest
        miss: Mask = np.zeros(rows, np.bool_)
        words: dict[tuple[int, int], Words] = {}
        valid: list[Mask | None] = []
        for column, array in zip(self._columns, plain, strict=True):
            valid.append(_validity(array))
            if valid[-1] is not None and not column.nullable:
                miss |= ~valid[-1]  # no deleted key has a null here
            for index, word in enumerate(self._words(column, array, valid[-1])):
                words[(column.index, index)] = word
        combined: Codes = np.zeros(rows, np.int64)
        for step in self._steps:
            if step.column is None:
                combined = step.find(combined, miss)
                continue
            codes = step.find(words[(step.column, step.word)], miss)
            if step.word == 0:
                column = self._columns[step.column]
                column.confirm(plain[step.column], valid[step.column], codes, miss)
            combined *= step.count
            combined += codes
        found = self._keys.find(combined, miss)
        hit = ~miss
        newest[hit] = self._newest[found[hit]]
        return newest

    def deleted(self, columns: Sequence[pa.Array | pa.ChunkedArray], sequence: int) -> Mask:
        """Per row of ``columns``, whether a delete newer than ``sequence`` (the data sequence
        number of the rows' file) names its key."""
        return self.newest(columns) > sequence
