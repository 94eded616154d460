"""benchmarks/cost_model.py: its formulas on hand-computed cases, its rates traced to the
committed results, and its predictions of every measured point within the error
docs/scaling.md states (the doc shows the model's own report)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cm(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks import cost_model

    return cost_model


def test_allreduce_moves_two_times_p_minus_one_over_p_of_the_buffer(cm):
    # 8 MB over 4 ranks at 1 GB/s: each rank sends 3/4 of it twice, 12 MB: 12 ms.
    assert cm.allreduce_seconds(8e6, 4, 1e9) == pytest.approx(0.012)
    assert cm.allreduce_seconds(8e6, 1, 1e9) == 0.0
    # 2 nodes of 4: 12 ms within each node, then 2 MB (a quarter per rank) between the nodes
    # at 0.5 GB/s: 2 x 1/2 x 2 MB / 0.5 GB/s = 4 ms.
    assert cm.hierarchical_allreduce_seconds(8e6, 4, 2, 1e9, 0.5e9) == pytest.approx(0.016)


def test_an_iteration_is_the_slower_of_kernels_and_feed_plus_collective_and_update(cm):
    s = cm.Shape(1000, 10, 5)
    assert s.flop == 2 * 1000 * 10 * 5 and s.partial_bytes == 8 * 5 * 12 and s.data_bytes == 40_000
    # 1e5 flop on 2 GPUs at 1e4 flop/s: 5 s, plus 1 s for several ranks; feed 2e4 B at 1e4 B/s: 2 s.
    it = cm.iteration(s, 2, 1e4, 1.0, 0.5, collective_s=0.25, feed_bps=1e4)
    assert (it.kernel, it.feed, it.seconds, it.bound) == (6.0, 2.0, 6.75, "kernels")
    it = cm.iteration(s, 2, 1e4, 1.0, 0.5, collective_s=0.25, feed_bps=1e3)
    assert (it.feed, it.seconds, it.bound) == (20.0, 20.75, "storage")
    assert cm.iteration(s, 1, 1e4, 1.0, 0.0).kernel == 10.0  # one rank: no multi-rank cost


def test_the_init_recluster_grows_as_k_squared_d(cm):
    ref = cm.Shape(100, 8, 10)
    s = cm.Shape(100, 16, 20)
    # passes: 2.5 x 2*100*16*20 / 1 GPU / 64000 flop/s = 2.5 s; seed: 1 s x 2^2 x 2 = 8 s.
    assert cm.init_seconds(s, 1, 64_000, 0.0, 1.0, ref) == pytest.approx(10.5)


def test_every_rate_names_the_committed_file_and_key_it_came_from(cm):
    rates = cm.load_rates()
    for name, rate in rates.items():
        assert rate.value > 0 and math.isfinite(rate.value), name
        if not rate.source.startswith(cm.ISSUE):
            file = rate.source.split(":")[0]
            assert (cm.RESULTS / file).is_file(), rate.source
    # One traced by hand: the store's read rate is the tiers file's figure.
    t = json.loads((cm.RESULTS / "tiers_h200.json").read_text())["throughput"]
    assert rates["store_read"].value == t["store_read_GBps"] * 1e9


def test_every_multi_gpu_row_of_the_committed_results_is_a_point(cm):
    points = cm.measured_points()
    sources = {p.source for p in points}
    for name in cm._MULTIGPU:
        for r in json.loads((cm.RESULTS / name).read_text())["results"]:
            if r["gpus"] == 1 and r.get("chunking", "default") == "default":
                continue  # each configuration's 1-GPU run calibrates its kernels
            config = f"{r['problem']},{r['precision']},{r['gpus']} GPU,{r['collective']},{r.get('chunking')}"
            key = f"{name}: results[{config}]"
            assert key + ".iteration_s" in sources, key


def test_the_model_predicts_every_checked_point_within_the_stated_error(cm):
    points = cm.measured_points()
    checked = [p for p in points if p.checked]
    assert len(checked) >= 30
    for p in points:
        assert p.checked or p.why, p.name  # every point left out says why
    bad = [(p.name, round(p.ratio, 3)) for p in checked if abs(p.ratio - 1) > cm.STATED_ERROR[p.kind]]
    assert not bad, bad


def test_the_scaling_doc_shows_the_models_report_and_its_stated_error(cm):
    doc = (ROOT / "docs" / "scaling.md").read_text()
    assert cm.report() in doc
    assert f"within {cm.STATED_ERROR['iteration']:.0%}" in doc and f"within {cm.STATED_ERROR['init']:.0%}" in doc


def test_predictions_name_their_tier_and_bound(cm):
    rates = cm.load_rates()
    small = cm.predict(cm.Shape(1e9, 768, 40000), 16, rates)
    assert small.tier == "device" and small.gpus == 128  # 24 GB of rows per GPU
    assert cm.predict(cm.Shape(1e9, 768, 40000), 1, rates).iteration.bound == "storage"
    assert cm.predict(cm.Shape(1e9, 768, 2**20), 16, rates).bound == "init"
