"""The command run in the test's process: ``main(argv)`` with its output captured."""

from __future__ import annotations

from daskmeans.cli import main


def run(capsys, *argv):
    """``(rc, stdout, stderr)`` of ``daskmeans ARGV`` (arguments turned to strings)."""
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err
