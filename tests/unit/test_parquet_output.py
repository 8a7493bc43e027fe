"""Which columns the output writer dictionary-encodes."""

from __future__ import annotations

import random
from decimal import Decimal

import pyarrow as pa

from compactor.rewrite.parquet_output import dictionary_columns, parquet_leaf_paths


def test_a_decimal_is_judged_by_its_width_in_parquet_not_in_arrow() -> None:
    """A decimal(7,2) is 16 bytes in Arrow but an INT32 in Parquet: 8,000 distinct amounts in
    10,000 rows are cheaper written plain (40 KB) than as a dictionary (32 KB) plus indices
    (17 KB), as are the same amounts as plain ints; 50 distinct prices are not."""
    rng = random.Random(3)
    amounts = [rng.randrange(10**6) for _ in range(8_000)]
    rows = [amounts[i % len(amounts)] for i in range(10_000)]
    prices = [rng.randrange(50) * 100 for _ in range(10_000)]
    table = pa.table(
        {
            "amount": pa.array([Decimal(a).scaleb(-2) for a in rows], pa.decimal128(7, 2)),
            "amount_cents": pa.array(rows, pa.int32()),
            "price": pa.array([Decimal(p).scaleb(-2) for p in prices], pa.decimal128(7, 2)),
        }
    )

    assert dictionary_columns(table, parquet_leaf_paths(table.schema)) == ["price"]
