"""The ``daskmeans`` namespace of dask.config."""

import subprocess
import sys


def test_defaults_survive_a_config_set_entered_before_import():
    # dask.config.set removes, on exit, a namespace that did not exist when it was entered:
    # the YAML defaults must still answer afterwards.
    code = (
        "import dask\n"
        "with dask.config.set({'daskmeans.segment-seconds': 0}):\n"
        "    from daskmeans import config\n"
        "    assert config.get_seconds('segment-seconds') == 0\n"
        "print(config.get_seconds('segment-seconds'), config.get_bytes('chunk-bytes'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1.0", str(32 * 2**20)]
