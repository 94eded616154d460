"""All-gathers of small host records through the loop's sum collective.

The collectives registered in :mod:`.collective` add int64 buffers; an all-gather is a sum in
which each rank fills its own slot with the float64 bits of its records and leaves the other
slots zero, so every rank receives every rank's records, bit for bit. The re-seeding of an
iteration (:mod:`.reseed`) gathers this way the rows it chooses from: the farthest rows of each
rank (empty clusters) and each rank's member of smallest key of a cluster (size balancing).

Every function here is a collective call: each rank calls it, in the same order, with records
of the same shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def all_gather(mine: np.ndarray, comm: Any, be: Any) -> np.ndarray:
    """Every rank's float64 rows as one array, by rank.

    A row whose first value is -1 stands for none (the callers' values there are >= 0).

    Parameters
    ----------
    mine : float64 ndarray, shape (m, width)
        This rank's rows.
    comm : Collective
        The loop's collective (``rank``, ``size``, ``allreduce``).
    be : module
        The backend (the collective adds the backend's arrays).

    Returns
    -------
    float64 ndarray, shape (ranks, m, width)
    """
    slots = np.zeros((comm.size,) + mine.shape)
    slots[comm.rank] = mine
    total = be.to_numpy(comm.allreduce(be.asarray(slots.reshape(-1).view(np.int64)))).view(np.float64)
    return total.reshape(slots.shape)


def gather_far(cands: list, n_far: int, d: int, comm: Any, be: Any) -> list:
    """Every rank's far rows merged: the ``n_far`` farthest of all.

    Parameters
    ----------
    cands : list of ``(d2, row, label, x, w)``
        This rank's at most ``n_far`` far rows (:func:`.reseed.far_points`): squared distance
        to their centroid, global row, label, values ``(d,)`` and weight.
    n_far : int
    d : int
        Features.
    comm : Collective
    be : module

    Returns
    -------
    list of ``(d2, row, label, x, w)``
        Farthest first; ties: the lower global row first (the same on every rank, whatever the
        chunking).
    """
    mine = np.zeros((n_far, d + 4))
    mine[:, 0] = -1.0  # no candidate (real distances are >= 0)
    for i, (d2, row, lab, x, w) in enumerate(cands):
        mine[i, :4] = (d2, row, lab, w)
        mine[i, 4:] = x
    rows = [r for r in all_gather(mine, comm, be).reshape(-1, d + 4) if r[0] >= 0]
    merged = [(float(r[0]), int(r[1]), int(r[2]), r[4:], float(r[3])) for r in rows]
    merged.sort(key=lambda t: (-t[0], t[1]))
    return merged[:n_far]


def gather_members(mine: dict, over: np.ndarray, d: int, comm: Any, be: Any) -> list:
    """Every rank's members (:func:`.reseed.members`) merged: per cluster of ``over``, the row
    of the smallest key (then the lower global row) on any rank.

    Parameters
    ----------
    mine : dict
        ``{cluster: (key, row, x, w)}``: this rank's member of each cluster it holds rows of.
    over : int ndarray, shape (m,)
        The clusters, each with rows on some rank.
    d : int
    comm : Collective
    be : module

    Returns
    -------
    list of ``(x, w)``
        One per cluster of ``over``, in its order: the row's values ``(d,)`` float64 and weight.
    """
    slots = np.zeros((len(over), d + 3))
    slots[:, 0] = -1.0  # no row of that cluster here
    for i, c in enumerate(over.tolist()):
        if c in mine:
            key, row, x, w = mine[c]
            slots[i, :3] = (key, row, w)
            slots[i, 3:] = x
    total = all_gather(slots, comm, be)
    out = []
    for i in range(len(over)):
        rows = [r for r in total[:, i] if r[0] >= 0]
        r = min(rows, key=lambda r: (r[0], r[1]))  # every cluster of ``over`` has rows somewhere
        out.append((r[3:], float(r[2])))
    return out
