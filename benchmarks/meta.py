"""What every benchmark records about where it ran, the one writer of results files, and the
GPU timers the benchmarks and profilers share.

Results files
-------------
``--out PATH`` writes the run's JSON to PATH, replacing it. With ``--merge`` the run is merged
into PATH where PATH exists, so that one current file per benchmark and device kind holds the
latest figure of every problem and part, whichever call measured it:

- each benchmark's :class:`Layout` names its rows (lists of dicts, a row replacing the row of
  the same key), its entries (dicts of dicts, merged by key) and its parts (dicts, each
  replaced whole); everything else at the top level is the latest run's;
- every row, entry and part carries the ``commit`` and ``date`` of the run that measured it
  (a row of an older file that has none gets that file's top-level ones on merging);
- a file of another benchmark or device is refused.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def commit(root: str | None = None, short: bool = False) -> str | None:
    """The measured commit: ``.commit`` in the working directory or the repository root
    (written before a device run, whose copy of .git may be stale), else ``git rev-parse HEAD``
    (``--short`` with ``short``). With ``root``, the commit of the tree there instead (another
    commit's tree: ``ab``'s baseline), by its ``.commit`` file or its git."""
    paths = (".commit", os.path.join(ROOT, ".commit")) if root is None else (os.path.join(root, ".commit"),)
    for path in paths:
        if os.path.exists(path):
            with open(path) as f:
                return f.read().strip() or None
    try:
        out = subprocess.run(["git", "rev-parse", *(["--short"] if short else []), "HEAD"], capture_output=True,
                             text=True, cwd=ROOT if root is None else root)
        return (out.stdout.strip() or None) if out.returncode == 0 else None
    except OSError:
        return None


def now() -> str:
    """The current UTC time, ISO 8601 to the second (the results' ``date``)."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def device_name() -> str:
    """The GPU's name where CuPy sees one, else the CPU's model."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception:  # no CuPy or no GPU: a CPU run
        pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def event_ms(fn, reps: int = 20, warm: int = 3) -> float:
    """Median milliseconds of ``fn`` between two CUDA events on the current CuPy stream
    (GPU time of the work it enqueues, plus any host time before its first launch)."""
    import cupy
    import numpy as np

    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(cupy.cuda.get_elapsed_time(a, b))
    return float(np.median(ts))


def synced_ms(fn, reps: int = 20, warm: int = 3) -> float:
    """Median milliseconds of ``fn`` between full device synchronisations (wall clock)."""
    import time

    import cupy
    import numpy as np

    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        fn()
        cupy.cuda.Device().synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(ts))


@dataclass(frozen=True)
class Layout:
    """How a benchmark's results file is merged (see the module's docstring).

    Attributes
    ----------
    rows : dict
        ``{list name: key fields}``: lists of rows, a row identified by those fields' values.
    entries : tuple of str
        Dicts of ``{key: dict}``, merged by key.
    parts : tuple of str
        Dicts replaced whole by a run that has them.
    top_commit : bool
        Whether the top level carries the latest run's ``commit`` too (the ``tiers`` file
        has the commit in its parts only).
    """

    rows: dict[str, tuple[str, ...]] = field(default_factory=dict)
    entries: tuple[str, ...] = ()
    parts: tuple[str, ...] = ()
    top_commit: bool = True

    def pieces(self, doc: dict):
        """Every row, entry and part of ``doc`` (the dicts that carry a commit and date)."""
        for name in self.rows:
            yield from doc.get(name) or ()
        for name in self.entries:
            yield from (doc.get(name) or {}).values()
        for name in self.parts:
            if isinstance(doc.get(name), dict):
                yield doc[name]


def parser(subcommand: str, doc: str) -> argparse.ArgumentParser:
    """The argument parser of ``python -m benchmarks SUBCOMMAND``, its module's docstring as
    the description."""
    return argparse.ArgumentParser(prog=f"python -m benchmarks {subcommand}", description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def names(ap: argparse.ArgumentParser, text: str, known, what: str) -> list[str]:
    """The comma-separated names of ``text``, each one of ``known``, or the parser's one-line
    error naming the first unknown one (``what``: "problem", "case", ...)."""
    chosen = [s for s in text.split(",") if s]
    for name in chosen:
        if name not in known:
            ap.error(f"unknown {what} {name!r} (choose from {', '.join(known)})")
    return chosen


def problems_arg(ap: argparse.ArgumentParser, allowed: dict, default: str) -> None:
    """The profilers' positional problem names, of ``allowed`` (``default`` when none)."""
    ap.add_argument("problems", nargs="*", metavar="PROBLEM", help=f"of {', '.join(allowed)} (default {default})")
    ap.set_defaults(_allowed=allowed, _default=default)


def chosen(ap: argparse.ArgumentParser, text: str | list, allowed: dict | None = None) -> list:
    """The problems named by ``text`` (comma-separated, or the positional names of
    :func:`problems_arg`), or the parser's one-line error."""
    from benchmarks import problems

    if isinstance(text, list):
        text = ",".join(text or [ap.get_default("_default")])
    try:  # not argparse's choices: Python 3.11 checks an empty list against them
        return problems.choose(text, allowed if allowed is not None else ap.get_default("_allowed"))
    except ValueError as e:
        ap.error(str(e))


def profile_main(subcommand: str, doc: str, allowed: dict, default: str, profile, argv=None, options=None) -> None:
    """A profiler's command line: problem names, then ``profile(problem)`` for each; with
    ``options`` (a function adding the profiler's own options to the parser),
    ``profile(problem, args)``."""
    ap = parser(subcommand, doc)
    problems_arg(ap, allowed, default)
    if options is not None:
        options(ap)
    args = ap.parse_args(argv)
    for problem in chosen(ap, args.problems):
        profile(problem) if options is None else profile(problem, args)


def add_output_options(ap: argparse.ArgumentParser) -> None:
    """``--out PATH`` and ``--merge``, as every benchmark takes them."""
    ap.add_argument("--out", metavar="PATH", help="write the results as JSON to PATH (replacing it, unless --merge)")
    ap.add_argument("--merge", action="store_true",
                    help="merge into PATH where it exists: rows and parts of this run replace theirs, the others stay")


def check_output(ap: argparse.ArgumentParser, args: argparse.Namespace, benchmark: str) -> None:
    """Refuse, before the run, ``--merge`` without ``--out`` and a file of another benchmark."""
    if args.merge and not args.out:
        ap.error("--merge needs --out PATH")
    if args.merge and os.path.exists(args.out):
        with open(args.out) as f:
            found = json.load(f).get("benchmark")
        if found not in (None, benchmark):
            ap.error(f"{args.out} holds the {found!r} benchmark, not {benchmark!r}")


def _stamp(doc: dict, layout: Layout, commit_: str | None, date: str | None) -> None:
    for piece in layout.pieces(doc):
        for key, value in (("commit", commit_), ("date", date)):
            if value is not None:
                piece.setdefault(key, value)


def merged(old: dict, new: dict, layout: Layout) -> dict:
    """``new`` merged into ``old``, both stamped (see the module's docstring).

    Raises
    ------
    ValueError
        Where ``old`` is another benchmark's or another device's file.
    """
    for key in ("benchmark", "device"):
        if key in old and key in new and old[key] != new[key]:
            raise ValueError(f"the file holds {key} {old[key]!r}, this run is {new[key]!r}: write another file")
    _stamp(old, layout, old.get("commit"), old.get("date"))
    out = dict(old)
    for key, value in new.items():
        if key in layout.rows:
            fields = layout.rows[key]
            rows = list(old.get(key) or [])
            index = {tuple(r.get(f) for f in fields): i for i, r in enumerate(rows)}
            for r in value:
                i = index.get(tuple(r.get(f) for f in fields))
                if i is None:
                    index[tuple(r.get(f) for f in fields)] = len(rows)
                    rows.append(r)
                else:
                    rows[i] = r
            out[key] = rows
        elif key in layout.entries:
            out[key] = {**(old.get(key) or {}), **value}
        else:
            out[key] = value
    if not layout.top_commit:
        out.pop("commit", None)
    return out


def write(doc: dict, path: str | None, layout: Layout, merge: bool = False) -> dict:
    """Stamp ``doc``'s rows and parts with its commit and date and write it to ``path``.

    Parameters
    ----------
    doc : dict
        The run's results: ``benchmark``, ``device``, ``date`` and ``commit`` at the top (the
        commit is looked up where missing), rows and parts as ``layout`` says.
    path : str or None
        The JSON file; None writes nothing (the document is still stamped and returned).
    layout : Layout
        The benchmark's rows, entries and parts.
    merge : bool
        Merge into ``path`` where it exists instead of replacing it.

    Returns
    -------
    dict
        What was written.
    """
    doc.setdefault("date", now())
    commit_ = doc.get("commit") or commit()
    _stamp(doc, layout, commit_, doc["date"])
    if layout.top_commit:
        doc["commit"] = commit_
    else:
        doc.pop("commit", None)
    if path is None:
        return doc
    if merge and os.path.exists(path):
        with open(path) as f:
            old = json.load(f)
        try:
            doc = merged(old, doc, layout)
        except ValueError as e:  # keep the run: print it, leave the file as it is
            print(json.dumps(doc, indent=2))
            raise SystemExit(f"{path}: {e}") from None
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)  # a run that fails while writing leaves the old file
    return doc
