"""One owner of a fit's data, read from the code and from a traced fit.

* No import circle between the package's modules, and no module imports another module's
  private names (``from x import _y``, ``module._y``).
* The fronts (MiniBatchKMeans, the sweep, the command) reach the cluster only through the engine
  job: they schedule nothing and import no engine module but the job's
  (:data:`FRONT_ENGINE_MODULES`).
* Following ``X`` from ``KMeans.fit`` through every call that passes it on (or what is made of
  it: the Dask array read from it, the job and placement holding it) crosses few modules: at most
  :data:`MAX_UPWARD` visits a return to a higher layer of design.md's table, and no more visits
  than :data:`MAX_VISITS`, for a NumPy array, a Dask array and a Zarr path alike. A visit is a run
  of consecutive such calls in one module; the count is taken from a real fit traced with
  :func:`sys.setprofile`.
"""

from __future__ import annotations

import ast
import os
import sys
import types

import numpy as np
import pytest

from test_layering import (PACKAGE, ROOT, design_layers, imports_of, is_module, layer_index, package_modules,
                           private, scheduling_in, source_module)

# The targets (design.md, "One owner of a fit"), met by every input: the visits are at
# 30, 30 and 28 for a NumPy array, a Dask array and a Zarr path, 5 of them upward returns each.
MAX_VISITS = 30
MAX_UPWARD = 8


def module_path(module: str) -> str:
    path = os.path.join(ROOT, *module.split(".")) + ".py"
    return path if os.path.exists(path) else os.path.join(ROOT, *module.split("."), "__init__.py")


def typing_only_lines(module: str) -> set[int]:
    """The lines of ``module``'s ``if TYPE_CHECKING:`` blocks (names for annotations only)."""
    with open(module_path(module)) as f:
        tree = ast.parse(f.read())
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def import_graph() -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports (at any depth of its
    code: an import inside a function is a dependency too; names imported for annotations
    alone, under ``if TYPE_CHECKING:``, are not). ``from . import x`` of a package's attribute
    that is no module counts as importing the package's ``__init__``."""
    graph = {}
    for m in package_modules():
        typing = typing_only_lines(m)
        graph[m] = {t for t, line in imports_of(m) if t != m and line not in typing}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, edges = work[-1]
            for w in edges:
                if w not in graph:
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_the_circle_check_sees_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def private_imports(source: str, package: str) -> list[str]:
    """``from x import _y`` and ``x._y`` (``x`` one of the package's modules) in ``source``, a
    module of ``package``."""
    tree = ast.parse(source)
    modules: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = source_module(node, package)
            for a in node.names:
                if mod.split(".")[0] == "daskmeans" and private(a.name):
                    found.append(f"line {node.lineno}: from {mod} import {a.name}")
                if mod.split(".")[0] == "daskmeans" and is_module(f"{mod}.{a.name}"):
                    modules.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            modules.update(a.asname or a.name for a in node.names if a.name.split(".")[0] == "daskmeans")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and private(node.attr) and isinstance(node.value, ast.Name)
                and node.value.id in modules):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_imports_another_modules_private_names():
    found = []
    for mod in package_modules():
        path = module_path(mod)
        package = mod if path.endswith("__init__.py") else mod.rsplit(".", 1)[0]
        with open(path) as f:
            found += [f"{mod}: {u}" for u in private_imports(f.read(), package)]
    assert found == []


@pytest.mark.parametrize("snippet", ["from .report import _matplotlib", "from . import report\nreport._matplotlib()",
                                     "from daskmeans.io.model_store import _open"])
def test_the_private_import_check_sees_each_form(snippet):
    assert len(private_imports(snippet, "daskmeans")) == 1


# What a front may import of the engine layer: the job and the runs on it, inference of a
# fitted model and the sweep's scores (engine.scoring: no placement, no fit), the cluster's
# start (dask_cluster), the inits' registry (for the choices it offers) and the generated data
# of ``daskmeans generate`` (no fit).
FRONT_ENGINE_MODULES = ("daskmeans.engine.job", "daskmeans.engine.fit", "daskmeans.engine.minibatch",
                        "daskmeans.engine.infer", "daskmeans.engine.scoring", "daskmeans.dask_cluster",
                        "daskmeans.seeding", "daskmeans.datasets")
ENGINE_LAYER = "engine"


def fronts() -> list[str]:
    return ["daskmeans.minibatch", "daskmeans.sweep"] + [m for m in package_modules()
                                                        if m == "daskmeans.cli" or m.startswith("daskmeans.cli.")]


@pytest.mark.parametrize("front", fronts())
def test_the_fronts_reach_the_cluster_only_through_the_engine_job(front):
    layers = design_layers()
    engine = [name for name, _ in layers].index(ENGINE_LAYER)
    with open(module_path(front)) as f:
        source = f.read()
    beside_the_job = [f"line {line}: imports {target}" for target, line in imports_of(front)
                      if layer_index(target, layers) == engine and target not in FRONT_ENGINE_MODULES]
    assert scheduling_in(source) + beside_the_job == []


# ---------------------------------------------------------------- following X


def follow(fit, X) -> list[tuple[str, str]]:
    """Run ``fit(X)`` under a profiler; the (module, function) of every call of the package's
    code that receives ``X`` or something made of it (a call's non-trivial result when one of
    its arguments was, and the arrays that result holds), in call order."""
    import dask.array as da

    trivial = (int, float, str, bytes, bool, np.generic, type, types.ModuleType, types.FunctionType)
    made: dict[int, object] = {id(X): X}

    def carries(v, depth: int = 0) -> bool:
        if id(v) in made:
            return True
        if depth:
            return False
        if isinstance(v, (list, tuple)):
            return any(carries(e, 1) for e in v[:8])
        if isinstance(v, dict):
            return any(carries(e, 1) for e in list(v.values())[:8])
        held = getattr(v, "__dict__", None)
        if isinstance(held, dict) and not isinstance(v, (type, types.ModuleType)):
            return any(carries(e, 1) for e in list(held.values())[:16])
        return False

    calls: list[tuple[str, str]] = []
    stack: list[bool] = []

    def profile(frame, event, arg):
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            code = frame.f_code
            n = (code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & inspect_varargs)
                 + bool(code.co_flags & inspect_varkw))
            hit = module.split(".")[0] == "daskmeans" and any(
                carries(frame.f_locals[name]) for name in code.co_varnames[:n] if name in frame.f_locals)
            if hit:
                calls.append((module, code.co_name))
            stack.append(hit)
        elif event == "return":
            hit = stack.pop() if stack else False
            if hit and arg is not None and not isinstance(arg, (trivial, list, dict, set)):
                if not (isinstance(arg, tuple) and all(a is None or isinstance(a, trivial) for a in arg)):
                    made[id(arg)] = arg
                    for a in arg if isinstance(arg, tuple) else getattr(arg, "__dict__", {}).values():
                        if isinstance(a, (da.Array, np.ndarray)):
                            made[id(a)] = a

    sys.setprofile(profile)
    try:
        fit(X)
    finally:
        sys.setprofile(None)
    return calls


inspect_varargs, inspect_varkw = 0x04, 0x08


def visits(calls: list[tuple[str, str]], layers: list) -> tuple[int, int, list[str]]:
    """The visits (runs of consecutive calls in one module) of ``calls``, how many of them a
    return to a higher layer, and a line each for the assertion's message."""
    runs: list[str] = []
    for module, _ in calls:
        if not runs or runs[-1] != module:
            runs.append(module)
    upward, previous, lines = 0, None, []
    for module in runs:
        layer = layer_index(module, layers)
        up = previous is not None and layer is not None and layer < previous
        upward += up
        lines.append(f"{module}{' (up)' if up else ''}")
        previous = layer
    return len(runs), upward, lines


def test_visits_count_runs_and_returns_up():
    layers = design_layers()
    calls = [("daskmeans.estimator", "fit"), ("daskmeans.estimator", "_fit"), ("daskmeans.io.readers", "read"),
             ("daskmeans.estimator", "_names"), ("daskmeans.engine.job", "open")]
    n, up, _ = visits(calls, layers)
    assert (n, up) == (4, 1)


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster:
        with Client(cluster) as c:
            yield c


def traced_fit(kind: str, tmp_path) -> list[tuple[str, str]]:
    """The calls of :func:`follow` for a default ``KMeans(3)`` fit of 2000 x 4 rows given as
    ``kind``: a NumPy array, a Dask array or a Zarr store's path (on the module's client)."""
    import dask.array as da

    from daskmeans import KMeans

    rng = np.random.default_rng(0)
    KMeans(3, max_iter=2, random_state=0).fit(rng.standard_normal((500, 4)))  # imports and kernels, not this data
    data = rng.standard_normal((2000, 4)).astype(np.float32)
    if kind == "numpy":
        X = data
    elif kind == "dask":
        X = da.from_array(data, chunks=500)
    else:
        X = str(tmp_path / "x.zarr")
        da.to_zarr(da.from_array(data, chunks=500), X)
    return follow(lambda X: KMeans(3, max_iter=2, random_state=0).fit(X), X)


@pytest.mark.parametrize("kind", ["numpy", "dask", "zarr path"])
def test_following_x_from_fit_crosses_at_most_the_target_visits(client, kind, tmp_path):
    calls = traced_fit(kind, tmp_path)
    n, upward, lines = visits(calls, design_layers())
    assert any(m.startswith("daskmeans.engine.") for m, _ in calls), "the trace lost X before the engine"
    assert n <= MAX_VISITS and upward <= MAX_UPWARD, f"{n} visits, {upward} upward:\n" + "\n".join(lines)
