"""A one-line progress bar on a terminal stream (no dependency)."""

from __future__ import annotations

import sys
from typing import TextIO


class ProgressBar:
    def __init__(self, stream: TextIO | None = None, width: int = 30) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self._last = ""

    def update(self, fraction: float, text: str = "") -> None:
        fraction = min(max(fraction, 0.0), 1.0)
        filled = round(fraction * self.width)
        line = f"\r[{'#' * filled}{'.' * (self.width - filled)}] {fraction * 100:3.0f}%  {text}"
        if line != self._last:
            self.stream.write(line.ljust(len(self._last)))
            self.stream.flush()
            self._last = line

    def close(self) -> None:
        if self._last:
            self.stream.write("\n")
            self.stream.flush()
            self._last = ""
