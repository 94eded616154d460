"""The seams of issue 32, read from the syntax trees: the command line uses only public names
of the package's other modules and objects, and the estimator holds no Dask scheduling (its
fit is ``engine/fit.py``'s, its inference ``engine/infer.py``'s)."""

from __future__ import annotations

import ast
import importlib
import os
import types

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "daskmeans")


def package_source(path: str) -> str:
    """The text of the package's module at ``path`` (relative to ``daskmeans/``)."""
    with open(os.path.join(PACKAGE, path)) as f:
        return f.read()


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def source_module(node: ast.ImportFrom, package: str) -> str:
    """The absolute module an ``ImportFrom`` in ``package`` (a module's package) names."""
    if not node.level:
        return node.module or ""
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def is_module(name: str) -> bool:
    try:
        return isinstance(importlib.import_module(name), types.ModuleType)
    except ImportError:
        return False


def private_uses(source: str, package: str = "daskmeans") -> list[str]:
    """What ``source`` (a module of ``package``) uses of other modules' or objects' private
    names: ``from x import _name``; ``module._name`` where ``module`` is one of the package's
    modules; ``obj._name`` on anything but ``self``/``cls`` (its own classes) and modules
    outside the package (``os._exit``). ``package`` resolves relative imports (a module of a
    subpackage: ``daskmeans.cli``)."""
    top = package.split(".")[0]
    tree = ast.parse(source)
    ours: set[str] = set()  # names bound to the package's modules
    theirs: set[str] = set()  # names bound to other modules
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                bound = a.asname or a.name.split(".")[0]
                (ours if a.name.split(".")[0] == top else theirs).add(bound)
        elif isinstance(node, ast.ImportFrom):
            mod = source_module(node, package)
            for a in node.names:
                if private(a.name):
                    found.append(f"line {node.lineno}: from {mod} import {a.name}")
                if is_module(f"{mod}.{a.name}"):
                    (ours if mod.split(".")[0] == top else theirs).add(a.asname or a.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if owner in ("self", "cls") or (owner in theirs and owner not in ours):
                continue
            what = f"module {owner}" if owner in ours else f"object {ast.unparse(node.value)}"
            found.append(f"line {node.lineno}: {ast.unparse(node)} ({what})")
    return found


CLI_MODULES = sorted(f for f in os.listdir(os.path.join(PACKAGE, "cli")) if f.endswith(".py"))


def test_the_cli_is_a_package_of_the_expected_modules():
    """The command is ``cli/``: the check below then reads each of its modules."""
    assert {"__init__.py", "main.py", "common.py", "fit.py", "predict.py", "sweep.py"} <= set(CLI_MODULES)
    assert not os.path.exists(os.path.join(PACKAGE, "cli.py"))


@pytest.mark.parametrize("module", CLI_MODULES)
def test_the_cli_uses_no_private_name_of_another_module(module):
    assert private_uses(package_source(f"cli/{module}"), "daskmeans.cli") == []


@pytest.mark.parametrize("snippet", [
    "import os\nos._exit(0)",
    "import sys\nsys._getframe()",
    "class P:\n    def f(self):\n        return self._names()",
    "from . import __version__",
    "km.check_params()\nkm.initial_centroids(3)",
])
def test_the_check_allows_public_names_own_classes_and_other_libraries(snippet):
    assert private_uses(snippet) == []


# What schedules work on a cluster: futures, placement, collectives, the loop and its client side (engine.lloyd).
SCHEDULING_MODULES = ("distributed", "daskmeans.engine.placement", "daskmeans.engine.watch",
                      "daskmeans.engine.task", "daskmeans.reduction", "daskmeans.engine.loop",
                      "daskmeans.engine.lloyd", "daskmeans.engine.collective", "daskmeans.engine.mailbox",
                      "daskmeans.engine.dask_collective", "daskmeans.engine.nccl_collective",
                      "daskmeans.engine.moments", "daskmeans.engine.plan")
SCHEDULING_CALLS = {"submit", "scatter", "persist", "gather", "map", "run", "wait", "result", "replicate",
                    "rebalance", "as_completed", "get_client", "default_client", "worker_client", "secede", "rejoin",
                    "publish_dataset"}


def scheduling_in(source: str) -> list[str]:
    """Imports of the scheduling modules and calls of cluster operations in ``source`` (a
    module of the package, at ``daskmeans/``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [source_module(node, "daskmeans")]
            found += [f"line {node.lineno}: imports {m}" for m in mods
                      if any(m == s or m.startswith(s + ".") for s in SCHEDULING_MODULES)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SCHEDULING_CALLS:
            found.append(f"line {node.lineno}: {ast.unparse(node.func)}()")
    return found


def test_the_estimator_holds_no_scheduling():
    assert scheduling_in(package_source("estimator.py")) == []


@pytest.mark.parametrize("front", ["minibatch.py", "kmeans_base.py"])
def test_the_other_fronts_hold_no_scheduling(front):
    """MiniBatchKMeans's rounds and what both estimators share run on the engine's job."""
    assert scheduling_in(package_source(front)) == []


@pytest.mark.parametrize("front", ["estimator.py", "minibatch.py", "kmeans_base.py"])
def test_the_fronts_import_no_private_name_of_another_module(front):
    """What the fronts share is public (``BaseKMeans``, ``output_like``, ...); their own
    class's private members (``super()._blocks``, a clone's) are theirs to use."""
    assert [u for u in private_uses(package_source(front)) if " import " in u] == []


@pytest.mark.parametrize("check, snippet", [
    (private_uses, "from .estimator import _fanout"),
    (private_uses, "from daskmeans.io.paths import _held_guard"),
    (private_uses, "from . import report\nreport._matplotlib()"),
    (private_uses, "import daskmeans.report as r\nr._matplotlib()"),
    (private_uses, "from .estimator import KMeans\nkm = KMeans(2)\nkm._validate_params()"),
    (private_uses, "def f(km):\n    return km._init_array(3)"),
    (private_uses, "def f(km):\n    return km._labels"),
    (scheduling_in, "from .engine.placement import place"),
    (scheduling_in, "from distributed import wait"),
    (scheduling_in, "from .engine.collective import open_collective"),
    (scheduling_in, "client.submit(f, x)"),
    (scheduling_in, "futures = client.scatter(x)"),
    (scheduling_in, "x = x.persist()"),
])
def test_each_check_finds_each_kind_of_use(check, snippet):
    assert len(check(snippet)) == 1


# ---------------------------------------------------------------- the layers of design.md


def design_layers() -> list[tuple[str, list[str]]]:
    """design.md's layer table, top to bottom: ``(layer, module prefixes)``, each prefix a
    module (``daskmeans.cli``) or a package (``daskmeans.engine.``) named in its row."""
    import re

    with open(os.path.join(ROOT, "docs", "design.md")) as f:
        text = f.read()
    table = text[text.index("## Layers"):text.index("## Module map")]
    layers = []
    for row in re.findall(r"^\| (\w[\w/ ]*?) \| (.+) \|$", table, re.M):
        name, cell = row
        if name == "layer":
            continue
        prefixes = []
        for token in re.findall(r"`([\w/.]+)`", cell):
            if token.endswith("/"):
                prefixes.append("daskmeans." + token[:-1].replace("/", ".") + ".")
            elif token.endswith(".py"):
                mod = token[:-3].replace("/", ".")
                prefixes.append("daskmeans" if mod == "__init__" else f"daskmeans.{mod}")
        layers.append((name, prefixes))
    return layers


def package_modules() -> list[str]:
    mods = []
    for dirpath, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].replace(os.sep, ".")
                mods.append(rel[: -len(".__init__")] if rel.endswith(".__init__") else rel)
    return sorted(mods)


def layer_index(module: str, layers: list) -> int | None:
    """The index (0 = top) of the layer holding ``module``; the most specific prefix wins."""
    best = None
    for i, (_, prefixes) in enumerate(layers):
        for p in prefixes:
            hit = module == p or (p.endswith(".") and module.startswith(p)) or (module + "." == p)
            if hit and (best is None or len(p) > best[1]):
                best = (i, len(p))
    return None if best is None else best[0]


def imports_of(module: str) -> list[tuple[str, int]]:
    """The package's modules ``module`` imports (at any depth of its code), with the line."""
    path = os.path.join(ROOT, *module.split(".")) + ".py"
    if not os.path.exists(path):
        path = os.path.join(ROOT, *module.split("."), "__init__.py")
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom):
            base = source_module(node, package)
            for a in node.names:  # from .. import config: the module daskmeans.config
                target = f"{base}.{a.name}" if is_module(f"{base}.{a.name}") else base
                if target.split(".")[0] == "daskmeans":
                    found.append((target, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "daskmeans"]
    return found


def test_every_module_is_in_one_layer_of_design_md():
    layers = design_layers()
    assert [name for name, _ in layers] == ["command", "API", "views", "engine", "kernels", "I/O", "base"]
    assert [m for m in package_modules() if layer_index(m, layers) is None] == []


def test_no_module_imports_from_a_layer_above_its_own():
    layers = design_layers()
    upward = []
    for mod in package_modules():
        mine = layer_index(mod, layers)
        for target, line in imports_of(mod):
            theirs = layer_index(target, layers)
            if theirs is not None and theirs < mine:
                upward.append(f"{mod}:{line} imports {target} ({layers[theirs][0]} above {layers[mine][0]})")
    assert upward == []


def test_the_layering_check_sees_an_upward_import():
    """The check itself: the engine importing the command would be reported."""
    layers = design_layers()
    assert layer_index("daskmeans.engine.job", layers) > layer_index("daskmeans.cli", layers)
    assert layer_index("daskmeans.events", layers) == len(layers) - 1


@pytest.mark.parametrize("snippet", [
    "from .common import _say",
    "from . import common\ncommon._say('x')",
    "from ..estimator import _like",
])
def test_the_check_reads_a_subpackage_s_relative_imports(snippet):
    """In ``daskmeans.cli``, ``from . import common`` binds a module of the package: its
    private names are found as any other module's."""
    assert len(private_uses(snippet, "daskmeans.cli")) == 1
