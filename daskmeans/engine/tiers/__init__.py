"""The memory tiers' registry: one module per tier, one entry each in :data:`REGISTRY`.

A tier is an object (:class:`~daskmeans.engine.tiers.base.Tier`) that answers what the engine
asks of where a worker keeps its rows: what a shard holds resident (the backend's arrays,
host memory, or nothing: read again from the source), how a shard streams its blocks in a
pass, whether the data fits its budget in the plan, what a kept placement holds of a worker's
memory. No module outside this package compares a tier's name.

The user's values stay names (``tier="host"``, ``--tier host``): :func:`lookup` turns one
into its object (``"auto"``, the plan's choice: :func:`choose`). ``options.TIERS``, the names
and help the command's ``--help`` reads without loading NumPy or Dask, holds the same names and
help texts (``tests/unit/test_extension_points.py`` checks both agree); :func:`register` and
:func:`unregister` keep the two in step for a tier added at run time.
"""

from __future__ import annotations

from ...errors import DaskmeansError
from ...options import TIERS
from . import device, host, storage
from .base import Need, Tier

__all__ = ["AUTO", "REGISTRY", "Need", "Tier", "choose", "get", "lookup", "register", "unregister"]

# The plan's "auto" tries the tiers in this order and takes the first that fits.
REGISTRY: dict[str, Tier] = {t.name: t for t in (device.TIER, host.TIER, storage.TIER)}

# The value that asks the plan to choose (options.TIERS' first key): not a tier.
AUTO = "auto"


def get(tier: "str | Tier") -> Tier:
    """The tier object of ``tier`` (a registered name, or a tier object, returned as is)."""
    if isinstance(tier, Tier):
        return tier
    try:
        return REGISTRY[tier]
    except (KeyError, TypeError):
        raise DaskmeansError(f"tier={tier!r} should be one of {', '.join(map(repr, (AUTO, *REGISTRY)))}") from None


def lookup(requested: str) -> Tier | None:
    """The tier asked for: its object, or None for :data:`AUTO` (the plan chooses); a name
    not registered is a :class:`DaskmeansError` listing the choices."""
    return None if requested == AUTO else get(requested)


def choose(requested: str, need: Need) -> Tier:
    """The tier of a fit: the one ``requested`` where the data fits it, else its refusal as a
    :class:`DaskmeansError`; for :data:`AUTO` the first tier of :data:`REGISTRY` that fits."""
    asked = lookup(requested)
    if asked is not None:
        why = asked.refusal(need)
        if why is not None:
            raise DaskmeansError(why)
        return asked
    refusals = []
    for tier in REGISTRY.values():
        why = tier.refusal(need)
        if why is None:
            return tier
        refusals.append(why)
    raise DaskmeansError("no memory tier holds the data: " + "; ".join(refusals))


def register(tier: Tier) -> None:
    """Add ``tier`` (an instance of a :class:`Tier` subclass with its ``name`` and ``help``)
    to the registry and to ``options.TIERS``, so that ``tier=`` and ``--tier`` accept its
    name; tried last by :data:`AUTO`."""
    if not isinstance(tier, Tier):
        raise TypeError(f"tier={tier!r} should be an instance of a daskmeans.engine.tiers.Tier subclass")
    if not tier.name or tier.name == AUTO or tier.name in REGISTRY:
        raise ValueError(f"tier name {tier.name!r} should be new and not {AUTO!r}; registered: {', '.join(REGISTRY)}")
    REGISTRY[tier.name] = tier
    TIERS[tier.name] = tier.help


def unregister(name: str) -> None:
    """Remove the tier ``name`` that :func:`register` added (the built-in tiers stay)."""
    if name in (device.TIER.name, host.TIER.name, storage.TIER.name):
        raise ValueError(f"tier {name!r} is built in and cannot be unregistered")
    if name not in REGISTRY:
        raise ValueError(f"tier {name!r} is not registered; registered: {', '.join(REGISTRY)}")
    del REGISTRY[name]
    TIERS.pop(name, None)
