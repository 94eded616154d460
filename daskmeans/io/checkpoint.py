"""Checkpoints: a fit's restart point, written atomically and verified before it is resumed.

A checkpoint is a Zarr group (``centroids``, ``prev`` arrays; JSON attributes) like a model.
What it resumes must be what it was written for, so reading one checks, before any work:

- its own integrity: a SHA-256 over its attributes and the arrays' bytes (``checksum``, the
  same as a model's: :func:`daskmeans.io.model_store.checksum`), so a damaged or hand-edited
  checkpoint is refused rather than resumed;
- its consistency: the iteration count, a history of one well-formed entry per iteration
  (:func:`daskmeans.io.model_store.history_problem`, as a model's), finite centroids of the
  fingerprint's shape;
- against the fit (:func:`check_fingerprint`): the parameters, the data's shape and dtype,
  and a content digest of the data (:mod:`daskmeans.numerics.digest`), which a change of
  values that keeps the shape cannot pass.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..errors import DataError
from ..params import fingerprint_values
from .model_store import checksum, history_problem, jsonable, open_group, write_signed
from .paths import FORMATS, atomic_dir

CHECKPOINT_FORMAT = FORMATS["checkpoint"]
# 2: the checksum and the data's content digest (a version-1 checkpoint has neither).
CHECKPOINT_VERSION = 2


def write_checkpoint(path: str, iteration: int, centroids: np.ndarray, prev: np.ndarray | None,
                     history: list, fingerprint: dict) -> None:
    """Write a fit's restart point atomically.

    Parameters
    ----------
    path : str
    iteration : int
        Completed iterations (>= 1).
    centroids : ndarray (K, D) float64
        Centroids after ``iteration`` iterations.
    prev : ndarray (K, D) float64 or None
        Centroids one iteration before (they restore the labels that count reassigned rows).
    history : list of dict
        Statistics of iterations 1..iteration.
    fingerprint : dict
        What the checkpoint is valid for (:func:`check_fingerprint`).
    """
    arrays = {"centroids": np.asarray(centroids, np.float64)}
    if prev is not None:
        arrays["prev"] = np.asarray(prev, np.float64)
    attrs = jsonable({
        "format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_VERSION, "iteration": int(iteration),
        "history": history, "fingerprint": fingerprint,
    })
    with atomic_dir(path, kind="checkpoint") as tmp:
        write_signed(tmp, arrays, attrs)


def read_checkpoint(path: str) -> dict:
    """``{"iteration", "centroids", "prev", "history", "fingerprint"}`` of a checkpoint,
    verified (checksum, consistency); a DataError that says what is wrong otherwise."""
    g, attrs = open_group(path, CHECKPOINT_FORMAT, "checkpoint", f"no checkpoint at {path}: run without --resume to start one")
    bad = f"checkpoint {path} is damaged"
    version = attrs.get("format_version")
    if version != CHECKPOINT_VERSION:
        raise DataError(f"checkpoint {path} has format_version={version!r}, this daskmeans resumes only "
                        f"{CHECKPOINT_VERSION}: remove it or fit without resume")
    try:
        arrays = {name: np.asarray(g[name][...]) for name in ("centroids", "prev") if name in g}
    except Exception as e:
        raise DataError(f"{bad}: its arrays cannot be read ({e})") from None
    if "centroids" not in arrays:
        raise DataError(f"{bad}: it has no centroids array")
    if attrs.get("checksum") != checksum(dict(attrs), arrays):
        raise DataError(f"{bad}: its checksum does not match its contents (changed after it was written); "
                        "remove it or fit without resume")
    out = {"iteration": attrs.get("iteration"), "centroids": arrays["centroids"], "prev": arrays.get("prev"),
           "history": attrs.get("history"), "fingerprint": attrs.get("fingerprint")}
    problem = _inconsistency(out)
    if problem:
        raise DataError(f"{bad}: {problem}")
    out["history"] = list(out["history"])
    out["fingerprint"] = dict(out["fingerprint"])
    return out


def _inconsistency(ck: dict) -> str | None:
    """What makes a checkpoint's contents contradict themselves, or None."""
    it, fp, hist = ck["iteration"], ck["fingerprint"], ck["history"]
    if not isinstance(fp, dict):
        return "its fingerprint is not a record"
    if not isinstance(it, int) or isinstance(it, bool) or it < 1:
        return f"iteration={it!r} should be an integer >= 1"
    shape = (fp.get("n_clusters"), fp.get("n_features"))
    for name in ("centroids", "prev"):
        a = ck[name]
        if a is None:
            continue
        if a.shape != shape:
            return f"{name} have shape {a.shape}, should be (n_clusters, n_features) = {shape}"
        if a.dtype != np.float64 or not np.isfinite(a).all():
            return f"{name} should be finite float64 values"
    if ck["prev"] is None:
        return "the centroids of the iteration before (prev) are missing"
    return history_problem(hist, it)


def fingerprint(params: Any, *, n_samples: int, n_features: int, dtype: Any, weighted: bool, moments: dict) -> dict:
    """What a checkpoint of a fit is valid for (all exact, whatever the cluster).

    Parameters
    ----------
    params : KMeansParams
        The fit's algorithm: the fields its record marks ``fingerprint``
        (:func:`daskmeans.params.fingerprint_values`), so a parameter that changes the result
        is named in one place.
    n_samples, n_features : int
        The rows the fit trains on and their width.
    dtype : numpy dtype
    weighted : bool
        Whether the rows carry weights.
    moments : dict
        The moments pass's ``max_abs`` (D,) and content ``digest`` of the data.

    Returns
    -------
    dict
        JSON values, compared key by key by :func:`check_fingerprint`.
    """
    return {
        "n_samples": int(n_samples), "n_features": int(n_features), "dtype": str(np.dtype(dtype)),
        "weighted": bool(weighted), **fingerprint_values(params),
        "max_abs": [float(v) for v in moments["max_abs"]], "digest": moments["digest"],
    }


def check_fingerprint(path: Any, saved: dict, now: dict, iteration: int, max_iter: int) -> None:
    """Refuse a checkpoint written for other data or parameters, naming what differs, and
    one that is already past ``max_iter``."""
    saved, now = jsonable(saved), jsonable(now)
    diff = [k for k in sorted(set(saved) | set(now)) if saved.get(k) != now.get(k)]
    if diff:
        what = "; ".join(dict.fromkeys(
            f"{k}: checkpoint {saved.get(k)!r}, now {now.get(k)!r}" if k not in ("max_abs", "digest")
            else "the data's values differ" for k in diff
        ))
        raise DataError(f"checkpoint {os.fspath(path)} is for another fit ({what}): remove it or fit without resume")
    if iteration > max_iter:
        raise DataError(f"checkpoint {os.fspath(path)} is at iteration {iteration}, past max_iter={max_iter}: "
                        "raise --max-iter or fit without resume")
