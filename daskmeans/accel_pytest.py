"""A pytest plugin that runs a test suite with scikit-learn's clustering routed to daskmeans.

::

    python -m pytest -p daskmeans.accel_pytest --pyargs sklearn.cluster.tests.test_k_means

The routing (:func:`daskmeans.accel.install`) is installed when pytest is configured, before
any test module is collected, so the suite's ``from sklearn.cluster import KMeans`` imports
daskmeans' class: scikit-learn's own tests, from the installed package, run unchanged.
``--daskmeans-strict`` turns off the fallback to scikit-learn, so that every test that
passes passed on daskmeans (what CI counts: ``tests/api/test_sklearn_suite.py``).

Every fit of the session runs on one cluster: the local cluster daskmeans starts on the first
fit (in-process workers, reused by every later fit) or the default client.
"""

from __future__ import annotations

from typing import Any


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("daskmeans.accel")
    group.addoption("--daskmeans-strict", action="store_true", default=False,
                    help="no fallback to scikit-learn: what daskmeans cannot take fails")
    group.addoption("--daskmeans-verbose", action="store_true", default=False,
                    help="say (on stderr) what ran on daskmeans and what on scikit-learn")


def pytest_configure(config: Any) -> None:
    from daskmeans.accel import install

    install(verbose=config.getoption("--daskmeans-verbose"), fallback=not config.getoption("--daskmeans-strict"))
