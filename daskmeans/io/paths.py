"""Output paths checked before any work: never over an input, never half-written.

An output that is, contains or lies inside one of the command's inputs is refused even with
``overwrite``: replacing it would destroy the data (or model) the command is reading.
"""

from __future__ import annotations

import os
from typing import Iterable

from ..errors import DaskmeansError


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(os.fspath(path)))


def _within(child: str, parent: str) -> bool:
    """Whether real path ``child`` is ``parent`` or lies below it."""
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


def check_output(path: str | None, overwrite: bool, inputs: Iterable[str | None] = ()) -> None:
    """Refuse an output path that cannot or must not be written.

    Parameters
    ----------
    path : str or None
        The output (None: nothing to check).
    overwrite : bool
        Whether an existing output may be replaced.
    inputs : iterable of str or None
        Paths the command reads (data, model, init file); the output may not be one of them,
        contain one, or lie inside one, whatever ``overwrite`` says.
    """
    if path is None:
        return
    out = _real(path)
    for src in inputs:
        if src is None or not isinstance(src, (str, os.PathLike)):
            continue
        inp = _real(src)
        if _within(out, inp) or _within(inp, out):
            raise DaskmeansError(
                f"output {path} would overwrite the input {src}: choose another output path"
                + (" (--overwrite never replaces an input)" if overwrite else "")
            )
    if os.path.exists(path) and not overwrite:
        raise DaskmeansError(f"{path} exists: choose another output or pass --overwrite")
    parent = os.path.dirname(out)
    if not os.path.isdir(parent):
        raise DaskmeansError(f"cannot write {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise DaskmeansError(f"cannot write {path}: directory {parent} is not writable")
