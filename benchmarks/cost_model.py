"""A cost model of a fit, built from measured component rates, checked against every measured
point, and used to predict fits too large to run here (``docs/scaling.md`` explains it).

    python -m benchmarks.cost_model            # rates, model vs measured, predictions

A fit costs ``read/place + init + n_iter x iteration``. One iteration on ``G`` GPUs of ``N``
nodes is the slowest rank's kernels, then the all-reduce of the partial sums, then the
centroid update; the storage tiers overlap the kernels with the data's movement, so the tier
costs only what exceeds them:

    kernel(G)   = flop / G / rate(k, d, precision) + multi_rank   (multi_rank only for G > 1)
    feed(G)     = bytes of a rank's rows / the tier's rate (host: the pinned copy; storage: the
                  store's read rate; device: 0)
    collective  = 2 (p - 1) / p x S / link   (reduce-scatter + all-gather over p ranks, S the
                  partials' bytes: 8 K (D + 2)); across nodes, within a node over NVLink,
                  then between the nodes over the network
    iteration   = max(kernel, feed) + collective + update
    init        = 2.5 x kernel_tf32(G) + seed(K, D)   (k-means||: all rounds' passes cost an
                  assignment against ~2.5 K centres; the recluster to K on one GPU grows as K^2 D)

Every rate is a :class:`Rate` loaded from a committed result (``benchmarks/results/*.json``)
with the file and key it came from, or from figures reported in issue 34's text (no JSON was
committed for them): those carry ``issue 34`` as their source. The functions of shapes and
rates are pure; :func:`load_rates` and :func:`measured_points` read the files.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

# The model's error on the points it is checked against (|model / measured - 1|), stated in
# docs/scaling.md and asserted by tests/unit/test_cost_model.py.
STATED_ERROR = {"iteration": 0.15, "init": 0.25}

# Figures reported in issue 34's text, measured on 4 H100s (the runs' JSON was not committed).
# NCCL forced onto sockets: NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket, lo.
REPORTED = {
    "sockets_p4_speedup_4gpu": 3.52,  # P4, 4 GPUs, NCCL over sockets, against 1 GPU
    "sockets_p3_speedup_4gpu": 1.38,  # P3, 4 GPUs, NCCL over sockets, against 1 GPU
    "hosts2_p3_nccl_sockets_iteration_s": 0.0122,  # P3, 2 hosts x 2 GPUs (127.0.0.2/3), NCCL sockets
    "hosts2_p3_dask_comms_iteration_s": 0.031,  # the same with --collective dask (shared memory off)
    "fit_2e7x768_k40000_iteration_s": 1.68,  # 2e7 x 768 f32, K = 40,000, tf32, 4 GPUs
    "fit_2e7x768_k40000_init_s": 9.9,
}
ISSUE = "issue 34 (reported, no committed JSON)"


@dataclass(frozen=True)
class Rate:
    """A measured quantity and where it came from (``file: key``)."""

    value: float
    unit: str
    source: str


@dataclass(frozen=True)
class Shape:
    """A fit's shape: ``n`` rows of ``d`` float32 features, ``k`` clusters."""

    n: float
    d: int
    k: int
    precision: str = "tf32"

    @property
    def flop(self) -> float:
        """The GEMM's flop per iteration (2 n d k)."""
        return 2.0 * self.n * self.d * self.k

    @property
    def partial_bytes(self) -> float:
        """The all-reduced buffer per iteration: int64 sums (k x d), weights and counts (k)."""
        return 8.0 * self.k * (self.d + 2)

    @property
    def data_bytes(self) -> float:
        return 4.0 * self.n * self.d


# ---------------------------------------------------------------- the model (pure functions)


def allreduce_seconds(nbytes: float, ranks: int, bytes_per_s: float) -> float:
    """A bandwidth-optimal all-reduce (reduce-scatter + all-gather, or a ring) of ``nbytes``
    over ``ranks``: each rank sends and receives ``2 (p - 1) / p`` of the buffer."""
    if ranks <= 1:
        return 0.0
    return 2.0 * (ranks - 1) / ranks * nbytes / bytes_per_s


def hierarchical_allreduce_seconds(nbytes: float, gpus_per_node: int, nodes: int, intra_bps: float,
                                   inter_bps: float) -> float:
    """Within each node over ``intra_bps`` (NVLink), then between nodes, each of a node's
    ``gpus_per_node`` ranks carrying ``1 / gpus_per_node`` of the buffer over its own share of
    the node's link (``inter_bps`` per GPU): NCCL's tree/ring across nodes, and the Dask
    collective's shared memory within a host plus reduce-scatter + all-gather across."""
    intra = allreduce_seconds(nbytes, gpus_per_node, intra_bps)
    inter = allreduce_seconds(nbytes / gpus_per_node, nodes, inter_bps)
    return intra + inter


@dataclass
class Iteration:
    """One iteration's parts (seconds) and what bounds it."""

    kernel: float
    feed: float
    collective: float
    update: float
    parts: dict = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return max(self.kernel, self.feed) + self.collective + self.update

    @property
    def bound(self) -> str:
        """The largest part: kernels, storage (the tier's feed) or network (the collective)."""
        parts = {"kernels": self.kernel, "storage": self.feed, "network": self.collective}
        return max(parts, key=parts.get)


def iteration(shape: Shape, gpus: int, kernel_flops: float, multi_rank_s: float, update_s: float,
              collective_s: float = 0.0, feed_bps: float | None = None) -> Iteration:
    """An iteration on ``gpus`` GPUs: the kernels at ``kernel_flops`` flop/s per GPU (plus the
    per-iteration cost of several ranks), the tier's feed (a rank's rows at ``feed_bps``,
    overlapped with the kernels; None: the device tier), the collective and the update."""
    kernel = shape.flop / gpus / kernel_flops + (multi_rank_s if gpus > 1 else 0.0)
    feed = 0.0 if feed_bps is None else shape.data_bytes / gpus / feed_bps
    return Iteration(kernel, feed, collective_s, update_s)


def init_seconds(shape: Shape, gpus: int, kernel_flops_tf32: float, multi_rank_s: float, seed_ref_s: float,
                 seed_ref: Shape, feed_bps: float | None = None) -> float:
    """k-means||: its rounds' passes cost an assignment of the rows against ~2.5 K centres
    (TF32 kernels, split over the GPUs; in the storage tier each round re-reads the store), then
    the candidates' recluster to K on one GPU, which grows as K^2 D from a measured one
    (``seed_ref_s`` at ``seed_ref``)."""
    passes = 2.5 * (shape.flop / gpus / kernel_flops_tf32 + (multi_rank_s if gpus > 1 else 0.0))
    if feed_bps is not None:
        # One pass a round but the first, which draws without one, and the last fold: 5 (6
        # before 4cddf96, whose first round was a pass against one row).
        passes = max(passes, 5 * shape.data_bytes / gpus / feed_bps)
    seed = seed_ref_s * (shape.k / seed_ref.k) ** 2 * (shape.d / seed_ref.d)
    return passes + seed


# ---------------------------------------------------------------- rates from the committed results


def _load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _row(name: str, **match) -> tuple[dict, str]:
    """The one row of ``name``'s ``results`` matching ``match``, and its key as text."""
    rows = [r for r in _load(name)["results"] if all(r.get(k) == v for k, v in match.items())]
    if len(rows) != 1:
        raise LookupError(f"{name}: {len(rows)} rows match {match}, expected 1")
    key = ",".join(f"{k}={v}" for k, v in match.items())
    return rows[0], f"{name}: results[{key}]"


def init_calibration(name: str, rows: list, commit: str) -> tuple[float, float, str]:
    """``(seed_P4, tf32_step_s, source)`` of ``commit``'s runs in the multi-GPU file ``name``:
    the recluster's seconds at P4, its 1-GPU init less its passes (2.5 x one TF32 assignment:
    the init runs its passes in TF32 whatever the fit's precision), and that TF32 step: the
    commit's own 1-GPU tf32 run, or else the kernel benchmark's P4 tf32 step on that device
    (its file and commit named in the source)."""
    ones = [r for r in rows if r["commit"] == commit and r["gpus"] == 1 and r["problem"] == "P4"
            and r.get("init_s") and r.get("chunking", "default") == "default"]
    one = ([r for r in ones if r["precision"] == "tf32"] or ones)[0]
    src = f"{name}: results[P4,{one['precision']},1 GPU,{commit}].init_s"
    tf = [r for r in ones if r["precision"] == "tf32"]
    if tf:
        step = tf[0]["kernel_s"]
        return one["init_s"] - 2.5 * step, step, f"{src} - 2.5 x kernel_s"
    kname = f"gpu_kernels_{name.split('_')[1].split('.')[0].split('x')[0]}.json"
    k, ksrc = _row(kname, problem="P4")
    step = k["daskmeans_tf32_s"]
    return one["init_s"] - 2.5 * step, step, f"{src} - 2.5 x {ksrc}.daskmeans_tf32_s ({k['commit']})"


def load_rates() -> dict[str, Rate]:
    """Every component rate the model uses, each with the file and key it came from."""
    rates: dict[str, Rate] = {}
    # Kernel rates of today's kernels at each measured shape, one H100.
    for r in _load("gpu_kernels_h100.json")["results"]:
        for prec in ("fp32", "tf32"):
            flop = 2.0 * r["n"] * r["d"] * r["k"]
            rates[f"kernel_{r['problem']}_{prec}"] = Rate(
                flop / r[f"daskmeans_{prec}_s"], "flop/s",
                f"gpu_kernels_h100.json: results[problem={r['problem']}].daskmeans_{prec}_s")
    # The per-iteration cost of several ranks, seen in the kernels' time (P3, 2 GPUs).
    one, src1 = _row("multigpu_h100x2.json", problem="P3", precision="fp32", gpus=1)
    two, src2 = _row("multigpu_h100x2.json", problem="P3", precision="fp32", gpus=2, collective="nccl")
    rates["multi_rank"] = Rate(two["kernel_s"] - one["kernel_s"] / 2, "s",
                               f"{src2}.kernel_s - {src1}.kernel_s / 2")
    # NCCL over NVLink: P3's 16 MB on 4 GPUs (P4's collective_s also holds the ranks' skew).
    r, src = _row("multigpu_h100x4.json", problem="P3", precision="fp32", gpus=4, collective="nccl")
    p3 = Shape(r["n"], r["d"], r["k"])
    rates["nccl_nvlink"] = Rate(2 * 3 / 4 * p3.partial_bytes / r["collective_s"], "B/s per rank",
                                f"{src}.collective_s")
    # NCCL over sockets: P3 on 4 GPUs at 1.38x (reported), its kernels as measured on NVLink.
    one_gpu_p3 = _row("multigpu_h100x4.json", problem="P3", precision="fp32", gpus=1)[0]["iteration_s"]
    t_sock = one_gpu_p3 / REPORTED["sockets_p3_speedup_4gpu"]
    rest = t_sock - r["kernel_s"] - (r["iteration_s"] - r["kernel_s"] - r["collective_s"])
    rates["nccl_sockets"] = Rate(2 * 3 / 4 * p3.partial_bytes / rest, "B/s per rank",
                                 f"{ISSUE}: sockets_p3_speedup_4gpu, with {src}.kernel_s")
    # The Dask collective through the comms (shared memory off), today's code: P3 on 2 hosts x
    # 2 GPUs (reported), its kernels as measured on one host...
    rest = REPORTED["hosts2_p3_dask_comms_iteration_s"] - r["kernel_s"] - (r["iteration_s"] - r["kernel_s"]
                                                                             - r["collective_s"])
    rates["dask_comms"] = Rate(2 * 3 / 4 * p3.partial_bytes / rest, "B/s per rank",
                               f"{ISSUE}: hosts2_p3_dask_comms_iteration_s, with {src}.kernel_s")
    # ... through shared memory with host adds (4 ranks) ...
    r, src = _row("multigpu_h100x4.json", problem="P3", precision="fp32", gpus=4, collective="dask")
    rates["dask_shm_host"] = Rate(2 * 3 / 4 * p3.partial_bytes / r["collective_s"], "B/s per rank",
                                  f"{src}.collective_s")
    # ... and today's: page-locked segments added on the device (2 ranks).
    r, src = _row("multigpu_h100x2.json", problem="P3", precision="fp32", gpus=2, collective="dask")
    rates["dask_shm_device"] = Rate(2 * 1 / 2 * p3.partial_bytes / r["collective_s"], "B/s per rank",
                                    f"{src}.collective_s")
    # The tiers' feeds, one H200.
    t = _load("tiers_h200.json")["throughput"]
    rates["h2d_pinned"] = Rate(t["h2d_pinned_GBps"] * 1e9, "B/s per GPU", "tiers_h200.json: throughput.h2d_pinned_GBps")
    rates["store_read"] = Rate(t["store_read_GBps"] * 1e9, "B/s per worker",
                               "tiers_h200.json: throughput.store_read_GBps")
    # The init's recluster: P4 on 1 GPU, its passes taken out, from each file's newest init
    # (the kernels and the init changed between commits: init_calibration takes each
    # commit's own).
    for name in ("multigpu_h100x4.json", "multigpu_h200x2.json"):
        rows = [r for r in _load(name)["results"] if r["problem"] == "P4" and r.get("init_s")]
        newest = max(rows, key=lambda r: r.get("date", ""))["commit"]
        seed, _, src = init_calibration(name, rows, newest)
        rates[f"seed_P4_{name.split('_')[1].split('.')[0]}"] = Rate(seed, "s", src)
    rates["seed_P4"] = rates["seed_P4_h100x4"]
    # Orchestration per iteration (the update, statistics), P4 on 1 GPU.
    r, src = _row("multigpu_h100x4.json", problem="P4", precision="tf32", gpus=1)
    rates["update_P4"] = Rate(r["iteration_s"] - r["kernel_s"], "s", f"{src}.iteration_s - kernel_s")
    return rates


# The rows that calibrate a rate above: (file, problem, precision, gpus, collective). The
# model is checked on every other point.
CALIBRATION = {
    ("multigpu_h100x2.json", "P3", "fp32", 2, "nccl"),  # multi_rank
    ("multigpu_h100x4.json", "P3", "fp32", 4, "nccl"),  # nccl_nvlink
    ("multigpu_h100x4.json", "P3", "fp32", 4, "dask"),  # dask_shm_host
    ("multigpu_h100x2.json", "P3", "fp32", 2, "dask"),  # dask_shm_device
}
# Rows of a version of the Dask collective the model has no rate for.
OLDER = {"multigpu_h200x2.json": "the Dask collective's comms path at commit 7489229, before shared memory and "
                                 "its sender thread (today's comms rate is the 2-host run's)"}


# ---------------------------------------------------------------- measured points


@dataclass
class Point:
    """A measured point with the model's prediction of it."""

    name: str
    source: str
    measured: float
    model: float
    checked: bool = True  # False: shown, outside the stated error's claim (``why``)
    why: str = ""
    kind: str = "iteration"  # "iteration" (tiers, collectives) or "init": their own stated errors

    @property
    def ratio(self) -> float:
        return self.model / self.measured


_MULTIGPU = ("multigpu_h100x2.json", "multigpu_h100x4.json", "multigpu_h200x2.json")
_DASK_RATE = {  # which Dask collective each file's dask rows ran (by their commit)
    "multigpu_h200x2.json": "dask_comms",  # an older comms path: shown, not checked (OLDER)
    "multigpu_h100x4.json": "dask_shm_host",
    "multigpu_h100x2.json": "dask_shm_device",
}


def measured_points(rates: dict[str, Rate] | None = None) -> list[Point]:
    """Every measured multi-GPU iteration (the multi-GPU benchmark's and the whole command's),
    init and tier point in the committed results, and the points issue 34 reports, each with
    the model's value. The 1-GPU row of each file and configuration calibrates its kernels (the
    kernels changed between the files' commits); the points that calibrate a rate are shown,
    not checked."""
    rates = rates if rates is not None else load_rates()
    v = {k: r.value for k, r in rates.items()}
    pts: list[Point] = []
    for name in _MULTIGPU:
        rows = _load(name)["results"]
        for r in rows:
            base = [b for b in rows if b["gpus"] == 1 and b["problem"] == r["problem"]
                    and b["precision"] == r["precision"] and b.get("chunking", "default") == "default"]
            if not base or r is base[0]:
                continue
            b = base[0]
            shape = Shape(r["n"], r["d"], r["k"], r["precision"])
            g = r["gpus"]
            link = {"nccl": v["nccl_nvlink"], "dask": v[_DASK_RATE[name]], "single": math.inf}[r["collective"]]
            coll = allreduce_seconds(shape.partial_bytes, g, link)
            it = iteration(shape, g, shape.flop / b["kernel_s"], v["multi_rank"], b["iteration_s"] - b["kernel_s"],
                           coll)
            where = name.split("_")[1].split(".")[0]
            key = f"{name}: results[{r['problem']},{r['precision']},{g} GPU,{r['collective']},{r.get('chunking')}]"
            label = f"{where} {r['problem']} {r['precision']} {g} GPU {r['collective']} {r.get('chunking')}"
            if (name, r["problem"], r["precision"], g, r["collective"]) in CALIBRATION:
                checked, why = False, "calibrates a rate"
            elif r["collective"] == "dask" and name in OLDER:
                checked, why = False, OLDER[name]
            else:
                checked, why = True, ""
            pts.append(Point(label, key + ".iteration_s", r["iteration_s"], it.seconds, checked, why))
        # The init (k-means||, TF32 passes in every precision), P4: each commit's 1-GPU run
        # calibrates its recluster (init_calibration); its other runs are checked.
        inits = [x for x in rows if x["problem"] == "P4" and x.get("init_s")]
        for r in inits:
            if r["gpus"] == 1:
                continue
            where = name.split("_")[1].split(".")[0]
            seed, step, _ = init_calibration(name, inits, r["commit"])
            shape = Shape(r["n"], r["d"], r["k"])
            init = init_seconds(shape, r["gpus"], shape.flop / step, v["multi_rank"], seed, Shape(4e6, 480, 40000))
            same = [x for x in inits if x["gpus"] == r["gpus"] and x["commit"] == r["commit"]]
            spread = max(x["init_s"] for x in same) / min(x["init_s"] for x in same)
            pts.append(Point(f"{where} P4 init ({r['precision']} run) {r['gpus']} GPU",
                             f"{name}: results[P4,{r['precision']},{r['gpus']} GPU].init_s", r["init_s"], init,
                             kind="init", checked=spread < 1.5,
                             why="" if spread < 1.5 else f"the same init measured {spread:.2f}x apart in this "
                             "file's two runs of that GPU count"))
    # The tiers: the host tier's pinned copies and the storage tier's reads against their floors.
    t = _load("tiers_h200.json")
    th = t["throughput"]
    shape = Shape(th["n"], th["d"], th["k"])
    for tier, rate in (("host", "h2d_pinned"), ("storage", "store_read")):
        it = iteration(shape, 1, math.inf, 0.0, 0.0, feed_bps=v[rate])
        pts.append(Point(f"h200 tiers {tier} (n={th['n']}, d={th['d']})",
                         f"tiers_h200.json: throughput.{tier}.iteration_s", th[tier]["iteration_s"], it.seconds))
    p4 = Shape(4e6, 480, 40000, "fp32")
    dev = t["p4"]["device"]["iteration_s"]
    it = iteration(p4, 1, p4.flop / dev, 0.0, 0.0, feed_bps=v["h2d_pinned"])
    pts.append(Point("h200 P4 host tier (kernels from its device-tier run)", "tiers_h200.json: p4.host.iteration_s",
                     t["p4"]["host"]["iteration_s"], it.seconds))
    # The whole command's 2-GPU P4 fits (Zarr input, default precision), their kernels from a
    # 1-GPU run of the same device: the command's own P4 (H100), the multi-GPU file's (H200,
    # the same commit).
    one_h100 = _load("command_h100.json")["problems"]["p4"]
    one_h200 = _row("multigpu_h200x2.json", problem="P4", precision="fp32", gpus=1, chunking="default")[0]
    for name, one_iter, one_kernel in (("command_h100x2.json", one_h100["median_iteration_s"],
                                        one_h100["kernel_s"] / one_h100["n_iter"]),
                                       ("command_h200x2.json", one_h200["iteration_s"], one_h200["kernel_s"])):
        r = _load(name)["problems"]["p4zarr"]
        shape = Shape(r["n"], r["d"], r["k"], "fp32")
        it = iteration(shape, 2, shape.flop / one_kernel, v["multi_rank"], one_iter - one_kernel,
                       allreduce_seconds(shape.partial_bytes, 2, v["nccl_nvlink"]))
        pts.append(Point(f"{name.split('_')[1].split('.')[0]} command P4 (Zarr) 2 GPU",
                         f"{name}: problems.p4zarr.median_iteration_s", r["median_iteration_s"], it.seconds))
    # Issue 34's reported points (4 H100s; kernels from multigpu_h100x4.json).
    h4 = _load("multigpu_h100x4.json")["results"]

    def row(problem, gpus, prec="fp32", coll="nccl"):
        return next(r for r in h4 if r["problem"] == problem and r["gpus"] == gpus and r["precision"] == prec
                    and r["collective"] in (coll, "single"))

    for problem in ("P4",):
        one = row(problem, 1)
        shape = Shape(one["n"], one["d"], one["k"])
        it = iteration(shape, 4, shape.flop / one["kernel_s"], v["multi_rank"], one["iteration_s"] - one["kernel_s"],
                       allreduce_seconds(shape.partial_bytes, 4, v["nccl_sockets"]))
        pts.append(Point(f"h100x4 {problem} 4 GPU NCCL sockets (speed-up)", f"{ISSUE}: sockets_p4_speedup_4gpu",
                         REPORTED["sockets_p4_speedup_4gpu"], one["iteration_s"] / it.seconds))
    one = row("P3", 1)
    p3 = Shape(one["n"], one["d"], one["k"])
    for key, link in (("hosts2_p3_nccl_sockets_iteration_s", v["nccl_sockets"]),
                      ("hosts2_p3_dask_comms_iteration_s", v["dask_comms"])):
        it = iteration(p3, 4, p3.flop / one["kernel_s"], v["multi_rank"], one["iteration_s"] - one["kernel_s"],
                       allreduce_seconds(p3.partial_bytes, 4, link))
        calibrates = "dask" in key
        pts.append(Point(f"P3 2 hosts x 2 GPU ({key.split('_')[2]} {key.split('_')[3]})", f"{ISSUE}: {key}",
                         REPORTED[key], it.seconds, checked=not calibrates,
                         why="calibrates a rate" if calibrates else ""))
    big = Shape(2e7, 768, 40000, "tf32")
    for kernels, name in (("kernel_P4_tf32", "today's tf32 kernels"), (None, "the tf32 kernels of multigpu_h100x4")):
        rate = v[kernels] if kernels else p4.flop / row("P4", 1, "tf32")["kernel_s"]
        it = iteration(big, 4, rate, v["multi_rank"], v["update_P4"],
                       allreduce_seconds(big.partial_bytes, 4, v["nccl_nvlink"]))
        pts.append(Point(f"2e7x768 K=40000 4 GPU iteration, {name}", f"{ISSUE}: fit_2e7x768_k40000_iteration_s",
                         REPORTED["fit_2e7x768_k40000_iteration_s"], it.seconds, checked=False,
                         why="the run's kernel version is not recorded: the two kernel rates bracket it"))
    # The reported fit predates the file's newest inits: its oldest calibrates it.
    inits = [r for r in h4 if r["problem"] == "P4" and r.get("init_s")]
    seed, step, _ = init_calibration("multigpu_h100x4.json", inits, min(inits, key=lambda r: r["date"])["commit"])
    init = init_seconds(big, 4, p4.flop / step, v["multi_rank"], seed, Shape(4e6, 480, 40000))
    pts.append(Point("2e7x768 K=40000 4 GPU init", f"{ISSUE}: fit_2e7x768_k40000_init_s",
                     REPORTED["fit_2e7x768_k40000_init_s"], init, kind="init"))
    pts += scale_points(v)
    return pts


def scale_points(v: dict) -> list[Point]:
    """The scale benchmark's whole commands (``scale_*.json``), as :func:`predict` models a fit:
    the kernel benchmark's rates at the nearest shape (H100s), the host tier fed by pinned
    copies."""
    pts = []
    for path in sorted(RESULTS.glob("scale_*.json")):
        where = path.stem.split("_")[1]
        for case, r in _load(path.name)["cases"].items():
            if r.get("rc") != 0:
                continue
            shape = Shape(r["n"], r["d"], r["k"], r["precision"])
            kernel = v[f"kernel_{nearest_problem(shape)}_{shape.precision}"]
            feed = v["h2d_pinned"] if r["tier"] == "host" else None
            it = iteration(shape, r["gpus"], kernel, v["multi_rank"],
                           v["update_P4"] * shape.k * shape.d / (40000 * 480),
                           allreduce_seconds(shape.partial_bytes, r["gpus"], v["nccl_nvlink"]), feed_bps=feed)
            init = init_seconds(shape, r["gpus"], v[f"kernel_{nearest_problem(shape)}_tf32"], v["multi_rank"],
                                v["seed_P4"], Shape(4e6, 480, 40000), feed_bps=feed)
            h100 = where.startswith("h100")
            other = "" if h100 else "an H200 run: the model's kernel rates are H100s'"
            key = f"{path.name}: cases.{case}"
            pts.append(Point(f"{where} scale {case} ({r['tier']} tier) iteration", f"{key}.median_iteration_s",
                             r["median_iteration_s"], it.seconds, checked=h100, why=other))
            pts.append(Point(f"{where} scale {case} ({r['tier']} tier) init", f"{key}.init_s", r["init_s"], init,
                             kind="init", checked=False, why=other or "the init's sampling (d2 to the host, a "
                             "draw per row, every round) has no term in the model: it bounds this init"))
    return pts


# ---------------------------------------------------------------- predictions


@dataclass
class Prediction:
    name: str
    nodes: int
    gpus: int
    tier: str
    iteration: Iteration
    init: float
    place: float
    iterations: int

    @property
    def total(self) -> float:
        return self.place + self.init + self.iterations * self.iteration.seconds

    @property
    def bound(self) -> str:
        parts = {"init": self.init, "read/place": self.place, self.iteration.bound: self.iterations
                 * self.iteration.seconds}
        return max(parts, key=parts.get)


# What a node is assumed to hold (the 8-GPU machines lent here: 8 x 80 GB H100, 560 GiB host).
GPUS_PER_NODE = 8
GPU_BYTES = 80e9 * 0.8  # the device tier's budget: what the working set leaves of each GPU
HOST_BYTES = 560 * 2**30 * 0.5  # the host tier's budget: half the host (plan.py's rule)


def predict(shape: Shape, nodes: int, rates: dict[str, Rate] | None = None, iterations: int = 20,
            inter_node: str = "nccl_sockets") -> Prediction:
    """A fit of ``shape`` on ``nodes`` nodes of 8 H100s: the tier the data fits (device, then
    host, then storage), the kernels at the measured shape nearest to ``shape``, NCCL over NVLink
    within a node and over ``inter_node`` between nodes."""
    rates = rates if rates is not None else load_rates()
    v = {k: r.value for k, r in rates.items()}
    gpus = nodes * GPUS_PER_NODE
    per_gpu = shape.data_bytes / gpus
    if per_gpu <= GPU_BYTES:
        tier, feed = "device", None
    elif per_gpu * GPUS_PER_NODE <= HOST_BYTES:
        tier, feed = "host", v["h2d_pinned"]
    else:
        tier, feed = "storage", v["store_read"]
    kernel = v[f"kernel_{nearest_problem(shape)}_{shape.precision}"]
    kernel_tf32 = v[f"kernel_{nearest_problem(shape)}_tf32"]
    coll = hierarchical_allreduce_seconds(shape.partial_bytes, GPUS_PER_NODE, nodes, v["nccl_nvlink"], v[inter_node])
    it = iteration(shape, gpus, kernel, v["multi_rank"], v["update_P4"] * shape.k * shape.d / (40000 * 480), coll,
                   feed_bps=feed)
    init = init_seconds(shape, gpus, kernel_tf32, v["multi_rank"], v["seed_P4"], Shape(4e6, 480, 40000),
                        feed_bps=feed)
    place = per_gpu / v["store_read"]  # every rank reads its rows from the store once
    return Prediction(f"{shape.n:.0e}x{shape.d} K={shape.k}", nodes, gpus, tier, it, init, place, iterations)


def nearest_problem(shape: Shape) -> str:
    """The kernel benchmark's problem nearest to ``shape`` in (log2 K, log2 D)."""
    rows = _load("gpu_kernels_h100.json")["results"]
    best = min(rows, key=lambda r: math.hypot(math.log2(r["k"] / shape.k), math.log2(r["d"] / shape.d)))
    return best["problem"]


# ---------------------------------------------------------------- the report


def report() -> str:
    rates = load_rates()
    lines = ["rates:"]
    for k, r in rates.items():
        lines.append(f"  {k:22s} {r.value:12.4g} {r.unit:14s} {r.source}")
    lines.append("\nmodel vs measured:")
    lines.append(f"  {'point':58s} {'measured':>10s} {'model':>10s} {'ratio':>6s}")
    for p in measured_points(rates):
        note = "" if p.checked else f"  (not checked: {p.why})"
        lines.append(f"  {p.name:58s} {p.measured:10.4g} {p.model:10.4g} {p.ratio:6.3f}{note}")
    lines.append("\npredicted (20 iterations; NCCL over the measured sockets between nodes):")
    lines.append(f"  {'fit':22s} {'nodes':>5s} {'GPUs':>4s} {'tier':>8s} {'kernel':>8s} {'feed':>8s} {'coll':>8s} "
                 f"{'iter':>8s} {'init':>9s} {'place':>8s} {'total':>9s}  bound")
    for k in (40000, 2**20):
        for nodes in (1, 4, 16):
            p = predict(Shape(1e9, 768, k), nodes, rates)
            it = p.iteration
            lines.append(f"  {p.name:22s} {p.nodes:5d} {p.gpus:4d} {p.tier:>8s} {it.kernel:8.3g} {it.feed:8.3g} "
                         f"{it.collective:8.3g} {it.seconds:8.3g} {p.init:9.4g} {p.place:8.3g} {p.total:9.4g}  "
                         f"{p.bound}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
