"""The package namespace is the public API: ``dir(daskmeans)`` is ``__all__`` (plus dunders),
in a fresh interpreter and after a fit has imported the rest of the package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import numpy as np

import daskmeans

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def public(names) -> set[str]:
    return {n for n in names if not (n.startswith("__") and n.endswith("__"))}


def test_dir_is_all_in_a_fresh_interpreter():
    code = ("import json, types, daskmeans; print(json.dumps([sorted(dir(daskmeans)), daskmeans.__all__, "
            "sorted(n for n, v in vars(daskmeans).items() if not n.startswith('_') "
            "and not isinstance(v, types.ModuleType))]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
    names, all_, defined = json.loads(out.stdout)
    assert public(names) == set(all_)
    assert set(defined) <= set(all_)  # what the module defines (not submodules) is all public


def test_dir_is_all_after_a_fit_and_every_name_resolves(client):
    daskmeans.KMeans(2, client=client).fit(np.random.default_rng(0).standard_normal((20, 2)))
    assert public(dir(daskmeans)) == set(daskmeans.__all__)
    for name in daskmeans.__all__:
        assert getattr(daskmeans, name) is not None
    defined = {n for n, v in vars(daskmeans).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert defined <= set(daskmeans.__all__)
    for leaked in ("Any", "TYPE_CHECKING", "annotations"):
        assert not hasattr(daskmeans, leaked)
