"""``python -m benchmarks ab``: another benchmark of this harness run alternately on the current
code and on a baseline commit installed beside it, in one lease, and their ratio.

The baseline is a source tree of the other commit (``git archive COMMIT | tar -x -C DIR``: its
own ``benchmarks/``) and the folder its package is installed into (``pip install --no-deps
--target SITE DIR``). Each round runs the inner benchmark once on each code, as a subprocess:
the current code from this repository's root, the baseline from ``DIR`` with ``SITE`` first on
``PYTHONPATH``. The rounds alternate which code goes first (current, baseline; then baseline,
current; ...: ABBA), so that neither always finds the GPUs warm or idle from the other's run.

The inner benchmark writes its rows to a file per run (its ``--out``); rows are matched by its
layout's key fields (``multigpu``: problem, precision, GPU count, collective, chunking), and for
each the runs' ``--metric`` (default ``iteration_s``) is reported with its position in its
round, the medians of both codes and the ratio current / baseline (issue 43: P3 and P4 per
iteration within 3% of 8c3ca9b's).

    python -m benchmarks ab --baseline-src DIR --baseline-site SITE [--rounds 4] [--metric iteration_s] \\
        [--out r.json [--merge]] -- multigpu --problems P3,P4 --precisions fp32 --iters 8 --no-init

Committed results: ``results/ab_<device>.json``, entries keyed ``<subcommand> <baseline commit>
<row key>``.
"""

from __future__ import annotations

import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks import meta

SUMMARY = "another benchmark on the current code and on a baseline commit beside it, alternating (ABBA), and their ratios"

LAYOUT = meta.Layout(entries=("comparisons",))


def order(round_: int) -> tuple[str, str]:
    """Which code goes first in round ``round_`` (0-based): current first in even rounds."""
    return ("current", "baseline") if round_ % 2 == 0 else ("baseline", "current")


def metric_by_row(doc: dict, rows: dict[str, tuple[str, ...]], metric: str) -> dict[str, float]:
    """``{row key: the row's metric}`` for every row of ``doc`` (one inner run's results) in
    the lists ``rows`` names (``{list name: key fields}``, the inner benchmark's layout); the
    key is the list's name and its fields' values, joined by spaces."""
    out = {}
    for name, fields in rows.items():
        for row in doc.get(name) or ():
            if row.get(metric) is not None:
                out[" ".join([name, *(str(row.get(f)) for f in fields)])] = float(row[metric])
    return out


def compare(runs: list[tuple[str, int, dict[str, float]]]) -> dict[str, dict]:
    """The comparison of each row found in both codes' runs: ``runs`` holds (code, position in
    its round, ``metric_by_row``'s values) per inner run."""
    keys = sorted({k for _, _, vals in runs for k in vals})
    out = {}
    for key in keys:
        got = {code: [(pos, vals[key]) for c, pos, vals in runs if c == code and key in vals]
               for code in ("current", "baseline")}
        if not got["current"] or not got["baseline"]:
            continue
        med = {code: statistics.median(v for _, v in got[code]) for code in got}
        out[key] = {
            "current": [v for _, v in got["current"]], "baseline": [v for _, v in got["baseline"]],
            "current_first_in_round": [pos == 0 for pos, _ in got["current"]],
            "current_median": med["current"], "baseline_median": med["baseline"],
            "ratio": med["current"] / med["baseline"],
        }
    return out


def _baseline_commit(src: str) -> str:
    """The baseline's commit (:func:`meta.commit` of its tree), else the folder's name."""
    return meta.commit(src, short=True) or os.path.basename(os.path.abspath(src))


def _run(code: str, inner: list[str], src: str, site: str, out: str, timeout: float) -> dict:
    env = dict(os.environ)
    cwd = meta.ROOT
    if code == "baseline":
        cwd = src
        env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.abspath(site), env.get("PYTHONPATH")) if p)
    p = subprocess.run([sys.executable, "-m", "benchmarks", *inner, "--out", out], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{code} run of {' '.join(inner)} failed ({p.returncode}): {p.stderr[-2000:]}")
    for line in p.stdout.splitlines()[-20:]:  # the inner benchmark's own report (its breakdown of the metric)
        print(f"    {code}: {line}", flush=True)
    with open(out) as f:
        return json.load(f)


def main(argv=None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    inner = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    ap = meta.parser("ab", __doc__)
    ap.add_argument("--baseline-src", required=True, metavar="DIR", help="the baseline commit's source tree")
    ap.add_argument("--baseline-site", required=True, metavar="SITE", help="where the baseline's package is installed")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of one run of each code (default 4)")
    ap.add_argument("--metric", default="iteration_s", help="the rows' field compared (default iteration_s)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds one inner run may take")
    meta.add_output_options(ap)
    args = ap.parse_args(own)
    meta.check_output(ap, args, "ab")
    if not inner:
        ap.error("name the benchmark to run after '--' (e.g. -- multigpu --problems P3)")
    if any(a in ("--out", "--merge") for a in inner):
        ap.error("the inner benchmark's --out is this benchmark's own: give --out before '--'")
    layout = getattr(importlib.import_module(f"benchmarks.{inner[0].replace('-', '_')}"), "LAYOUT", None)
    if layout is None or not layout.rows:
        ap.error(f"{inner[0]} writes no rows to compare")
    baseline = _baseline_commit(args.baseline_src)
    runs = []
    with tempfile.TemporaryDirectory() as folder:
        for r in range(args.rounds):
            for pos, code in enumerate(order(r)):
                doc = _run(code, inner, args.baseline_src, args.baseline_site, os.path.join(folder, f"{r}-{code}.json"),
                           args.timeout)
                vals = metric_by_row(doc, layout.rows, args.metric)
                runs.append((code, pos, vals))
                print(f"round {r} {code:8s} " + " ".join(f"{k}: {v:.6g}" for k, v in sorted(vals.items())), flush=True)
            # Written after every round, so that a run stopped early (a lease's time limit)
            # leaves the rounds it completed.
            res = _result(runs, inner, baseline, r + 1, args.metric)
            if r == 0:
                meta.write(res, args.out, LAYOUT, args.merge)
            else:
                meta.write(res, args.out, LAYOUT, True)
    for key, v in res["comparisons"].items():
        print(f"{key}: current {v['current_median']:.6g}, baseline {v['baseline_median']:.6g}, ratio {v['ratio']:.4f}")


def _result(runs: list, inner: list[str], baseline: str, rounds: int, metric: str) -> dict:
    """The benchmark's document from the runs of the ``rounds`` rounds completed."""
    found = compare(runs)
    return {"benchmark": "ab", "device": meta.device_name(), "date": meta.now(), "commit": meta.commit(),
            "comparisons": {f"{inner[0]} {baseline} {key}": {**v, "baseline_commit": baseline, "metric": metric,
                                                              "inner": inner, "rounds": rounds}
                            for key, v in found.items()}}


if __name__ == "__main__":
    sys.exit(main())
