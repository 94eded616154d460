"""Extension points: a new memory tier is one module (a :class:`Tier` subclass) and one registry
entry. A dummy tier registered here, ``host-copy``, runs a fit bitwise as the ``host`` tier does;
the registry and the command's light list of tiers (``options.TIERS``) agree; no module outside
the registry compares a tier's name."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from dask.utils import format_bytes

import daskmeans
from daskmeans import DaskmeansError, KMeans
from daskmeans.engine import tiers
from daskmeans.engine.tiers import Need, Tier
from daskmeans.options import TIERS

PACKAGE = Path(daskmeans.__file__).parent
REGISTRY_DIR = "engine/tiers/"  # the only place that may compare a tier's name
NAMES = {"device", "host", "storage"}


class HostCopyTier(Tier):
    """A tier that behaves like ``host`` through its own code: each block copied into new host
    memory when placed, streamed through the backend's staging as the host tier is."""

    name = "host-copy"
    help = "host memory, each chunk copied when placed (a test's tier)"

    def resident_backend(self, backend: str) -> str | None:
        return "numpy"

    def hold(self, be: Any, block: Any) -> Any:
        return be.pinned(np.array(block, copy=True))

    def stream(self, shard: Any) -> Iterator[Any]:
        return shard.be.staged(shard.blocks)

    def refusal(self, need: Need) -> str | None:
        host_need = need.share + (0 if need.gpu else need.working)
        if host_need <= need.host_budget:
            return None
        return f"tier='host-copy' needs {format_bytes(host_need)} per worker, more than {format_bytes(need.host_budget)}"


@pytest.fixture
def host_copy():
    tier = HostCopyTier()
    tiers.register(tier)
    try:
        yield tier
    finally:
        tiers.unregister(tier.name)
    assert tier.name not in tiers.REGISTRY and tier.name not in TIERS


def test_the_registry_and_the_commands_list_agree():
    assert list(TIERS) == [tiers.AUTO, *tiers.REGISTRY]
    assert {name: t.help for name, t in tiers.REGISTRY.items()} == {n: h for n, h in TIERS.items() if n != tiers.AUTO}
    assert all(t.name == name for name, t in tiers.REGISTRY.items())


def test_a_registered_tier_fits_as_host_does_bitwise(client, host_copy):
    rng = np.random.default_rng(5)
    X = np.concatenate([rng.normal(c, 1.0, (700, 4)) for c in (-6.0, 0.0, 6.0)]).astype(np.float32)
    init = X[[0, 800, 1600, 100, 900]].astype(np.float64)
    fits = {tier: KMeans(5, init=init, max_iter=8, tol=0, tier=tier, client=client).fit(X)
            for tier in ("host", host_copy.name)}
    host, copy = fits["host"], fits[host_copy.name]
    assert copy.tier_ == host_copy.name and host.tier_ == "host"
    assert copy.cluster_centers_.tobytes() == host.cluster_centers_.tobytes()
    assert np.array_equal(copy.labels_, host.labels_)
    assert copy.inertia_ == host.inertia_ and copy.n_iter_ == host.n_iter_


def test_the_plan_asks_each_tier_what_it_needs(host_copy):
    small = Need(share=10, working=5, gpu=False, host_budget=100, device_budget=None)
    large = Need(share=200, working=5, gpu=False, host_budget=100, device_budget=None)
    assert tiers.choose("auto", small) is tiers.REGISTRY["host"]  # device needs a GPU; host comes first
    assert tiers.choose("auto", large) is tiers.REGISTRY["storage"]
    assert tiers.choose(host_copy.name, small) is host_copy
    with pytest.raises(DaskmeansError, match="^tier='host-copy' needs 205 B per worker, more than 100 B$"):
        tiers.choose(host_copy.name, large)
    with pytest.raises(DaskmeansError, match="^tier='device' needs GPU workers"):
        tiers.choose("device", small)
    with pytest.raises(DaskmeansError, match=r"^tier='tape' should be one of 'auto', 'device', 'host', 'storage', "
                                             r"'host-copy'$"):
        tiers.lookup("tape")


def test_registering_refuses_a_taken_name_and_unregistering_a_built_in_tier():
    with pytest.raises(ValueError, match="'host' should be new"):
        tiers.register(type("Again", (HostCopyTier,), {"name": "host"})())
    with pytest.raises(ValueError, match="'storage' is built in"):
        tiers.unregister("storage")
    with pytest.raises(TypeError, match="should be an instance of a daskmeans.engine.tiers.Tier subclass"):
        tiers.register("host-copy")


def test_what_each_tier_keeps():
    device, host, storage = (tiers.REGISTRY[n] for n in ("device", "host", "storage"))
    assert device.resident_backend("cupy") == "cupy" and host.resident_backend("cupy") == "numpy"
    assert storage.resident_backend("cupy") is None and not storage.resident
    assert device.yields_resident and not host.yields_resident and not storage.yields_resident
    assert (device.kept_bytes(7), host.kept_bytes(7), storage.kept_bytes(7)) == (7, 7, 0)


def _tier_names_in(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_tier_names_in(e) for e in node.elts)
    return False


def tier_comparisons(source: str) -> list[str]:
    """The source of every comparison in ``source`` with a tier's name."""
    return [ast.get_source_segment(source, node) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Compare) and any(_tier_names_in(x) for x in [node.left, *node.comparators])]


def test_the_finder_sees_each_form_of_tier_comparison():
    src = ('a = tier == "storage"\nb = t.name in ("device", "host")\nc = "host" != x\n'
           'd = budgets["host"]\ne = "host" if x else "network"\n')
    assert tier_comparisons(src) == ['tier == "storage"', 't.name in ("device", "host")', '"host" != x']


def test_no_module_compares_a_tier_name_outside_the_registry():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if not rel.startswith(REGISTRY_DIR):
            found += [(rel, seg) for seg in tier_comparisons(path.read_text())]
    assert found == [], "ask the tier object (daskmeans.engine.tiers) instead of comparing its name"
