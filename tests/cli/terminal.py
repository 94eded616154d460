"""Commands run on a pseudo-terminal, as a person at a terminal runs them (progress bars)."""

from __future__ import annotations

import os


def on_a_terminal(argv: list[str]) -> str:
    """Run ``argv`` with stdout and stderr on a pseudo-terminal; everything it wrote."""
    import pty
    import subprocess

    main_fd, child_fd = pty.openpty()
    p = subprocess.Popen(argv, stdout=child_fd, stderr=child_fd, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    os.close(child_fd)
    out = b""
    while True:
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # the terminal closed: the command ended
            break
        if not chunk:
            break
        out += chunk
    assert p.wait(timeout=300) == 0, out
    os.close(main_fd)
    return out.decode()
