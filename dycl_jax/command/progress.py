"""A rich progress display of the conversion stages (to_jax's `progress` callback) on stderr."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn


class Stages:
    """One line per stage, with a spinner while it runs and its time once the next one starts."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._current: TaskID | None = None

    def __call__(self, stage: str) -> None:
        self.done()
        self._current = self._progress.add_task(stage, total=1)

    def done(self) -> None:
        if self._current is not None:
            self._progress.update(self._current, completed=1)
            self._current = None


@contextmanager
def stages(console: Console) -> Iterator[Stages]:
    """`with stages(err) as step: step("capture"); ...`; shown only on a terminal."""
    progress = Progress(SpinnerColumn(finished_text="✓"), TextColumn("{task.description}"), TimeElapsedColumn(),
                        console=console, transient=False, disable=not console.is_terminal)
    step = Stages(progress)
    with progress:
        try:
            yield step
        finally:
            step.done()
