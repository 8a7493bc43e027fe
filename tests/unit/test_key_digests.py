"""Referenced location keys held as digests: every key put in is found."""

from __future__ import annotations

import random

from compactor.iceberg.references import KeyDigests, key_digest


def _keys(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    alphabet = "abcxyz/._-=%é漢\U0001f600"
    return [
        "s3://bucket/t/data/" + "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40)))
        for _ in range(n)
    ]


def test_every_key_in_the_set_is_found_and_others_are_not() -> None:
    keys = _keys(20_000, seed=1)
    held = KeyDigests(keys)
    assert all(k in held for k in keys)
    others = [k for k in _keys(20_000, seed=2) if k not in set(keys)]
    assert not any(k in held for k in others)
    assert len(held) == len(set(keys))


def test_digests_are_signed_64_bit_and_cover_the_whole_range() -> None:
    digests = [key_digest(k) for k in _keys(2_000, seed=3)]
    assert all(-(2**63) <= d < 2**63 for d in digests)
    assert min(digests) < 0 < max(digests)
    held = KeyDigests([])
    assert len(held) == 0 and "s3://bucket/t/x" not in held and 5 not in held


def test_an_unencodable_location_has_a_digest() -> None:
    odd = "file:///t/data/\udcff.parquet"  # a listed name that was not UTF-8
    assert odd in KeyDigests([odd])
