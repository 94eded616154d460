"""The local cluster's choice of an in-process worker (config.gpu_in_process), without starting one."""

import dask
import pytest

from daskmeans import config


@pytest.mark.parametrize("how,n_gpus,expected", [
    ("auto", 1, True), ("threads", 1, True), ("processes", 1, False),
    ("auto", 2, False), ("threads", 2, False), ("auto", 8, False),
])
def test_only_one_gpu_runs_its_worker_in_process(how, n_gpus, expected):
    """Several GPUs need a worker process each: an in-process cluster of one worker would
    leave every GPU but the first idle."""
    with dask.config.set({"daskmeans.local-cluster": how}):
        assert config.gpu_in_process(n_gpus) is expected
