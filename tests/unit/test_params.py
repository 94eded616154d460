"""params.py: one record per concern, from which the estimators' signatures and constraints,
the checkpoint's fingerprint and the command's options derive."""

import dataclasses
import inspect
import subprocess
import sys

import numpy as np
import pytest

from daskmeans import KMeans, MiniBatchKMeans
from daskmeans.errors import InvalidParameterError
from daskmeans.io.checkpoint import fingerprint
from daskmeans.options import TIERS
from daskmeans.params import (KMeansParams, MiniBatchParams, RunParams, constraints, defaults, fingerprint_values,
                              options, record)


def signature_defaults(cls) -> dict:
    return {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
            if name not in ("self", "client")}


def test_kmeans_signature_defaults_are_the_records():
    want = defaults(KMeansParams, RunParams)
    del want["collective"]  # the configured one: no parameter of KMeans
    assert signature_defaults(KMeans) == want


def test_minibatch_signature_defaults_are_the_records():
    run = {k: v for k, v in defaults(RunParams).items() if k not in ("collective", "checkpoint", "checkpoint_every")}
    assert signature_defaults(MiniBatchKMeans) == {**defaults(MiniBatchParams), **run}


def test_the_estimators_constraints_are_the_records():
    assert set(KMeans._parameter_constraints) == set(signature_defaults(KMeans))
    assert set(MiniBatchKMeans._parameter_constraints) == set(signature_defaults(MiniBatchKMeans))
    # One constraint object per parameter both take: written once.
    assert MiniBatchKMeans._parameter_constraints["max_iter"] is KMeans._parameter_constraints["max_iter"]


@pytest.mark.parametrize("name, value, message", [
    ("max_iter", 0, "max_iter=0 should be >= 1"),
    ("tier", "disk", "tier='disk' should be one of"),
    ("init", "nope", "init='nope' should be one of"),
    ("checkpoint_every", 0, "checkpoint_every=0 should be >= 1"),
])
def test_a_refused_value_names_value_and_requirement(name, value, message):
    with pytest.raises(InvalidParameterError, match=message):
        KMeans(**{name: value}).check_params()


def test_the_fingerprint_names_the_records_fingerprint_fields():
    p = KMeansParams(n_clusters=3, init=np.zeros((3, 2)), random_state=7, tol=0.5)
    got = fingerprint(p, n_samples=10, n_features=2, dtype=np.float32, weighted=False,
                      moments={"max_abs": np.ones(2), "digest": "d"})
    assert got == {"n_samples": 10, "n_features": 2, "dtype": "float32", "weighted": False, "n_clusters": 3,
                   "init": "array", "random_state": 7, "tol": 0.5, "metric": "euclidean", "precision": "fp32",
                   "max_abs": [1.0, 1.0], "digest": "d"}
    # Only where set, so that checkpoints of fits without it stay valid.
    assert fingerprint_values(dataclasses.replace(p, max_imbalance=2.0))["max_imbalance"] == 2.0
    assert fingerprint_values(dataclasses.replace(p, random_state=np.random.RandomState(0)))["random_state"] is None


def test_options_give_the_command_name_default_help_and_choices():
    opts = {o.name: o for o in options(KMeansParams, RunParams, registries={"inits": ("k-means||", "random"),
                                                                            "collectives": ("auto", "dask")})}
    assert opts["max_iter"].flag == "--max-iter" and opts["max_iter"].default == 300 and opts["max_iter"].help
    assert opts["tier"].choices == tuple(TIERS)
    assert opts["collective"].choices == ("auto", "dask") and opts["collective"].default is None
    opts["collective"].constraint.check("--collective", "dask")
    with pytest.raises(KeyError, match="inits"):
        options(KMeansParams)


def test_record_reads_an_estimators_parameters():
    km = KMeans(5, max_iter=7, tier="host")
    assert record(KMeansParams, km) == dataclasses.replace(KMeansParams(), n_clusters=5, max_iter=7)
    assert record(RunParams, km).tier == "host" and record(RunParams, km).collective is None


def test_params_imports_neither_numpy_nor_dask():
    code = "import sys, daskmeans.params; print(sorted(m for m in ('numpy', 'dask') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
