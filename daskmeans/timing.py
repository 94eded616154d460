"""Wall-clock seconds of a command's or a fit's phases (reading, placement, init, iterations...),
so that users and the whole-command benchmark see where the time of a run goes."""

from __future__ import annotations

import contextlib
import time
from typing import Iterator


class Phases:
    """Named phases and their wall seconds, in the order they first ran; a phase entered again
    (``init`` of each of ``n_init`` runs, say) adds up."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def update(self, seconds: dict[str, float]) -> None:
        """Add phases timed elsewhere (a fit's, within a command's)."""
        for name, s in seconds.items():
            self.seconds[name] = self.seconds.get(name, 0.0) + float(s)

    def describe(self) -> str:
        """One line: ``read 0.01 s, place 0.12 s, ...``."""
        return ", ".join(f"{k} {v:.2f} s" for k, v in self.seconds.items())
