"""What a memory tier is: the questions the engine asks of the tier a fit's rows live in.

A tier decides what a worker keeps of its rows between passes over them (the backend's arrays,
host memory, or nothing: read again from the source), how a shard yields its blocks in a pass,
and what it needs of the workers' budgets. The engine asks these questions of the tier object
(:class:`Tier`) and never compares a tier's name; the names are the user's values (``tier=``,
``--tier``), turned into objects by the registry (:mod:`daskmeans.engine.tiers`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:  # pragma: no cover
    import dask.array as da

    from ..placement import Shard


@dataclass(frozen=True)
class Need:
    """The figures the plan weighs a tier on, per worker (bytes).

    Attributes
    ----------
    share : int
        The largest share of the data one worker holds.
    working : int
        What the loop needs besides the data (``engine.plan.working_parts``).
    gpu : bool
        Whether the kernels run on a GPU (the backend is not on the host).
    host_budget : int
        The smallest host memory budget of the workers.
    device_budget : int or None
        The smallest device memory budget of the GPU workers; None without a GPU.
    """

    share: int
    working: int
    gpu: bool
    host_budget: int
    device_budget: int | None


class Tier:
    """A memory tier: where a worker keeps its rows during a fit.

    A subclass sets :attr:`name` (the user's value) and :attr:`help` (the ``--help`` text, the
    same as ``options.TIERS[name]``) and answers the methods below; the result of a fit is
    bitwise the same in every tier (the same chunks meet the same kernels in the same order).

    Attributes
    ----------
    name : str
        The value of ``tier=`` / ``--tier`` that chooses it.
    help : str
        What it means, for the help.
    yields_resident : bool
        Whether the blocks :meth:`stream` yields are the shard's resident blocks themselves
        (each stays valid after the next is asked for, so a caller may keep it without a copy),
        rather than staging buffers or blocks read for the pass.
    """

    name: str = ""
    help: str = ""
    yields_resident: bool = False

    def resident_backend(self, backend: str) -> str | None:
        """The backend whose arrays hold a shard's rows between passes, for a fit on
        ``backend`` ("numpy", "cupy"): the fit's own backend (its device memory), "numpy"
        (host memory), or None where nothing is kept (the rows are read again each pass)."""
        raise NotImplementedError

    @property
    def resident(self) -> bool:
        """Whether a shard keeps its rows between passes (not re-read from the source)."""
        return self.resident_backend("numpy") is not None

    def hold(self, be: Any, block: Any) -> Any:
        """The copy of ``block`` (shape (n_i, d), as placed: an array of
        :meth:`resident_backend`'s kind) a shard keeps, made on its worker; ``be`` is the fit's
        backend module. Called only where :attr:`resident`."""
        raise NotImplementedError

    def readers(self, X: "da.Array", ids: list[int]) -> list | None:
        """What a shard of a tier that keeps no rows reads them from each pass: one reader per
        chunk ``ids`` of ``X`` (dask array (n, d)); None for a resident tier."""
        return None

    def stream(self, shard: "Shard") -> Iterator[Any]:
        """The shard's blocks of one pass, in its chunk order, as the fit's backend's arrays
        (shape (n_i, d)); a block read again is checked against its pin
        (``Shard.check_pin``)."""
        raise NotImplementedError

    def take(self, shard: "Shard", picks: dict, host: bool = True) -> dict:
        """Rows of chosen chunks, without a pass over the others: ``picks`` maps a chunk's
        index in the shard (``j``, not its global id) to local row indices (int64 array
        ``(m_j,)``, repeats allowed); the result maps each ``j`` to an array ``(m_j, d)`` of
        those rows in the shard's dtype: a host NumPy array, or with ``host`` False, where a
        resident tier holds its blocks (a device tier's on its device: rows that go on to a
        distance pass there need not cross to the host and back). A resident tier indexes its
        blocks where they live (the host tier's pinned host memory: nothing is copied to a
        device); the caller has pinned them (``Shard.pin_resident``). A tier that keeps no
        rows reads only the chosen chunks (the storage tier's own method, host arrays); this
        default for such a tier streams a whole pass and keeps the chosen rows."""
        from ...backends import get_backend

        if not self.resident:
            be = shard.be
            return {j: be.to_numpy(block[be.xp.asarray(picks[j])])
                    for j, block in enumerate(self.stream(shard)) if j in picks}
        held = get_backend(self.resident_backend(shard.backend))  # the backend of the blocks as held
        keep = (lambda a: a) if not host else held.to_numpy
        return {j: keep(shard.blocks[j][held.xp.asarray(rows)]) for j, rows in picks.items()}

    def unusable(self, gpu: bool) -> str | None:
        """Why this tier cannot be asked for on these workers (``gpu``: the kernels run on a
        GPU), as the one-line refusal; None where it can."""
        return None

    def refusal(self, need: Need) -> str | None:
        """Why the data does not fit this tier's budget (one line, with the figures and what
        would change them); None where it fits."""
        raise NotImplementedError

    def kept_bytes(self, share: int) -> int:
        """Bytes of a worker's memory a placement of ``share`` bytes of data per worker keeps
        between fits (what the cache of kept placements makes room for)."""
        return int(share) if self.resident else 0

    def __repr__(self) -> str:
        return f"<tier {self.name}>"
