"""Progress events: what the library reports of its long steps, for whoever watches.

The code doing a step (placing the data, an init, writing labels) reports it with
:func:`step`, :func:`advance` and :func:`note`, which do nothing unless a command watches
(:func:`watching`): the library itself prints nothing. The renderers (a live bar on a
terminal, plain lines: :class:`daskmeans.progress.Steps`) live with the command; this module
is the base layer's, so that the engine, the inits and the I/O report without importing them.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Protocol


class Watcher(Protocol):
    """What shows the steps reported (:class:`daskmeans.progress.Steps` is one)."""

    name: str | None  # the step shown now, None between steps

    def start(self, name: str, total: int | None, unit: str) -> None: ...

    def advance(self, done: int, total: int | None = None) -> None: ...

    def end(self, failed: bool = False) -> None: ...

    def note(self, line: str) -> None: ...


_watcher: contextvars.ContextVar[Watcher | None] = contextvars.ContextVar("daskmeans_steps", default=None)
# Inside a step that another one hides (a fit's placing inside the sweep's bar over K).
_nested: contextvars.ContextVar[bool] = contextvars.ContextVar("daskmeans_nested_step", default=False)


@contextlib.contextmanager
def watching(steps: Watcher) -> Iterator[Watcher]:
    """Show the steps reported in this context (a command's) with ``steps``."""
    token = _watcher.set(steps)
    try:
        yield steps
    finally:
        steps.end()
        _watcher.reset(token)


def watched() -> bool:
    """Whether a command (or an estimator's ``verbose``) shows the steps reported here."""
    return _watcher.get() is not None


@contextlib.contextmanager
def step(name: str, total: int | None = None, unit: str = "") -> Iterator[None]:
    """A long step named ``name``, of ``total`` units (chunks, rounds, blocks) if known.
    A step inside another (one the caller knows nothing of) leaves the outer one shown."""
    steps = _watcher.get()
    if steps is None or steps.name is not None:
        # The outer step's count is not this one's: its advances are dropped.
        token = _nested.set(True)
        try:
            yield
        finally:
            _nested.reset(token)
        return
    steps.start(name, total, unit)
    try:
        yield
    except BaseException:
        steps.end(failed=True)
        raise
    steps.end()


def advance(done: int, total: int | None = None) -> None:
    """``done`` units of the step under way are done (of ``total``, where it is known only now)."""
    steps = _watcher.get()
    if steps is not None and not _nested.get():
        steps.advance(done, total)


def note(line: str) -> None:
    """A line for the person watching the command (nothing outside one)."""
    steps = _watcher.get()
    if steps is not None:
        steps.note(line)
