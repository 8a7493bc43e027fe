"""Code the test suite shares: servers, Iceberg Java, processes, tables and checks of them."""

from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
"""The repository's root, which holds README.md, docs/, jobs/, deploy/ and compactor/."""
