"""Model files (io.model_store): written with a checksum, verified as they are read, and
refused when they contradict themselves, each with a message that says what is wrong
(issue 42). The checksum and the history's check are the checkpoints' (one implementation)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from daskmeans.errors import DataError
from daskmeans.io import checkpoint, model_store
from daskmeans.io.model_store import load_model, save_model

K, D = 3, 2


def _hist(n):
    return [{"iteration": i, "inertia": 10.0 / i, "shift": 0.5, "reassigned": 2, "n_empty": 0, "seconds": 0.01}
            for i in range(1, n + 1)]


def _attrs(**changes):
    attrs = {"params": {"n_clusters": K, "metric": "euclidean", "init": "k-means||"}, "inertia": 4.5, "n_iter": 2,
             "n_features_in": D, "feature_names_in": None, "dtype": "float64", "backend": "numpy",
             "history": _hist(2)}
    attrs.update(changes)
    return attrs


def _c(shape=(K, D), dtype=np.float64):
    return np.arange(np.prod(shape), dtype=dtype).reshape(shape)


def test_round_trip_with_checksum(tmp_path):
    path = str(tmp_path / "m")
    save_model(path, _c(), _attrs(), sizes=np.array([1, 0, 4]))
    centers, attrs, sizes = load_model(path)
    np.testing.assert_array_equal(centers, _c())
    assert sizes.tolist() == [1, 0, 4] and attrs["format_version"] == model_store.FORMAT_VERSION == 2
    assert attrs["checksum"] == model_store.checksum(attrs, {"cluster_centers": centers, "cluster_sizes": sizes})


def test_the_checksum_is_sha256_of_the_attributes_and_each_arrays_name_type_shape_and_bytes():
    # The definition every written model carries, computed by hand: hashing the arrays' own
    # memory (no copy) and hashing on a thread beside the write change no bit of it.
    arrays = {"b": np.arange(6, dtype=np.int64).reshape(3, 2), "a": np.asfortranarray(_c((K, D), np.float32))}
    attrs = {"x": 1, "checksum": "ignored"}
    h = hashlib.sha256(json.dumps({"x": 1}, sort_keys=True).encode())
    for name in ("a", "b"):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode() + a.tobytes())
    assert model_store.checksum(attrs, arrays) == h.hexdigest()


def test_write_signed_writes_the_checksum_of_what_it_writes(tmp_path):
    arrays = {"cluster_centers": _c((500, 40), np.float32), "cluster_sizes": np.arange(500, dtype=np.int64)}
    root = str(tmp_path / "g")
    signed = model_store.write_signed(root, arrays, {"y": [1, 2]})
    assert signed == {"y": [1, 2], "checksum": model_store.checksum({"y": [1, 2]}, arrays)}
    with open(tmp_path / "g" / "zarr.json") as f:
        assert json.load(f)["attributes"] == signed
    import zarr

    g = zarr.open_group(root, mode="r")
    for name, a in arrays.items():
        np.testing.assert_array_equal(g[name][...], a)


def test_the_checkpoints_share_the_checksum_and_the_history_check():
    assert checkpoint.checksum is model_store.checksum
    assert checkpoint.history_problem is model_store.history_problem


# Written as a buggy writer would (the checksum matches): each inconsistency named, with the
# value and what it should be.
@pytest.mark.parametrize("centers, attrs, sizes, message", [
    (_c() * np.nan, _attrs(), None, "cluster_centers[0, 0] is nan; every centroid value should be finite"),
    (np.full((K, D), 1e300), _attrs(), None,
     "centroid 0 has a squared norm of inf (values up to 1e+300), above 4.49e+307 (a quarter of the largest "
     "float64): every squared distance to it overflows"),
    (np.full((K, D), 1e19, np.float32), _attrs(dtype="float32"), None,
     "centroid 0 has a squared norm of 2e+38 (values up to 1e+19), above 8.51e+37 (a quarter of the largest float32)"),
    (_c((7, D)), _attrs(), None, "cluster_centers has shape (7, 2); the attributes say n_clusters=3, n_features_in=2"),
    (_c((K, 5)), _attrs(), None, "cluster_centers has shape (3, 5); the attributes say n_clusters=3, n_features_in=2"),
    (_c((D, K)), _attrs(), None, "cluster_centers has shape (2, 3); the attributes say n_clusters=3, n_features_in=2"),
    (_c(dtype=np.int64), _attrs(), None, "cluster_centers have dtype int64, should be float32 or float64"),
    (_c(), _attrs(dtype="float32"), None, "dtype='float32' but cluster_centers are float64"),
    (_c(), _attrs(params={"n_clusters": 0}), None, "params.n_clusters=0 should be an integer >= 1"),
    (_c(), _attrs(params="k=3"), None, "params='k=3' should be a record of the estimator's parameters"),
    (_c(), _attrs(n_features_in="2"), None, "n_features_in='2' should be an integer >= 1"),
    (_c(), _attrs(params={"n_clusters": K, "metric": "manhattan"}), None,
     "params.metric='manhattan' should be one of 'euclidean', 'cosine'"),
    (_c(), _attrs(), np.array([1, 2]), "cluster_sizes (int64, shape (2,)) should be 3 counts (integers >= 0)"),
    (_c(), _attrs(), np.array([1, -2, 3]), "cluster_sizes (int64, shape (3,)) should be 3 counts"),
    (_c(), _attrs(inertia="low"), None, "inertia='low' should be a finite number"),
    (_c(), _attrs(inertia=float("nan")), None, "inertia=nan should be a finite number"),
    (_c(), _attrs(n_iter=-1), None, "n_iter=-1 should be an integer >= 0"),
    (_c(), _attrs(n_samples_fit=0, sample_inertia=1.0), None, "n_samples_fit=0 and sample_inertia=1.0 should be"),
    (_c(), _attrs(history="garbage"), None,
     "its history is 'garbage', should be a list of one record per completed iteration (2)"),
    (_c(), _attrs(history=_hist(3)), None, "its history has 3 entries, should have one per completed iteration (2)"),
    (_c(), _attrs(history=[{"iteration": 1}, *_hist(2)[1:]]), None,
     "history entry 1 should be a record of numbers iteration, inertia, shift, reassigned, n_empty (iteration, "
     "reassigned, n_empty integers >= 0), not {'iteration': 1}"),
    (_c(), _attrs(history=[{**_hist(1)[0], "reassigned": 2.5}, *_hist(2)[1:]]), None,
     "history entry 1 should be a record of numbers"),
    (_c(), _attrs(history=[{**_hist(1)[0], "seconds": "slow"}, *_hist(2)[1:]]), None,
     "history entry 1 should be a record of numbers"),
    (_c(), _attrs(history=_hist(3)[1:]), None, "history entry 1 is numbered 2"),
    (_c(), _attrs(feature_names_in=["a"]), None, "feature_names_in=['a'] should be a list of n_features_in=2 strings"),
    (_c(), _attrs(backend="tpu"), None, "backend='tpu' should be one of 'auto', 'numpy', 'cupy', 'cpu', 'gpu'"),
])
def test_an_inconsistent_model_is_refused(tmp_path, centers, attrs, sizes, message):
    path = str(tmp_path / "m")
    save_model(path, centers, attrs, sizes=sizes)
    with pytest.raises(DataError, match=f"^{path} is damaged: ") as e:
        load_model(path)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_minibatch_model_has_no_history(tmp_path):
    save_model(str(tmp_path / "m"), _c(), _attrs(history=[], n_iter=7))
    assert load_model(str(tmp_path / "m"))[1]["n_iter"] == 7


def test_a_changed_byte_or_attribute_fails_the_checksum(tmp_path):
    path = tmp_path / "m"
    save_model(str(path), _c(), _attrs(), sizes=np.array([1, 1, 1]))
    chunk = path / "cluster_centers" / "c" / "0" / "0"
    good = chunk.read_bytes()
    raw = bytearray(good)
    raw[3] ^= 1
    chunk.write_bytes(bytes(raw))
    message = f"^{path} is damaged: checksum mismatch \\(the model was changed after it was written\\); fit it again$"
    with pytest.raises(DataError, match=message):
        load_model(str(path))
    chunk.write_bytes(good)
    load_model(str(path))
    meta = path / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["inertia"] = 1.0  # still consistent: only the checksum tells
    meta.write_text(json.dumps(doc))
    with pytest.raises(DataError, match=message):
        load_model(str(path))
    del doc["attributes"]["checksum"]
    meta.write_text(json.dumps(doc))
    with pytest.raises(DataError, match="is damaged: it has no checksum"):
        load_model(str(path))


def _write_version_1(path, centers, attrs, sizes=None):
    """A model as daskmeans wrote them before the checksum (format_version 1)."""
    arrays = {"cluster_centers": centers}
    if sizes is not None:
        arrays["cluster_sizes"] = np.asarray(sizes, np.int64)
    model_store.write_group(path, arrays, {"format": "daskmeans-model", "format_version": 1, **attrs})


def test_a_version_1_model_is_read_with_the_consistency_checks(tmp_path):
    """Users keep models of format 1, which have no checksum: read when consistent, refused
    when not."""
    good = str(tmp_path / "v1")
    _write_version_1(good, _c(), _attrs(), [1, 1, 1])
    centers, attrs, sizes = load_model(good)
    assert "checksum" not in attrs and attrs["format_version"] == 1 and sizes.tolist() == [1, 1, 1]
    bad = str(tmp_path / "v1-nan")
    c = _c()
    c[1, 1] = np.nan
    _write_version_1(bad, c, _attrs())
    with pytest.raises(DataError, match=rf"^{bad} is damaged: cluster_centers\[1, 1\] is nan"):
        load_model(bad)


@pytest.mark.parametrize("version, message", [
    (3, "has format_version=3; this daskmeans reads <= 2"),
    ("two", "is damaged: format_version='two' should be an integer from 1 to 2"),
    (None, "is damaged: format_version=None should be an integer from 1 to 2"),
])
def test_format_versions(tmp_path, version, message):
    path = str(tmp_path / "m")
    model_store.write_group(path, {"cluster_centers": _c()}, {"format": "daskmeans-model", "format_version": version,
                                                              **_attrs()})
    with pytest.raises(DataError, match=message):
        load_model(path)
