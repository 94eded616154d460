"""scikit-learn's own KMeans tests, from the installed package, with daskmeans' estimators in
place of scikit-learn's (issue 49): ``python -m pytest -p daskmeans.accel_pytest
--daskmeans-strict --pyargs sklearn.cluster.tests.test_k_means`` in a subprocess, its
pass/fail set compared with the expected failures that docs/sklearn.md lists with their
reasons. A new failure fails here; so does a listed one that passes (the list would lie).

About 2 minutes on 2 cores (one local cluster for the whole run; the time is the Dask round
trips of the suite's many small fits, see docs/sklearn.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "sklearn.md"
SUITE = "sklearn.cluster.tests.test_k_means"
LISTED_FOR = "1.9"  # the scikit-learn version docs/sklearn.md's list was made with
AT_LEAST = 240  # issue 49's bar, of 264 tests run with scikit-learn 1.9


def expected_failures(text: str) -> dict[str, str]:
    """The tests of the ``### Expected failures`` table in docs/sklearn.md, with their reasons."""
    m = re.search(r"^### Expected failures.*?\n(.*?)(?=^#|\Z)", text, re.S | re.M)
    if m is None:
        raise AssertionError("docs/sklearn.md has no '### Expected failures' section")
    rows = (re.match(r"^\| `([^`]+)` \| (.+) \|$", line) for line in m.group(1).splitlines())
    return {r.group(1): r.group(2) for r in rows if r}


def outcomes(junit: Path) -> dict[str, str]:
    """Each test case of a JUnit XML report: ``passed``, ``failed`` or ``skipped``."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        out[case.get("name")] = ("failed" if kinds & {"failure", "error"} else
                                 "skipped" if "skipped" in kinds else "passed")
    return out


def test_the_documented_list_is_read():
    listed = expected_failures(DOC.read_text())
    assert listed and all(reason.strip() for reason in listed.values())
    text = "### Expected failures (x)\n\n| test | reason |\n| --- | --- |\n| `t[1]` | why |\n\n## Next\n| `u` | no |\n"
    assert expected_failures(text) == {"t[1]": "why"}


def test_scikit_learns_kmeans_tests_pass_on_daskmeans(tmp_path):
    sklearn = pytest.importorskip("sklearn")
    junit = tmp_path / "junit.xml"
    env = dict(os.environ, PYTHONPATH=str(ROOT), SKLEARN_SEED="0", SKLEARN_TESTS_GLOBAL_RANDOM_SEED="42",
               DASK_DISTRIBUTED__LOGGING__DISTRIBUTED="error")
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    for name in ("SKLEARN_RUN_FLOAT32_TESTS", "PYTEST_ADDOPTS"):
        env.pop(name, None)
    # cwd outside the repository: its pytest configuration and conftest.py stay out of the run
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "daskmeans.accel_pytest", "--daskmeans-strict", "--pyargs", SUITE,
         "-q", "-p", "no:cacheprovider", "--tb=line", "-W", "ignore", f"--junitxml={junit}"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=1500)
    assert junit.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    results = outcomes(junit)
    failed = {t for t, r in results.items() if r == "failed"}
    passed = {t for t, r in results.items() if r == "passed"}
    listed = expected_failures(DOC.read_text())
    new = sorted(failed - set(listed))
    assert not new, f"scikit-learn's tests newly failing on daskmeans (fix, or list in docs/sklearn.md with the reason): " \
                    f"{new}\n{proc.stdout[-4000:]}"
    if sklearn.__version__.startswith(LISTED_FOR + "."):
        assert len(passed) + len(failed) == 264, (len(passed), len(failed))
        assert len(passed) >= AT_LEAST
        fixed = sorted(set(listed) - failed)
        assert not fixed, f"listed in docs/sklearn.md as failing, but passing: remove them from the list: {fixed}"
