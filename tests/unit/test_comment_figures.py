"""Comments keep the why; measured figures live in ``docs/performance.md``.

A comment that says "this took 15.6 s on one H200" goes stale with the next commit that changes
the code or the device, and nobody re-measures a comment. The reason the code is as it is stays
in the comment, in words, pointing to the section of ``docs/performance.md`` that holds the
figure with its device, data and commit.

Scanned: the ``#`` comments of every ``daskmeans/**/*.py`` (through :mod:`tokenize`, so strings
that merely contain ``#`` are not comments), the docstrings of its modules, classes and
functions (through :mod:`ast`), the ``#`` comments of ``daskmeans/daskmeans.yaml`` and the
``//`` comments of the CUDA sources. Other string literals (messages, f-strings) are output, not
comments, and are not scanned.

What counts as a measured figure (:data:`FIGURE`): a time (``0.3 s``, ``50 ms``, ``20 us``), a
rate (``17 GB/s``, ``150 GFLOP/s``, ``rows/s``), a speed ratio (``1.5x``, ``2x faster``, ``8x
the``), a device named with it (``H100``, ``H200``, ``A100`` ...: a measurement's context) or a
benchmark outcome phrased as ``took N``. Numbers that are behaviour (a timeout that IS the
setting, Dask's defaults the code waits on, example output lines) are in :data:`ALLOWED`, each
with its reason, matched by a snippet of the line so that the entry survives edits elsewhere in
the file. An entry that no longer matches anything fails too, so the list stays small.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "daskmeans"

FIGURE = re.compile(
    r"""
      (?<![\w.])\d+(?:\.\d+)?\s?(?:ms|us|µs|ns|s|sec|seconds?|milliseconds?|microseconds?|minutes?|hours?)\b
    | (?<![\w.])\d+(?:\.\d+)?\s?(?:[kKMGT]i?B/s|[GT]FLOP/s|rows/s)
    | (?<![\w.])\d+(?:\.\d+)?\s?[x×]\s(?:faster|slower|the|as\sfast)\b
    | (?<![\w.])\d+\.\d+\s?[x×](?!\w)
    | \b(?:H100|H200|A100|B100|V100|L40S?|RTX\s?\d+)\b
    | \btook\s(?:over\s|about\s|~\s?)?\d
    """,
    re.X,
)

# (file under daskmeans/, a snippet of the line, why it is no measured figure)
ALLOWED: tuple[tuple[str, str, str], ...] = (
    ("backends/gpu_plan.py", "A100/H100/B100-class GPUs",
     "the GPUs fp32's auto mode picks split TF32 on, named by compute capability: behaviour"),
    ("estimator.py", "A100/H100-class GPUs", "the GPUs fp32 runs as split TF32 on: behaviour"),
    ("daskmeans.yaml", "A100/H100/B100-class GPUs", "the GPUs the setting's auto value picks: behaviour"),
    ("daskmeans.yaml", "TF32 runs 8x the fp32 rate",
     "the vendors' datasheet ratio that auto's choice rests on, not a measurement"),
    ("config.py", '``"300s"``, ``"1.5s"``', "examples of a duration setting's syntax"),
    ("dask_cluster.py", "(30 s from the command)",
     "the command's client timeout, the setting itself (Client(timeout='30s'))"),
    ("dask_cluster.py", "its connect timeout (30 s)", "Dask's connect timeout, a default the code waits on"),
    ("dask_cluster.py", "within the nanny's 5 s", "distributed's Nanny close timeout, a default the code handles"),
    ("engine/watch.py", "its connect timeout (30 s)", "Dask's connect timeout, a default the code waits on"),
    ("liveness.py", "its connect timeout: 30 s", "Dask's connect timeout, a default the code waits on"),
    ("engine/watch.py", "``worker-ttl`` (5 minutes)", "Dask's worker-ttl default, which the liveness watch works around"),
    ("liveness.py", "``worker-ttl`` (5 minutes)", "Dask's worker-ttl default, which the liveness watch works around"),
    ("liveness.py", "(every 0.5 s on a small cluster", "distributed's heartbeat interval on a small cluster"),
    ("liveness.py", "no reply for 15 s``", "an example of the note's text"),
    ("liveness.py", "(at most 30 s, at least four heartbeat", "the bound the code sets (min(limit / 2, 30.0))"),
    ("progress.py", "chunks in 0.53 s``", "an example of the output line"),
    ("progress.py", "0.20 s``); nothing when", "an example of the output line"),
    ("timing.py", "``read 0.01 s, place 0.12 s", "an example of the output line"),
    ("sweep.py", "(inertia 20x the rest)", "an inertia ratio that illustrates the elbow rule, not a speed"),
    ("cli/main.py", "failed reconnection, 30 s on)", "Dask's reconnection timeout, a default the code filters after"),
    # daskmeans/cli/ is being reworked in parallel: its figures move to performance.md with
    # that work (these entries then no longer match and must be removed).
)


def _docstring_lines(src: str) -> list[tuple[int, str]]:
    """The lines of every module, class and function docstring of ``src``: ``(line, text)``."""
    out = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                segment = ast.get_source_segment(src, first) or ""
                out.extend((first.lineno + i, line) for i, line in enumerate(segment.splitlines()))
    return out


def _comment_lines(path: Path) -> list[tuple[int, str]]:
    """The comment and docstring lines of one file of the package: ``(line, text)``."""
    src = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        lines = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(src).readline)
                 if tok.type == tokenize.COMMENT]
        return lines + _docstring_lines(src)
    mark = "#" if path.suffix == ".yaml" else "//"
    return [(i, line[line.index(mark):]) for i, line in enumerate(src.splitlines(), 1) if mark in line]


def _scanned() -> list[Path]:
    files = [p for p in PACKAGE.rglob("*") if p.suffix in (".py", ".yaml", ".cu", ".cuh")
             and "__pycache__" not in p.parts]
    assert any(p.name == "estimator.py" for p in files), f"no package files found under {PACKAGE}"
    return sorted(files)


def test_comments_hold_no_measured_figures():
    found, used = [], set()
    for path in _scanned():
        rel = path.relative_to(PACKAGE).as_posix()
        for lineno, text in _comment_lines(path):
            if not FIGURE.search(text):
                continue
            allowed = [i for i, (f, snippet, _) in enumerate(ALLOWED) if f == rel and snippet in text]
            if allowed:
                used.update(allowed)
            else:
                found.append(f"daskmeans/{rel}:{lineno}: {text.strip()}")
    assert not found, (
        "measured figures in comments or docstrings (keep the reason in words and move the figure, "
        "with its device, data and commit, to docs/performance.md; or add a behavioural constant to "
        "ALLOWED with its reason):\n" + "\n".join(found))
    stale = [f"daskmeans/{f}: {snippet!r}" for i, (f, snippet, _) in enumerate(ALLOWED) if i not in used]
    assert not stale, "ALLOWED entries that match no line any more (remove them):\n" + "\n".join(stale)


def test_the_pattern_finds_figures_and_spares_plain_numbers():
    """The pattern itself: what it must catch, and ordinary numbers it must leave alone."""
    for text in ("took 15.6 s", "~0.3 s of imports", "a few ms (12 ms)", "17 GB/s on one core",
                 "150 GFLOP/s per worker", "1.98x on 2 GPUs", "2x faster", "one H200", "~20 us",
                 "took over 30 s"):
        assert FIGURE.search(text), f"{text!r} is a measured figure the pattern must find"
    for text in ("K = 2^16 on 2e6 x 128 blobs", "a 10% margin", "16 MiB buffers", "3xtf32",
                 "float64", "2 N K D FLOP/s", "rows x K", "1e6 x 16 array", "0x1f", "segments"):
        assert not FIGURE.search(text), f"{text!r} is no measured figure, yet the pattern matches it"
