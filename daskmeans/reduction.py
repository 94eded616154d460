"""Tree reduction of futures on a distributed cluster (the combine/aggregate of dask's
``reductions.py``, applied to futures so that nothing comes back to the client)."""

from __future__ import annotations

import uuid
from typing import Any, Callable, Sequence

from distributed import Client

from . import config


def tree_reduce(
    client: Client,
    futures: Sequence[Any],
    combine: Callable[[list], Any],
    name: str,
    split_every: int | None = None,
    finalize: Callable[..., Any] | None = None,
    finalize_args: tuple = (),
) -> Any:
    """Combine ``futures`` with ``combine(list)`` in a tree of fan-in ``split_every``.

    Groups are contiguous runs of the input order, so an order-respecting ``combine`` gives
    the same result as a left-to-right fold up to the grouping. ``combine`` is applied at least
    once, so a single input is still turned into a combined value. ``finalize(root,
    *finalize_args)`` runs inside the root task (one scheduling hop fewer than a separate
    task: each hop costs milliseconds). Returns the root future.
    """
    fan_in = int(split_every or config.get("split-every"))
    if fan_in < 2:
        raise ValueError(f"split_every={fan_in} should be >= 2")
    level = list(futures)
    while len(level) > fan_in:
        level = [
            client.submit(combine, level[i : i + fan_in], pure=False, key=f"{name}-{uuid.uuid4().hex}")
            for i in range(0, len(level), fan_in)
        ]
    if finalize is None:
        return client.submit(combine, level, pure=False, key=f"{name}-{uuid.uuid4().hex}")
    return client.submit(_root, combine, level, finalize, *finalize_args, pure=False, key=f"{name}-root-{uuid.uuid4().hex}")


def _root(combine: Callable, items: list, finalize: Callable, *args: Any) -> Any:
    return finalize(combine(items), *args)
