"""daskmeans in a scikit-learn Pipeline: scale, cluster, and choose K by cross-validation.

    python examples/pipeline.py
"""

import itertools

import numpy as np
from distributed import Client, LocalCluster
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

from daskmeans import KMeans

if __name__ == "__main__":
    rng = np.random.default_rng(0)
    # Three groups, the second feature in other units (x1000): unscaled, it alone decides.
    centres = np.array([[0.0, 0.0], [4.0, 0.0], [2.0, 3.0]])
    X = np.concatenate([rng.normal(c, 0.5, (2_000, 2)) for c in centres]) * [1.0, 1000.0]
    truth = np.repeat(np.arange(3), 2_000)

    with LocalCluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster):
        pipe = Pipeline([("scale", StandardScaler()), ("kmeans", KMeans(n_clusters=3, random_state=0))])
        labels = pipe.fit_predict(X)
        # The same partition as the truth, whatever the cluster numbering.
        agree = max(np.mean(labels == np.array(p)[truth]) for p in itertools.permutations(range(3)))
        print(f"agreement with the true groups {agree:.4f}")

        # score() is -inertia, which more clusters always lower: read where it drops most.
        ks = [1, 2, 3, 4, 5]
        search = GridSearchCV(pipe, {"kmeans__n_clusters": ks}, cv=3).fit(X)
        inertia = -search.cv_results_["mean_test_score"]
        for k, s in zip(ks, inertia):
            print(f"k={k}  held-out inertia {s:10.1f}")
        print("the largest drop in held-out inertia comes with k =", ks[int(np.argmax(-np.diff(inertia))) + 1])
