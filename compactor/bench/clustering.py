"""``bench queries --strategy sort|zorder``: how the TPC-DS fact tables are ordered, the filtered
queries that select on those columns, and how much min/max statistics let a reader skip.

Each fact table is sorted by (or z-ordered on) its date key and its item key; dimension tables
are bin-packed. The filtered queries (numbered from 901, after TPC-DS's 99) select one month of
sales, or a range of about 1% of the items, from ``store_sales`` and ``catalog_sales``. For
each, the report counts the data files and Parquet row groups whose column bounds overlap the
range: what a reader pruning by min/max statistics must open, before and after compaction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow.parquet as pq
from pyiceberg.conversions import from_bytes
from pyiceberg.table import Table
from pyiceberg.types import PrimitiveType

# The columns each fact table is ordered by: its date key, then its item key.
CLUSTER_COLUMNS = {
    "store_sales": ("ss_sold_date_sk", "ss_item_sk"),
    "catalog_sales": ("cs_sold_date_sk", "cs_item_sk"),
    "web_sales": ("ws_sold_date_sk", "ws_item_sk"),
    "store_returns": ("sr_returned_date_sk", "sr_item_sk"),
    "catalog_returns": ("cr_returned_date_sk", "cr_item_sk"),
    "web_returns": ("wr_returned_date_sk", "wr_item_sk"),
    "inventory": ("inv_date_sk", "inv_item_sk"),
}
JANUARY_2000 = (2451545, 2451575)  # d_date_sk of 2000-01-01 and 2000-01-31
FIRST_ITEMS = (1, 180)  # ~1% of the items at scale factor 1 (18,000)


@dataclass(frozen=True)
class FilteredQuery:
    """``SELECT count(*), sum(<measure>) FROM <table> WHERE <column> BETWEEN low AND high``."""

    number: int
    table: str
    column: str
    measure: str
    low: int
    high: int

    @property
    def text(self) -> str:
        return (
            f"SELECT count(*) AS n, sum({self.measure}) AS total FROM {self.table} "
            f"WHERE {self.column} BETWEEN {self.low} AND {self.high}"
        )


FILTERED_QUERIES = (
    FilteredQuery(901, "store_sales", "ss_sold_date_sk", "ss_net_paid", *JANUARY_2000),
    FilteredQuery(902, "store_sales", "ss_item_sk", "ss_net_paid", *FIRST_ITEMS),
    FilteredQuery(903, "catalog_sales", "cs_sold_date_sk", "cs_net_paid", *JANUARY_2000),
    FilteredQuery(904, "catalog_sales", "cs_item_sk", "cs_net_paid", *FIRST_ITEMS),
)


def strategy_options(strategy: str, table: str) -> dict[str, str]:
    """compactor's ordering options for ``table`` (a TPC-DS table name) under ``strategy``."""
    columns = CLUSTER_COLUMNS.get(table)
    if strategy == "binpack" or columns is None:
        return {}
    if strategy == "sort":
        return {"strategy": "sort", "sort_order": ", ".join(columns)}
    return {"strategy": "zorder", "zorder": ", ".join(columns)}


def pruning(table: Table, query: FilteredQuery) -> dict[str, int]:
    """Files and row groups of ``table``'s current snapshot, and how many may hold matches."""
    field_id = table.schema().find_field(query.column).field_id
    kind = table.schema().find_type(field_id)
    assert isinstance(kind, PrimitiveType), f"{query.column}: not a primitive column"
    counts = {"files": 0, "files_to_read": 0, "row_groups": 0, "row_groups_to_read": 0}
    for task in table.scan(selected_fields=(query.column,)).plan_files():
        data_file = task.file
        with table.io.new_input(data_file.file_path).open() as stream:
            metadata = pq.ParquetFile(stream).metadata
        counts["files"] += 1
        counts["row_groups"] += metadata.num_row_groups
        low, high = data_file.lower_bounds.get(field_id), data_file.upper_bounds.get(field_id)
        if low is not None and high is not None:
            # The clustered columns are integer keys.
            lowest, highest = int(from_bytes(kind, low)), int(from_bytes(kind, high))
            if highest < query.low or lowest > query.high:
                continue  # the manifest's bounds rule the whole file out
        counts["files_to_read"] += 1
        position = metadata.schema.to_arrow_schema().get_field_index(query.column)
        for i in range(metadata.num_row_groups):
            stats = metadata.row_group(i).column(position).statistics
            if (stats is not None and stats.has_min_max) and (
                stats.max < query.low or stats.min > query.high
            ):
                continue
            counts["row_groups_to_read"] += 1
    return counts


def pruning_report(tables: dict[str, Table]) -> dict[int, dict[str, Any]]:
    """:func:`pruning` for every filtered query whose table is among ``tables``."""
    return {q.number: pruning(tables[q.table], q) for q in FILTERED_QUERIES if q.table in tables}
