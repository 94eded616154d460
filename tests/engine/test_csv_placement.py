"""A CSV file placed through the workers' reading pipeline (its rows parsed straight into the
blocks each shard keeps, nothing persisted) fits bitwise as the persisted blocks of the same
rows do, in every tier; the files the pipeline cannot take (compressed) go the persisted way,
and what the reader says of the columns (identifiers, other columns, NA cells) is unchanged."""

from __future__ import annotations

import gzip
import os

import dask
import numpy as np
import pytest

from daskmeans import KMeans
from daskmeans.engine.placement import place
from daskmeans.errors import DataError
from daskmeans.io import csv_reader, readers
from daskmeans.io.blocks import rows_of, split_rows

N, D, K = 3000, 5, 4


@pytest.fixture(scope="module")
def csv_files(tmp_path_factory):
    """A CSV of an ``id`` column (integers: an identifier) and D features (float32 rows written
    exactly), plain and gzipped, with a cell the compiled parser hands to the other parsers (a
    leading space: pandas reads it); and the same file with an NA cell."""
    d = tmp_path_factory.mktemp("csvplace")
    rng = np.random.default_rng(7)
    centres = rng.standard_normal((K, D)) * 4
    x = (centres[rng.integers(0, K, N)] + rng.standard_normal((N, D))).astype(np.float32)
    lines = [",".join([str(i)] + [f"{v:.9g}" for v in row]) for i, row in enumerate(x)]
    lines[1234] = lines[1234].replace(",", ", ", 1)  # ' 1.5': pandas reads it, the others refuse
    text = "id," + ",".join(f"f{j}" for j in range(D)) + "\n" + "\n".join(lines) + "\n"
    (d / "x.csv").write_text(text)
    with gzip.open(d / "x.csv.gz", "wt") as f:
        f.write(text)
    na = text.replace(lines[2500], lines[2500].rsplit(",", 1)[0] + ",NA")
    (d / "na.csv").write_text(na)
    return d, x


def _persisted(X):
    """The same rows as a derived array (no RowSource): placed by persisting its blocks."""
    y = X.map_blocks(lambda b: b, dtype=X.dtype)
    assert rows_of(y) is None and readers.file_of(y) == readers.file_of(X)
    return y


@pytest.mark.parametrize("tier", ["host", "storage"])  # the device tier is GPU workers' (tests/gpu)
@pytest.mark.parametrize("chunk_bytes", [20_000, 10**7])
def test_csv_fit_through_the_pipeline_is_the_persisted_fit(client, csv_files, tier, chunk_bytes):
    d, x = csv_files
    with dask.config.set({"daskmeans.chunk-bytes": chunk_bytes}):
        table = readers.read_table(str(d / "x.csv"), drop_columns="id")
    assert rows_of(table.array) is not None and table.rows is not None  # the pipeline's source
    np.testing.assert_array_equal(table.array.compute(), x)
    a = KMeans(K, init=x[:K], n_init=1, max_iter=30, tol=0, tier=tier).fit(table)
    b = KMeans(K, init=x[:K], n_init=1, max_iter=30, tol=0, tier=tier).fit(_persisted(table.array))
    assert a.n_iter_ == b.n_iter_
    assert a.cluster_centers_.dtype == b.cluster_centers_.dtype
    assert a.cluster_centers_.tobytes() == b.cluster_centers_.tobytes()
    np.testing.assert_array_equal(np.asarray(a.labels_), np.asarray(b.labels_))
    assert list(a.feature_names_in_) == [f"f{j}" for j in range(D)]


def test_csv_placement_parses_into_the_kept_blocks(client, csv_files):
    """The shards' blocks are the file's rows, with nothing persisted of them (no block of the
    reader's array computed: each shard's task parsed its rows)."""
    d, x = csv_files
    X = split_rows(readers.read(str(d / "x.csv"), drop_columns="id", chunk_bytes=20_000), 700)
    assert rows_of(X) is not None and X.numblocks[0] == 5
    p = place(client, X, "numpy", tier="host", balance=False, source=str(d / "x.csv"))
    got = client.gather([client.submit(lambda s: [np.asarray(b).copy() for b in s.blocks], s, pure=False)
                         for s in p.shards])
    by_chunk = {}
    for ids, blocks in zip(p.chunk_ids, got):
        by_chunk.update(zip(ids, blocks))
    np.testing.assert_array_equal(np.concatenate([by_chunk[i] for i in range(X.numblocks[0])]), x)
    assert not any(k.startswith("daskmeans-data") for w in p.workers for k in client.has_what().get(w, ()))


def test_compressed_csv_goes_the_persisted_way(client, csv_files):
    """A compressed file's rows are read only by decompressing it from its start: no RowSource,
    its blocks persisted; the fit is the plain file's."""
    d, x = csv_files
    gz = readers.read_table(str(d / "x.csv.gz"), drop_columns="id")
    assert gz.rows is None and rows_of(gz.array) is None and csv_reader.csv_rows_of(gz.array) is not None
    plain = readers.read_table(str(d / "x.csv"), drop_columns="id")
    a, b = KMeans(K, init=x[:K], n_init=1, max_iter=30, tol=0).fit(gz), \
        KMeans(K, init=x[:K], n_init=1, max_iter=30, tol=0).fit(plain)
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    np.testing.assert_array_equal(np.asarray(a.labels_), np.asarray(b.labels_))


def test_csv_identifier_and_na_as_before(client, csv_files):
    """The identifier column is refused by a fit on either path, selected it is a feature; an
    NA cell (pyarrow's parse, NaN) is refused by the fit with the same message either way."""
    d, x = csv_files
    table = readers.read_table(str(d / "x.csv"))
    assert table.identifier_error is not None and "looks like an identifier" in table.identifier_error
    with pytest.raises(DataError, match="looks like an identifier"):
        KMeans(K, init=np.zeros((K, D + 1)), n_init=1).fit(table)
    chosen = readers.read_table(str(d / "x.csv"), columns=["id"] + [f"f{j}" for j in range(D)])
    assert chosen.identifier_error is None and chosen.rows is not None
    init = np.c_[np.arange(K), x[:K]].astype(np.float32)
    a = KMeans(K, init=init, n_init=1, max_iter=10, tol=0).fit(chosen)
    b = KMeans(K, init=init, n_init=1, max_iter=10, tol=0).fit(_persisted(chosen.array))
    np.testing.assert_array_equal(a.cluster_centers_, b.cluster_centers_)
    na = readers.read_table(str(d / "na.csv"), drop_columns="id")
    assert na.rows is not None
    errors = []
    for X in (na, _persisted(na.array)):
        with pytest.raises(DataError, match="NaN") as e:
            KMeans(K, init=x[:K], n_init=1, max_iter=5).fit(X)
        errors.append(str(e.value))
    assert errors[0] == errors[1]


def test_csv_other_columns_beside_the_labels(client, csv_files, tmp_path):
    """The id column written beside the labels of a fit placed through the pipeline: the
    file's ids, in row order, with the persisted fit's labels."""
    from daskmeans.io.labels import labels_output, write_labels

    d, x = csv_files
    table = readers.read_table(str(d / "x.csv"), drop_columns="id", chunk_bytes=20_000)
    a = KMeans(K, init=x[:K], n_init=1, max_iter=30, tol=0).fit(table)
    b = KMeans(K, init=x[:K], n_init=1, max_iter=30, tol=0).fit(_persisted(table.array))
    out = str(tmp_path / "labels.csv")
    write_labels(a.labels_, labels_output(out, ["id"], table))
    got = np.loadtxt(out, delimiter=",", skiprows=1, dtype=np.int64)
    np.testing.assert_array_equal(got[:, 0], np.arange(N))
    np.testing.assert_array_equal(got[:, 1], np.asarray(b.labels_))
    assert os.path.getsize(out) > 0


@pytest.mark.parametrize("init", ["k-means||", "random"])
def test_csv_storage_tier_draws_rows_by_their_pieces(client, csv_files, init, monkeypatch):
    """The inits' draws in the storage tier read chosen rows with the file's pieces that hold
    them alone (``RowSource.bounds``): the persisted fit's centroids, and no whole chunk read."""
    d, x = csv_files
    monkeypatch.setattr(csv_reader, "_PIECE_BYTES", 4000)  # many pieces per chunk
    table = readers.read_table(str(d / "x.csv"), drop_columns="id", chunk_bytes=60_000)
    assert len(table.rows.bounds) > 3 * table.array.numblocks[0]
    a = KMeans(K, init=init, n_init=1, max_iter=30, tol=0, tier="storage", random_state=0).fit(table)
    b = KMeans(K, init=init, n_init=1, max_iter=30, tol=0, tier="storage", random_state=0).fit(
        _persisted(table.array))
    assert a.cluster_centers_.tobytes() == b.cluster_centers_.tobytes()
    np.testing.assert_array_equal(np.asarray(a.labels_), np.asarray(b.labels_))
    src = table.rows
    picks = np.array([0, 5, 900, 901, 2999])
    np.testing.assert_array_equal(src.chunk(0, N).read_rows(picks), x[picks])
    np.testing.assert_array_equal(src.chunk(850, 2000).read_rows(np.array([0, 50, 1149])), x[[850, 900, 1999]])
