"""The local cluster's choice of an in-process worker (config.gpu_in_process) and its close, without
starting one; the command's line for an error without a message."""

import dask
import pytest

from daskmeans import config


@pytest.mark.parametrize("how,n_gpus,cap,expected", [
    ("auto", 1, 8, True), ("threads", 1, 8, True), ("processes", 1, 8, False),
    ("auto", 2, 8, True), ("threads", 2, 8, True), ("processes", 2, 8, False), ("auto", 8, 8, True),
    ("auto", 4, 2, False), ("threads", 4, 2, True),
])
def test_gpus_run_in_process_unless_processes_are_asked_or_too_many(how, n_gpus, cap, expected):
    """GPU workers run in the command's process (a worker per GPU, each on its own GPU:
    ``engine/devices.py``, tested in ``tests/engine/test_devices.py`` and on GPUs in
    ``tests/gpu/test_gpu_multi.py``) unless processes are asked for, or auto meets more GPUs than
    ``local-threads-max-workers``."""
    with dask.config.set({"daskmeans.local-cluster": how, "daskmeans.local-threads-max-workers": cap}):
        assert config.gpu_in_process(n_gpus) is expected


class _Closing:
    """A cluster whose close ends in ``error`` after closing (a nanny's TimeoutError: its
    killed worker process was still exiting at the deadline)."""

    def __init__(self, error: Exception):
        self.error, self.closed = error, False

    def close(self) -> None:
        self.closed = True
        raise self.error


def test_a_worker_process_slow_to_exit_does_not_fail_the_close():
    from daskmeans.dask_cluster import close_local

    c = _Closing(TimeoutError())
    close_local(c)
    assert c.closed


def test_other_errors_of_a_close_are_raised():
    from daskmeans.dask_cluster import close_local

    with pytest.raises(RuntimeError, match="^comm broke$"):
        close_local(_Closing(RuntimeError("comm broke")))


def test_an_error_without_a_message_is_named_by_its_type():
    """The command's one line never ends empty (``daskmeans: error: `` told nothing)."""
    from daskmeans.cli.main import os_error_line

    assert os_error_line(TimeoutError()) == "TimeoutError (no message)"
    assert os_error_line(OSError(28, "No space left on device", "/x/m.zarr")) == "/x/m.zarr: No space left on device"
