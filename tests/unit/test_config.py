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


def test_snapshot_flattens_the_namespace_and_sees_dask_config():
    import dask

    from daskmeans import config

    snap = config.snapshot()
    assert snap["tile-bytes"] == "1MiB" and snap["init.rounds"] == 3
    with dask.config.set({"daskmeans.tile-bytes": "64KiB", "daskmeans.init.rounds": 2}):
        snap = config.snapshot()
    assert (snap["tile-bytes"], snap["init.rounds"]) == ("64KiB", 2)


def test_applied_settings_answer_in_their_thread_only():
    import threading

    from daskmeans import config

    seen = {}
    inside, release = threading.Event(), threading.Event()

    def task():
        with config.applied({"tile-bytes": "8KiB", "init.rounds": 1}):
            seen["task"] = (config.get_bytes("tile-bytes"), config.get("init.rounds"), config.snapshot()["tile-bytes"])
            inside.set()
            release.wait(10)
        seen["after"] = config.get_bytes("tile-bytes")

    t = threading.Thread(target=task)
    t.start()
    assert inside.wait(10)
    seen["other thread"] = config.get_bytes("tile-bytes")  # while the task's settings apply
    release.set()
    t.join(10)
    assert seen == {"task": (8192, 1, "8KiB"), "other thread": 2**20, "after": 2**20}
    with config.applied(None):
        assert config.get_bytes("tile-bytes") == 2**20
