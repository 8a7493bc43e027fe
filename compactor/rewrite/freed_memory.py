"""Memory pyarrow's allocator has freed but keeps, handed back to the system.

The allocator keeps the pages it frees for its next allocations: cheap while a rewrite
allocates, but the process's resident memory then holds them on top of what is in use.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pyarrow as pa

from compactor.options.defaults import HAND_BACK_AT
from compactor.sizes import proc_status_bytes


def hand_back_near(memory_limit: int | None) -> bool:
    """Hand freed pages back if this process's resident memory is past HAND_BACK_AT of
    ``memory_limit``; whether it did. Without a limit, or where the kernel does not tell the
    resident memory (not Linux), nothing is done."""
    if memory_limit is None:
        return False
    resident = proc_status_bytes("VmRSS")
    if resident is None or resident <= memory_limit * HAND_BACK_AT:
        return False
    pa.default_memory_pool().release_unused()
    return True


@contextlib.contextmanager
def handed_back_after() -> Iterator[None]:
    """A block after which freed pages are handed back: the commit, which allocates little
    through pyarrow, would otherwise run on top of the rewrite's high-water mark."""
    try:
        yield
    finally:
        pa.default_memory_pool().release_unused()
