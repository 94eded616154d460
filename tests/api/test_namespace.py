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


def test_the_examples_and_the_readme_use_public_names_only():
    """The examples (scripts and the notebook) and the README's code import daskmeans' public
    namespace only: no ``from daskmeans.<module> import`` and no ``daskmeans.<module>.`` path."""
    import re

    texts = {}
    for name in sorted(os.listdir(os.path.join(ROOT, "examples"))):
        path = os.path.join(ROOT, "examples", name)
        if name.endswith(".py"):
            texts[name] = open(path).read()
        elif name.endswith(".ipynb"):
            cells = json.load(open(path))["cells"]
            texts[name] = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    readme = open(os.path.join(ROOT, "README.md")).read()
    texts["README.md"] = "\n".join(re.findall(r"```python\n(.*?)```", readme, re.S))
    assert len(texts) >= 5
    private = {name: re.findall(r"from daskmeans\.\w[\w.]* import|daskmeans\.[a-z_]+\.[a-z_]", text)
               for name, text in texts.items()}
    assert {name: found for name, found in private.items() if found} == {}
