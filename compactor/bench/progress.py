"""Progress of a benchmark's long steps: rich bars on a terminal, otherwise a line a step."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from compactor.durations import utc_now_text

Advance = Callable[[float], None]


class Steps(Protocol):
    """Receives the steps of a benchmark as they run."""

    def step(self, description: str, total: float | None = None) -> AbstractContextManager[Advance]:
        """A context manager around one step; the value it gives advances the step's bar."""
        ...

    def note(self, message: str) -> None:
        """One line about a finished step."""
        ...


class LogSteps:
    """A line when a step starts and one when it ends, with its time, for logs off a terminal."""

    def __init__(self, console: Console, clock: Callable[[], float] = time.monotonic) -> None:
        self.console, self.clock = console, clock

    @contextmanager
    def step(self, description: str, total: float | None = None) -> Iterator[Advance]:
        self.note(f"{description} ...")
        started = self.clock()
        yield lambda _amount: None
        self.note(f"{description}: done in {self.clock() - started:.1f} s")

    def note(self, message: str) -> None:
        self.console.print(f"{utc_now_text()} {message}", markup=False, highlight=False)


class RichSteps:
    """A transient bar per step on ``console``, and a line per note."""

    def __init__(self, console: Console) -> None:
        self.console = console

    @contextmanager
    def step(self, description: str, total: float | None = None) -> Iterator[Advance]:
        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        ) as progress:
            task = progress.add_task(description, total=total)
            yield lambda amount: progress.advance(task, amount)

    def note(self, message: str) -> None:
        self.console.print(message, markup=False, highlight=False)
