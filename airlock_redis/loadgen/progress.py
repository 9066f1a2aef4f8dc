"""What ``bench`` shows a person at a terminal: a live progress bar while it runs, and its summary as
a table, both drawn with rich. A file or a pipe gets neither drawing: no progress at all (no carriage
returns in a log) and the summary as plain ``name  value`` lines that a script can read."""

from __future__ import annotations

from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .stats import BenchSummary


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal, asked of the stream itself (rich's own test would also say
    yes to a pipe when FORCE_COLOR or TTY_COMPATIBLE=1 is set, and a log would fill with redraws)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class TerminalProgress:
    """A progress bar redrawn in place on a terminal: ``update(fraction, text)``, then ``close()``."""

    def __init__(self, stream: TextIO) -> None:
        self._progress = Progress(
            TextColumn("bench"),
            BarColumn(),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}", markup=False),
            console=Console(file=stream, force_terminal=True),
        )
        self._task = self._progress.add_task("", total=1.0)
        self._progress.start()

    def update(self, fraction: float, text: str = "") -> None:
        self._progress.update(self._task, completed=min(max(fraction, 0.0), 1.0), description=text)

    def close(self) -> None:
        self._progress.stop()


def progress_for(stream: TextIO) -> TerminalProgress | None:
    """A progress bar on ``stream`` if it is a terminal; else None (show no progress)."""
    return TerminalProgress(stream) if is_terminal(stream) else None


def print_summary(summary: BenchSummary, stream: TextIO) -> None:
    """The figures of a run: a rich table on a terminal, else :meth:`BenchSummary.table`'s lines."""
    if not is_terminal(stream):
        print(summary.table(), file=stream)
        return
    table = Table(title="airlock-redis bench", title_justify="left")
    table.add_column("figure")
    table.add_column("value")
    for name, value in summary.rows():
        style = "bold red" if value.endswith("FAILURE") else ""
        table.add_row(Text(name), Text(value, style=style))
    Console(file=stream, force_terminal=True).print(table)
