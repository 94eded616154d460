"""``python -m benchmarks table``: the README's performance tables, generated from the committed
results in ``benchmarks/results/``.

Rewrites the block of README.md between ``<!-- performance:begin -->`` and
``<!-- performance:end -->``: the kernel step against the GEMM floor (P2-P4, fp32 and tf32),
the whole command against scikit-learn's script, the multi-GPU speed-up and the tiers against
their floors, each table naming its source file and commits. Needs no GPU and imports no GPU
library. With ``--check`` it writes nothing and exits 1 with a one-line message where the
README's block differs from what it would write (the tests run it so).

    python -m benchmarks table [--check] [--readme README.md] [--results benchmarks/results]
"""

from __future__ import annotations

import json
import os
import sys

from benchmarks import meta, problems

SUMMARY = "the README's performance tables from benchmarks/results/ (--check: fail where they differ)"  # its line in --help

BEGIN, END = "<!-- performance:begin -->", "<!-- performance:end -->"

# The results each table is made from (one device kind each; other kinds stay in docs/performance.md).
KERNELS = "gpu_kernels_h200.json"
KERNELS_WIDE = "gpu_kernels_h200.json"
COMMANDS = ("command_h100.json", "command_cpu_2core.json")
MULTIGPU = "multigpu_h100x4.json"
TIERS = "tiers_h200.json"
PLACEMENT = "placement_h200.json"


def _sig(x: float) -> str:
    """Three significant digits, trailing zeros kept (``52.0``, ``0.450``); whole from 100 up."""
    return f"{x:.0f}" if x >= 100 else f"{x:#.3g}".rstrip(".")


def _time(seconds: float) -> str:
    return f"{_sig(seconds * 1e3)} ms" if seconds < 1 else f"{_sig(seconds)} s"


def _short(commit: str | None) -> str:
    return (commit or "unknown")[:7]


def _commits(pairs: list[tuple[str, str | None]]) -> str:
    """``"commit abc1234"``, or ``"commits abc1234 (P2, P3), def5678 (P4)"`` where they differ."""
    by: dict[str, list[str]] = {}
    for label, commit in pairs:
        labels = by.setdefault(_short(commit), [])
        if label not in labels:  # a table row of several runs (1, 2 and 4 GPUs) named once
            labels.append(label)
    if len(by) == 1:
        return f"commit {next(iter(by))}"
    return "commits " + ", ".join(f"{c} ({', '.join(labels)})" for c, labels in by.items())


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _source(name: str) -> str:
    return f"`benchmarks/results/{name}`"


def kernels(doc: dict) -> str:
    """The kernel step against the cuBLAS GEMM floor, P2-P4, fp32 and tf32."""
    rows, pairs = [], []
    for r in doc["results"]:
        if r["problem"] not in ("P2", "P3", "P4"):
            continue
        rows.append([problems.get(r["problem"]).label,
                     _time(r["daskmeans_fp32_s"]),
                     f"{r['ratio_fp32_vs_gemm_fp32']:.2f} / {r['ratio_fp32_vs_gemm_fp32_ev']:.2f}",
                     _time(r["daskmeans_tf32_s"]),
                     f"{r['ratio_tf32_vs_gemm_tf32']:.2f} / {r['ratio_tf32_vs_gemm_tf32_ev']:.2f}"])
        pairs.append((r["problem"], r.get("commit", doc.get("commit"))))
    lead = (f"**Kernel step against the cuBLAS GEMM floor** ({doc['device']}, data resident, one step; "
            "ratios synchronised / by CUDA events; targets 1.25 in fp32, 1.5 in tf32; "
            f"{_source(KERNELS)}, {_commits(pairs)}):")
    return lead + "\n\n" + _table(["problem", "fp32 step", "/ fp32 GEMM", "tf32 step", "/ TF32 GEMM"], rows)


def wide_k(doc: dict) -> str:
    """The kernel step at wide K (the IVF-training shapes, N = 2e6, D = 64 and 128) against the
    cuBLAS GEMMs and a tiled PyTorch step of the same precision."""
    rows, pairs = [], []
    for r in doc["results"]:
        if r["problem"][0] not in "WV" or "torch_tf32_s" not in r:
            continue
        flash, fp16 = r.get("ratio_tf32_vs_flash_fp16"), r.get("ratio_tf32_vs_gemm_fp16")
        rows.append([f"{r['problem']} (D = {r['d']}, K = 2^{r['k'].bit_length() - 1})",
                     _time(r["daskmeans_fp32_s"]), f"{r['ratio_fp32_vs_gemm_fp32']:.2f}",
                     f"{r['speedup_fp32_vs_torch']:.2f}x",
                     _time(r["daskmeans_tf32_s"]), f"{r['ratio_tf32_vs_gemm_tf32']:.2f}",
                     f"{fp16:.2f}" if fp16 else "", f"{r['speedup_tf32_vs_torch']:.2f}x",
                     f"{flash:.2f}" if flash else "", f"{100 * r['rechecked_tf32']:.1f}%"])
        pairs.append((r["problem"], r.get("commit", doc.get("commit"))))
    lead = (f"**Wide K** ({doc['device']}, N = 2e6 randn rows, data resident, one step, synchronised; "
            "targets 0.7 of the fp32 GEMM in fp32, 1.5 of the TF32 GEMM in tf32, faster than the PyTorch step "
            "(GEMM, argmin, index_add; labels not certified) of the same precision; tf32 multiplies scaled "
            "float16 inputs, in one kernel with the selection (fused_select, no distance tile) at D <= 128 and "
            "through a float16 tile above K = 2048 elsewhere, so its own floor is the fp16 GEMM; its peer "
            "flash-kmeans' float16 iteration (neither certified labels nor exact sums), where it ran; "
            f"{_source(KERNELS_WIDE)}, {_commits(pairs)}):")
    return lead + "\n\n" + _table(["problem", "fp32 step", "/ fp32 GEMM", "vs PyTorch", "tf32 step", "/ TF32 GEMM",
                                    "/ fp16 GEMM", "vs PyTorch", "/ flash-kmeans fp16", "re-ranked"], rows)


def _host(doc: dict) -> str:
    if any(e.get("backend") == "cupy" for e in doc["problems"].values()):
        return doc["device"]
    return f"CPU, {doc['cores']} cores"


def commands(docs: dict[str, dict]) -> str:
    """Whole ``daskmeans fit`` commands, warm and cold, against scikit-learn's script."""
    from benchmarks.command import PROBLEMS as RUNS

    rows, sources = [], []
    for name, doc in docs.items():
        pairs = []
        for run in sorted(doc["problems"], key=list(RUNS).index):
            e = doc["problems"][run]
            label = RUNS[run]["problem"].label + (", CSV" if e["format"] == "csv" else "")
            sk = e.get("sklearn_script_s")
            rows.append([_host(doc), label, _time(e["wall_s"]),
                         _time(e["cold_wall_s"]) if e["cold_wall_s"] is not None else "",
                         _time(sk) if sk else "", f"{e['wall_s'] / sk:.2f}" if sk else ""])
            pairs.append((run, e.get("commit", doc.get("commit"))))
        sources.append(f"{_source(name)}, {_commits(pairs)}")
    repeats = sorted({len(e.get("walls_s") or [0, 0, 0]) for doc in docs.values() for e in doc["problems"].values()})
    lead = ("**Whole command** (`daskmeans fit` as a subprocess, wall clock: median of "
            f"{' or '.join(map(str, repeats))} runs with a warm kernel cache, "
            "and once with an empty one) against scikit-learn's script doing the same (start, imports, load, fit; "
            f"{'; '.join(sources)}):")
    return lead + "\n\n" + _table(["host", "problem", "warm", "empty kernel cache", "scikit-learn's script",
                                   "warm / scikit-learn"], rows)


def multigpu(doc: dict) -> str:
    """Per-iteration time on 1 GPU and the speed-up on each larger GPU count, P3 and P4."""
    rows_in = [r for r in doc["results"] if r["chunking"] == "default" and r["collective"] != "dask"]
    counts = sorted({r["gpus"] for r in rows_in if r["gpus"] > 1})
    by = {(r["problem"], r["precision"], r["gpus"]): r for r in rows_in}
    rows, pairs, collectives = [], [], []
    for (problem, precision, g), base in by.items():
        if g != 1:
            continue
        cells, same = [_time(base["iteration_s"])], True
        for n in counts:
            r = by.get((problem, precision, n))
            if r is None:
                cells.append("")
                continue
            cells.append(f"{_time(r['iteration_s'])} ({base['iteration_s'] / r['iteration_s']:.2f}x)")
            same = same and r["bitwise_same_as_1_gpu"]
            if r["collective"].upper() not in collectives:
                collectives.append(r["collective"].upper())
            pairs.append((f"{problem} {precision}", r.get("commit", doc.get("commit"))))
        rows.append([problems.get(problem).label, precision, *cells, "yes" if same else "**no**"])
    lead = (f"**Multi-GPU** ({doc['device']}, one iteration: kernels, {' or '.join(collectives)} all-reduce, "
            f"update; time and speed-up over 1 GPU; {_source(MULTIGPU)}, {_commits(pairs)}):")
    return lead + "\n\n" + _table(["problem", "precision", "1 GPU", *[f"{n} GPUs" for n in counts],
                                   "centroids bitwise those of 1 GPU"], rows)


def tiers(doc: dict, placement: dict | None = None) -> str:
    """The host and storage tiers against their floors, P4 in the host tier, and (from the
    placement benchmark's ``placement``) a file placed in the host tier and the storage tier's
    iteration against the store's decode or raw read on every core."""
    rows, pairs = [], []
    t = doc.get("throughput")
    if t:
        gib = t["data_bytes"] / 2**30
        rows.append([f"host tier: {gib:.3g} GiB ({t['n']:,} x {t['d']}, K = {t['k']}), "
                     f"{t['device_budget'] / 2**30:.3g} GiB device budget",
                     f"{_sig(t['host']['GBps'])} GB/s", f"pinned host-to-device copy {_sig(t['h2d_pinned_GBps'])} GB/s",
                     f"{t['host']['ratio_to_h2d_floor']:.2f}"])
        rows.append(["storage tier: the same data from Zarr", f"{_sig(t['storage']['GBps'])} GB/s",
                     f"the store's one-thread read {_sig(t['store_read_GBps'])} GB/s",
                     f"{t['storage']['ratio_to_store_floor']:.2f}"])
        pairs.append(("throughput", t.get("commit", doc.get("commit"))))
    p4 = doc.get("p4")
    if p4:
        rows.append([f"{problems.get('P4').label} per iteration, host tier", _time(p4["host"]["iteration_s"]),
                     f"device tier {_time(p4['device']['iteration_s'])}", f"{p4['host_over_device']:.2f}"])
        pairs.append(("P4", p4.get("commit", doc.get("commit"))))
    sources = [f"{_source(TIERS)}, {_commits(pairs)}"]
    if placement:
        gb, fl = placement["n"] * placement["d"] * 4 / 1e9, placement["floors"]
        what = {"zarr-host": "placement, host tier: Zarr (Zstd)", "npy-host": "placement, host tier: `.npy`",
                "zarr-storage": "storage tier's iteration: Zarr (Zstd)"}
        floor = {"decode_GBps_16": f"the store's decode on {fl['threads']} threads",
                 "raw_read_GBps_16": f"the file's read on {fl['threads']} threads"}
        mine = []
        for run, label in what.items():
            r = placement["runs"].get(run)
            if r is None:
                continue
            rate = r["place_GBps"] if "place_GBps" in r else r["iteration_GBps"]
            ratio = r["place_over_floor"] if "place_over_floor" in r else r["iteration_over_floor"]
            rows.append([f"{label}, {gb:.3g} GB ({placement['n']:,} x {placement['d']})", f"{_sig(rate)} GB/s",
                         f"{floor.get(r['floor'], r['floor'])} {_sig(fl[r['floor']])} GB/s", f"{ratio:.2f}"])
            mine.append((run, r.get("commit", placement.get("commit"))))
        sources.append(f"{_source(PLACEMENT)}, {_commits(mine)}")
    lead = (f"**Out-of-core tiers** ({doc['device']}, data streamed from host memory or re-read from the store "
            f"each iteration, against the floor measured in the same run; {'; '.join(sources)}):")
    return lead + "\n\n" + _table(["what", "figure", "floor", "ratio"], rows)


def generate(results: str) -> str:
    """The README's performance block (between the markers) from the files in ``results``."""

    def load(name):
        with open(os.path.join(results, name)) as f:
            return json.load(f)

    parts = [
        "<!-- generated by `python -m benchmarks table` from benchmarks/results/: edit those, not this block -->",
        kernels(load(KERNELS)),
        wide_k(load(KERNELS_WIDE)),
        commands({name: load(name) for name in COMMANDS}),
        multigpu(load(MULTIGPU)),
        tiers(load(TIERS), load(PLACEMENT) if os.path.exists(os.path.join(results, PLACEMENT)) else None),
    ]
    return "\n\n".join(parts)


def splice(readme: str, block: str) -> str:
    """``readme`` with its performance block replaced by ``block``.

    Raises
    ------
    ValueError
        Where the README has not exactly one pair of markers, in order.
    """
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or readme.index(BEGIN) > readme.index(END):
        raise ValueError(f"needs one {BEGIN} ... {END} block")
    head, rest = readme.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{block}\n\n{END}{tail}"  # a blank line ends the last table


def main(argv=None):
    ap = meta.parser("table", __doc__)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 where README.md's block differs")
    ap.add_argument("--readme", default=os.path.join(meta.ROOT, "README.md"))
    ap.add_argument("--results", default=os.path.join(meta.ROOT, "benchmarks", "results"))
    args = ap.parse_args(argv)
    shown, results = os.path.relpath(args.readme), os.path.relpath(args.results)
    with open(args.readme) as f:
        readme = f.read()
    try:
        new = splice(readme, generate(args.results))
    except ValueError as e:
        sys.exit(f"{shown}: {e}")
    if args.check:
        if new != readme:
            sys.exit(f"{shown}: the performance tables differ from {results} (run `python -m benchmarks table`)")
        print(f"{shown}: the performance tables match {results}")
        return
    if new != readme:
        tmp = f"{args.readme}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(new)
        os.replace(tmp, args.readme)
        print(f"{shown}: performance tables rewritten from {results}")
    else:
        print(f"{shown}: performance tables already match {results}")


if __name__ == "__main__":
    main()
