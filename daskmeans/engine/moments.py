"""The moments pass: one pass over the placed data before a fit.

Per feature: mean, variance and largest absolute value (the tolerance and the sums' grid come
from them); the total weight; the first non-finite value or weight; with ``digest``, the data's
content digest (a checkpoint's fingerprint). Per-chunk figures are merged in one place
(:func:`_merge`, Chan et al.'s pairwise update), on the workers and then across them.
"""

from __future__ import annotations

import numpy as np
from distributed import Client

from ..numerics.digest import block_digest, combine
from ..numerics.grid import check_range
from ..errors import DataError
from .placement import Placement, Shard
from .task import submit_per_shard
from .watch import gather


def _chunk(be, xp, off: int, block, w, digest: bool) -> dict:
    """One chunk's figures (the record :func:`_merge` adds)."""
    mean, m2, max_abs, bad_row = be.moments(block)
    rec = {"n": block.shape[0], "mean": be.to_numpy(mean), "m2": be.to_numpy(m2), "max_abs": be.to_numpy(max_abs),
           "bad": None, "n_bad": 0, "bad_w": None, "n_bad_w": 0, "neg_w": False, "wsum": float(block.shape[0]),
           "digest": block_digest(xp, block, off) if digest else 0,
           "wdigest": block_digest(xp, w, off) if digest and w is not None else 0}
    if bad_row is not None:  # rare: count them for the message
        rec["bad"], rec["n_bad"] = off + bad_row, int((~xp.isfinite(block)).sum())
    if w is not None:
        nonfinite = xp.flatnonzero(~xp.isfinite(w))
        if nonfinite.size:
            rec["bad_w"], rec["n_bad_w"] = off + int(nonfinite[0]), int(nonfinite.size)
        rec["neg_w"] = bool((w < 0).any())
        rec["wsum"] = float(w.astype(xp.float64).sum())
    return rec


def _moments(shard: Shard, digest: bool = False) -> dict:
    """Row count, per-feature mean, M2 and largest absolute value (float64), total weight,
    the first non-finite row if any, and whether any weight is negative, over this shard's
    chunks in one pass; with ``digest``, also the content digests of the rows and of the
    weights (:mod:`daskmeans.numerics.digest`)."""
    be = shard.be
    rec = _merge([_chunk(be, be.xp, off, block, w, digest) for _, off, block, w in shard.items()])
    rec["pins"] = {cid: shard.pins[cid] for cid in shard.chunk_ids}  # recorded by this, the first pass
    return rec


def _first(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _merge(items: list) -> dict:
    """Records of disjoint rows merged, in order (Chan et al.'s pairwise update of the mean
    and M2)."""
    acc = None
    for it in items:
        if acc is None:
            acc = dict(it)
            continue
        n, nb = acc["n"], it["n"]
        delta = it["mean"] - acc["mean"]
        tot = n + nb
        acc = {
            "n": tot,
            "mean": acc["mean"] + delta * nb / tot,
            "m2": acc["m2"] + it["m2"] + delta**2 * n * nb / tot,
            "bad": _first(acc["bad"], it["bad"]),
            "n_bad": acc["n_bad"] + it["n_bad"],
            "bad_w": _first(acc["bad_w"], it["bad_w"]),
            "n_bad_w": acc["n_bad_w"] + it["n_bad_w"],
            "neg_w": acc["neg_w"] or it["neg_w"],
            "max_abs": np.maximum(acc["max_abs"], it["max_abs"]),
            "wsum": acc["wsum"] + it["wsum"],
            "digest": combine(acc["digest"], it["digest"]),
            "wdigest": combine(acc["wdigest"], it["wdigest"]),
            "pins": {**acc.get("pins", {}), **it.get("pins", {})},
        }
    return acc


def data_moments(client: Client, placement: Placement, digest: bool = False) -> dict:
    """Mean, variance and largest absolute value per feature (float64) and the total weight,
    in one pass; raises on NaN/inf (in X or the weights) and on negative weights. ``pins``:
    each chunk's pin (:class:`daskmeans.engine.placement.Shard`), also set as ``placement.pins``. With
    ``digest``: also ``digest``, the data's content digest (rows and weights) as 32 hex
    digits, the same for any chunking and placement."""
    futs = submit_per_shard(client, placement, _moments, [digest] * len(placement.shards), name="daskmeans-moments")
    (res,) = gather(client, [client.submit(_merge, futs, pure=False)], placement.workers)
    if res["bad"] is not None:
        raise DataError(
            f"X contains {res['n_bad']} NaN or infinite value(s), the first in row {res['bad']} (rows of data counted "
            f"from 0; in a CSV file with a header that is line {res['bad'] + 2}): clean or drop those rows (in a CSV "
            f"file, an empty or missing field reads as NaN)"
        )
    if res["bad_w"] is not None:
        raise DataError(f"sample_weight contains {res['n_bad_w']} NaN or infinite value(s), the first at row "
                        f"{res['bad_w']} (counted from 0): weights should be finite and >= 0")
    if res["neg_w"]:
        raise DataError("sample_weight has negative values: weights should be >= 0")
    if res["wsum"] <= 0:
        raise DataError("sample_weight sums to zero: at least one weight should be > 0")
    check_range(res["max_abs"], placement.dtype)
    out = {"n": res["n"], "mean": res["mean"], "var": res["m2"] / res["n"], "max_abs": res["max_abs"],
           "weight": res["wsum"], "pins": res["pins"]}
    placement.pins = res["pins"]
    if digest:
        out["digest"] = f"{res['digest']:016x}{res['wdigest']:016x}"
    return out


