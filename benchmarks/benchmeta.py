"""What every benchmark JSON records about where it ran (shared by the bench scripts, which
run as ``python benchmarks/<script>.py`` and so import this module by its plain name)."""

from __future__ import annotations

import os
import subprocess


def commit() -> str | None:
    """The measured commit: ``.commit`` in the working directory or the repository root
    (written before a device run, whose copy of .git may be stale), else ``git rev-parse HEAD``."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for path in (".commit", os.path.join(root, ".commit")):
        if os.path.exists(path):
            with open(path) as f:
                return f.read().strip() or None
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=os.path.dirname(os.path.abspath(__file__)))
        return out.stdout.strip() or None
    except OSError:
        return None
