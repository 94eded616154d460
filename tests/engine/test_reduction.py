"""The tree reduction of futures (reduction.tree_reduce) on a real cluster: contiguous runs
combined in order at every fan-in, the finalizer at the root, a fan-in below 2 refused."""

import pytest

from daskmeans.reduction import tree_reduce


def _wrap(items):
    return "(" + "".join(items) + ")"


def _shout(root, suffix):
    return root.upper() + suffix


def test_tree_reduce_groups_contiguous_runs_in_order(client):
    futs = [client.submit(str, c, pure=False) for c in "abcde"]
    # fan-in 2: (ab)(cd)(e) -> ((ab)(cd))((e)) -> the root
    assert tree_reduce(client, futs, _wrap, "t", split_every=2).result() == "(((ab)(cd))((e)))"
    assert tree_reduce(client, futs, _wrap, "t", split_every=8).result() == "(abcde)"
    assert tree_reduce(client, futs[:1], _wrap, "t", split_every=2).result() == "(a)"  # combined at least once
    root = tree_reduce(client, futs, _wrap, "t", split_every=3, finalize=_shout, finalize_args=("!",))
    assert root.result() == "((ABC)(DE))!"
    with pytest.raises(ValueError, match="split_every=1 should be >= 2"):
        tree_reduce(client, futs, _wrap, "t", split_every=1)
