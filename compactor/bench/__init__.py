"""Benchmarks: TPC-DS queries in DuckDB before and after compaction, and rewrite throughput."""
