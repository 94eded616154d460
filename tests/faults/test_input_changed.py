"""An input changed while a fit reads it: each row chunk is pinned when first read (a hash of
its values, the backend's ``pin``) and checked whenever it is read again:
every pass of the storage tier, and a resident tier's chunks made again from the source by
Dask's lineage after a worker is lost. A mismatch ends the fit in one line naming the file and
the rows; no model is written and the last checkpoint is kept.

The chunk is replaced by another valid chunk of the same shape and codec (a rename, as a
writer updating the store would), from a worker plugin at a chosen task start (the command,
real ``dask scheduler`` / ``dask worker`` processes) or from the fit's callback (the API)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import dask
import numpy as np
import pytest
import zarr
from distributed import Client, LocalCluster

import daskmeans
from daskmeans.errors import InputChanged
from daskmeans.io.checkpoint import read_checkpoint
from faultkit import DaskProcesses, ReplaceOnTask, daskmeans_cli, kill_on, kills, leftovers, one_error_line

ROWS, D, CHUNK, K = 8000, 3, 1000, 10


@pytest.fixture
def stores(tmp_path) -> tuple[Path, Path, Path]:
    """``x.zarr`` (8 chunks of 1000 rows, uniform: dozens of iterations before the labels
    settle), ``y.zarr`` (the same rows reversed: every chunk a valid chunk of another
    content) and the file of x's chunk 5 (rows 5000-5999)."""
    x = np.random.default_rng(5).random((ROWS, D)).astype(np.float32)
    zarr.create_array(str(tmp_path / "x.zarr"), data=x, chunks=(CHUNK, D))
    zarr.create_array(str(tmp_path / "y.zarr"), data=x[::-1].copy(), chunks=(CHUNK, D))
    chunk = tmp_path / "x.zarr" / "c" / "5" / "0"
    assert chunk.is_file()
    return tmp_path / "x.zarr", tmp_path / "y.zarr" / "c" / "5" / "0", chunk


def test_a_chunk_replaced_mid_fit_in_the_storage_tier_is_an_error(stores, tmp_path):
    """The API: the callback replaces chunk 5 after iteration 3; the next pass's read of it
    raises, naming the file and the rows, and the fit leaves the estimator unfitted with its
    last checkpoint, which the unchanged data resumes to the undisturbed model."""
    x, src, dst = stores
    ckpt = tmp_path / "ckpt.zarr"
    params = dict(n_clusters=K, random_state=0, tol=0, max_iter=8, tier="storage")
    with dask.config.set({"daskmeans.segment-seconds": 0}), \
            LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as lc, \
            Client(lc, set_as_default=False) as c:
        ref = daskmeans.KMeans(client=c, **params).fit(str(x))
        assert ref.tier_ == "storage" and ref.n_iter_ == 8
        saved = x.parent / "x-saved"
        shutil.copy(dst, saved)

        def replace(stats: dict) -> None:
            if stats["iteration"] == 3:  # between segments (of one iteration each)
                os.replace(src, dst)

        km = daskmeans.KMeans(client=c, checkpoint=str(ckpt), checkpoint_every=1, **params)
        with pytest.raises(InputChanged, match=rf"^{x}: the data changed during the fit: row chunk \d+ \(rows "
                                               r"\d+ to \d+\) read again differs from its first read"):
            km.fit(str(x), callback=replace)
        assert not hasattr(km, "cluster_centers_")
        kept = read_checkpoint(str(ckpt))
        assert kept["iteration"] == 3
        # The data restored: the checkpoint resumes to the undisturbed model, bit for bit.
        os.replace(saved, dst)
        again = daskmeans.KMeans(client=c, checkpoint=str(ckpt), checkpoint_every=1, **params).fit(str(x), resume=True)
    np.testing.assert_array_equal(again.cluster_centers_, ref.cluster_centers_)
    assert again.n_iter_ == ref.n_iter_


def test_unchanged_storage_tier_data_reads_the_same_pins_every_pass(stores):
    """Nothing changed: a storage-tier fit of many passes ends as the resident one does (the
    pins never differ where the bytes do not)."""
    x, _, _ = stores
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as lc, \
            Client(lc, set_as_default=False) as c:
        a = daskmeans.KMeans(K, random_state=1, tol=0, max_iter=6, tier="storage", client=c).fit(str(x))
        b = daskmeans.KMeans(K, random_state=1, tol=0, max_iter=6, client=c).fit(str(x))
    assert a.tier_ == "storage" and b.tier_ != "storage"
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)


def test_the_command_stops_in_one_line_and_writes_no_model(stores, tmp_path):
    """``daskmeans fit --tier storage`` on real workers: chunk 5 is replaced as the second
    segment starts (segments of a few iterations); one error line naming the file and the
    rows, exit status 1, no model, no labels, no temporary left; the checkpoint kept."""
    x, src, dst = stores
    model, labels, ckpt = tmp_path / "model.zarr", tmp_path / "labels.zarr", tmp_path / "ckpt.zarr"
    cluster = DaskProcesses(tmp_path / "cluster", 2, nanny=False).start()
    try:
        plugin = ReplaceOnTask("daskmeans-segment", tmp_path / "flags", src, dst, skip=2)
        with kill_on(cluster.client, tmp_path / "flags", "daskmeans-segment", plugin=plugin):
            rc, _, err = daskmeans_cli(
                cluster, "fit", str(x), "--k", str(K), "--seed", "0", "--tol", "0", "--max-iter", "300",
                "--tier", "storage", "--checkpoint", str(ckpt), "--checkpoint-every", "1", "-o", str(model),
                "--labels", str(labels), "-q", cwd=tmp_path, timeout=120)
    finally:
        cluster.stop()
    assert len(kills(tmp_path / "flags")) == 1  # the replacement happened (the plugin's act)
    one_error_line(rc, err, f"{x}: the data changed during the fit: row chunk", "differs from its first read")
    assert not model.exists() and not labels.exists() and leftovers(tmp_path) == []
    assert read_checkpoint(str(ckpt))["iteration"] >= 1


def test_a_chunk_read_again_by_lineage_after_a_lost_worker_is_checked(stores, tmp_path):
    """The resident tier: as its second segment starts, the worker holding rows 5000-5999
    replaces chunk 5's file and is killed; the chunks it held are read again from the source
    (Dask's lineage) for the new placement on the worker left, and the changed one is an
    error, not a silently mixed model."""
    x, src, dst = stores
    model = tmp_path / "model.zarr"
    cluster = DaskProcesses(tmp_path / "cluster", 2, nanny=False).start()
    try:
        plugin = ReplaceOnTask("daskmeans-segment", tmp_path / "flags", src, dst, skip=1, kill=True, holder_of=5500)
        with kill_on(cluster.client, tmp_path / "flags", "daskmeans-segment", plugin=plugin):
            rc, _, err = daskmeans_cli(
                cluster, "fit", str(x), "--k", str(K), "--seed", "0", "--tol", "0", "--max-iter", "300",
                "-o", str(model), "-q", cwd=tmp_path, timeout=120, guard=False)
    finally:
        cluster.stop()
    assert len(kills(tmp_path / "flags")) == 1
    one_error_line(rc, err, f"{x}: the data changed during the fit: row chunk", "differs from its first read")
    assert not model.exists() and leftovers(tmp_path) == []
