"""The deploy/ recipes, run for real: deploy/local starts a real scheduler and workers (plain,
then TLS with certificates made here) that the CLI fits, predicts and describes against;
the other recipes pass their real validators (shellcheck, hadolint, the Kubernetes schemas,
the Dask operator's CRD schema); the air-gapped wheelhouse installs with no package index."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml
import zarr

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
ENV.pop("DASK_SCHEDULER_ADDRESS", None)


def sh(*argv, cwd=None, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env or ENV, capture_output=True, text=True,
                          timeout=timeout)


def daskmeans(*argv, cwd, env=None) -> subprocess.CompletedProcess:
    return sh(sys.executable, "-m", "daskmeans", *argv, cwd=cwd, env=env)


def one_line_error(p: subprocess.CompletedProcess, *needles: str) -> str:
    assert p.returncode == 1, (p.returncode, p.stderr)
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("daskmeans: error: ") and "Traceback" not in p.stderr, p.stderr
    for n in needles:
        assert n in last, (n, last)
    return last


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("deploy-data")
    rng = np.random.default_rng(3)
    x = (rng.normal(scale=4, size=(6, 5))[rng.integers(0, 6, 30_000)] + rng.normal(size=(30_000, 5))).astype(np.float32)
    zarr.create_array(str(d / "x.zarr"), data=x, chunks=(4_000, 5))
    np.save(d / "init.npy", x[:6].astype(np.float64))
    return d


class Recipe:
    """deploy/local/start.sh in a directory of its own; stop.sh at the end, checked."""

    def __init__(self, where: Path, *flags: str):
        self.dir = where / "cluster"
        p = sh("bash", DEPLOY / "local" / "start.sh", "--dir", self.dir, "--cpu", "--workers", "2", *flags,
               cwd=where, timeout=240)
        if p.returncode != 0:
            logs = "".join(f.read_text() for f in self.dir.glob("*.log")) if self.dir.exists() else ""
            sh("bash", DEPLOY / "local" / "stop.sh", self.dir)
            raise AssertionError(f"start.sh: rc {p.returncode}\n{p.stdout}\n{p.stderr}\n{logs}")
        self.pids = [int(x) for x in (self.dir / "pids").read_text().split()]
        self.file = self.dir / "scheduler.json"
        self.address = json.loads(self.file.read_text())["address"]

    def group(self) -> list[psutil.Process]:
        """Every live process of the recipe's process groups (workers' children included)."""
        out = []
        for p in psutil.process_iter(["pid"]):
            try:
                if os.getpgid(p.pid) in self.pids and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except (ProcessLookupError, psutil.Error):
                pass
        return out

    def stop(self) -> subprocess.CompletedProcess:
        return sh("bash", DEPLOY / "local" / "stop.sh", self.dir, timeout=60)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    r = Recipe(tmp_path_factory.mktemp("recipe"))
    try:
        yield r
    finally:
        if (r.dir / "pids").exists():
            r.stop()


def _model(path: Path) -> tuple[np.ndarray, dict]:
    g = zarr.open_group(str(path), mode="r")
    return np.asarray(g["cluster_centers"][:]), dict(g.attrs)


def test_local_recipe_fits_predicts_and_describes_bitwise_like_the_local_cluster(recipe, data, tmp_path):
    assert len(recipe.pids) == 3 and recipe.address.startswith("tcp://127.0.0.1:")
    # Relative paths from the data's folder: the workers were started elsewhere.
    p = daskmeans("fit", "x.zarr", "--k", "6", "--init", "init.npy", "--scheduler-file", recipe.file,
                  "-o", tmp_path / "remote.zarr", cwd=data)  # not -q: the line naming the scheduler
    assert p.returncode == 0, p.stderr
    assert f"daskmeans: scheduler {recipe.address}: 2 worker(s) (2 CPU)" in p.stderr
    p = daskmeans("fit", "x.zarr", "--k", "6", "--init", "init.npy", "--workers", "2", "-q",
                  "-o", tmp_path / "local.zarr", cwd=data)
    assert p.returncode == 0, p.stderr
    (c_remote, a_remote), (c_local, a_local) = _model(tmp_path / "remote.zarr"), _model(tmp_path / "local.zarr")
    np.testing.assert_array_equal(c_remote, c_local)
    assert a_remote["inertia"] == a_local["inertia"] and a_remote["n_iter"] == a_local["n_iter"]

    p = daskmeans("predict", tmp_path / "remote.zarr", "x.zarr", "-o", tmp_path / "labels.zarr",
                  "--scheduler", recipe.address, cwd=data)
    assert p.returncode == 0, p.stderr
    labels = zarr.open_group(str(tmp_path / "labels.zarr"), mode="r")["labels"][:]
    x = zarr.open_array(str(data / "x.zarr"), mode="r")[:].astype(np.float64)
    d2 = ((x[:, None, :] - c_remote[None].astype(np.float64)) ** 2).sum(-1)
    assert (labels == d2.argmin(1)).mean() > 0.999  # fp32 kernels: near-ties may differ

    p = daskmeans("info", tmp_path / "remote.zarr", cwd=data)
    assert p.returncode == 0 and "clusters     6  features 5" in p.stdout, p.stdout


def test_two_concurrent_fits_on_one_scheduler_match_their_solo_runs(recipe, data, tmp_path):
    runs = {"a": ["--k", "6", "--init", "init.npy"], "b": ["--k", "9", "--seed", "3", "--init", "k-means||"]}

    def argv(name, out):
        return [sys.executable, "-m", "daskmeans", "fit", "x.zarr", *runs[name], "--scheduler-file", str(recipe.file),
                "-q", "-o", str(out)]

    for name in runs:
        p = sh(*argv(name, tmp_path / f"solo-{name}.zarr"), cwd=data)
        assert p.returncode == 0, p.stderr
    procs = {name: subprocess.Popen(argv(name, tmp_path / f"both-{name}.zarr"), cwd=data, env=ENV,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for name in runs}
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    for name in runs:
        (c1, a1), (c2, a2) = _model(tmp_path / f"solo-{name}.zarr"), _model(tmp_path / f"both-{name}.zarr")
        np.testing.assert_array_equal(c2, c1)
        assert a2["inertia"] == a1["inertia"] and a2["n_iter"] == a1["n_iter"]


def test_scheduler_address_from_the_environment(recipe, data, tmp_path):
    env = {**ENV, "DASK_SCHEDULER_ADDRESS": recipe.address}
    p = daskmeans("fit", "x.zarr", "--k", "6", "--init", "init.npy", "-o", tmp_path / "m.zarr", cwd=data, env=env)
    assert p.returncode == 0 and f"scheduler {recipe.address}: 2 worker(s)" in p.stderr, p.stderr
    p = daskmeans("fit", "x.zarr", "--k", "6", "--workers", "3", "-o", tmp_path / "n.zarr", cwd=data, env=env)
    one_line_error(p, "--workers 3 applies to a local cluster only", "(DASK_SCHEDULER_ADDRESS)")
    assert not (tmp_path / "n.zarr").exists()


def test_cluster_option_errors_are_one_line(recipe, data, tmp_path):
    p = daskmeans("fit", "x.zarr", "--k", "6", "--scheduler-file", tmp_path / "none.json", "-o", tmp_path / "m.zarr",
                  cwd=data)
    one_line_error(p, f"scheduler file {tmp_path / 'none.json'} does not exist")
    p = daskmeans("fit", "x.zarr", "--k", "6", "--scheduler", recipe.address, "--scheduler-file", recipe.file,
                  "-o", tmp_path / "m.zarr", cwd=data)
    one_line_error(p, "give --scheduler or --scheduler-file, not both")
    p = daskmeans("fit", "x.zarr", "--k", "6", "--scheduler", recipe.address, "--tls-cert", "c.pem",
                  "-o", tmp_path / "m.zarr", cwd=data)
    one_line_error(p, "TLS needs --tls-ca-file, --tls-cert and --tls-key together; missing --tls-ca-file, --tls-key")
    assert not (tmp_path / "m.zarr").exists()


def test_chunk_bytes_smaller_than_the_store_is_a_warning(recipe, data, tmp_path):
    p = daskmeans("fit", "x.zarr", "--k", "6", "--init", "init.npy", "--scheduler", recipe.address, "-q",
                  "--chunk-bytes", "1KiB", "-o", tmp_path / "m.zarr", cwd=data)
    assert p.returncode == 0, p.stderr
    assert ("daskmeans: warning: chunk_bytes=1024 (--chunk-bytes) is smaller than a chunk of "
            f"{data / 'x.zarr'} (4000 rows x 5 x 4 bytes = 80000 bytes): its own chunks (4000 rows) are used") in p.stderr


class _Cluster:
    """The one call :func:`daskmeans.dask_cluster.worker_kinds` makes, on a cluster of GPU and CPU
    workers (a CPU-only host cannot start GPU workers): its probe answered as each worker's
    daskmeans (the client's version) would, with whether it has a GPU."""

    def __init__(self, kinds: dict[str, bool]):
        self.kinds = kinds

    def run(self, fn, *args):
        from daskmeans import __version__

        return {w: {"version": __version__, "result": gpu} for w, gpu in self.kinds.items()}


def test_a_cluster_of_gpu_and_cpu_workers_needs_a_backend():
    from daskmeans import DaskmeansError
    from daskmeans.dask_cluster import resolve_backend

    mixed = _Cluster({"tcp://10.0.0.1:1": True, "tcp://10.0.0.2:1": False, "tcp://10.0.0.3:1": True})
    with pytest.raises(DaskmeansError, match=r"the cluster mixes 2 GPU worker\(s\) and 1 CPU worker\(s\) "
                                             r"\(e\.g\. tcp://10\.0\.0\.2:1\): choose backend='cpu' \(--backend cpu\)"):
        resolve_backend(mixed, "auto")
    assert resolve_backend(mixed, "cpu") == "numpy"
    with pytest.raises(DaskmeansError, match=r"backend='gpu' but 1 of the cluster's 3 workers have no usable GPU"):
        resolve_backend(mixed, "gpu")
    assert resolve_backend(_Cluster({"a": True, "b": True}), "auto") == "cupy"
    assert resolve_backend(_Cluster({"a": False}), "auto") == "numpy"


def test_stop_leaves_no_process_behind(tmp_path):
    r = Recipe(tmp_path)
    procs = r.group()
    assert len(procs) >= 3  # the scheduler, and each worker's nanny and worker process
    p = r.stop()
    assert p.returncode == 0, p.stderr
    psutil.wait_procs(procs, timeout=10)
    assert r.group() == [] and not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs)
    assert not (r.dir / "pids").exists()
    # Only its own processes: a second stop finds nothing to stop.
    p = r.stop()
    assert p.returncode == 1 and "nothing started there" in p.stderr


# ----------------------------------------------------------------------------- TLS


def _certificates(d: Path, name: str) -> tuple[Path, Path, Path]:
    """A certificate authority and one certificate it signed (for 127.0.0.1), as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    import ipaddress

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "daskmeans")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    d.mkdir(parents=True, exist_ok=True)
    paths = d / f"{name}-ca.pem", d / f"{name}-cert.pem", d / f"{name}-key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def test_tls_cluster_fits_with_certificates_and_refuses_clients_without(data, tmp_path):
    ca, cert, key = _certificates(tmp_path / "pki", "site")
    tls = ["--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", key]
    r = Recipe(tmp_path, *map(str, tls))
    try:
        assert r.address.startswith("tls://127.0.0.1:")
        p = daskmeans("fit", "x.zarr", "--k", "6", "--init", "init.npy", "--scheduler-file", r.file, *tls, "-q",
                      "-o", tmp_path / "m.zarr", cwd=data)
        assert p.returncode == 0, p.stderr
        assert _model(tmp_path / "m.zarr")[0].shape == (6, 5)

        p = daskmeans("fit", "x.zarr", "--k", "6", "--scheduler", r.address, "-o", tmp_path / "n.zarr", cwd=data)
        one_line_error(p, f"scheduler {r.address} (from --scheduler) uses TLS: give the client's certificates")
        # Certificates of another authority: the scheduler refuses the handshake.
        other = _certificates(tmp_path / "pki", "other")
        p = daskmeans("fit", "x.zarr", "--k", "6", "--scheduler", r.address, "--tls-ca-file", other[0],
                      "--tls-cert", other[1], "--tls-key", other[2], "-o", tmp_path / "n.zarr", cwd=data)
        one_line_error(p, f"cannot connect to scheduler {r.address} (from --scheduler)")
        assert not (tmp_path / "n.zarr").exists()
    finally:
        assert r.stop().returncode == 0
    assert r.group() == []


# ------------------------------------------------------------------ real validators


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(BIN)) or shutil.which(name)
    assert path, f"{name} is installed with the test extras"
    return path


def _scripts() -> list[Path]:
    return sorted([*DEPLOY.rglob("*.sh"), *DEPLOY.rglob("*.sbatch"), ROOT / ".ci" / "run"])


def test_shell_scripts_pass_shellcheck(tmp_path):
    assert len(_scripts()) >= 6
    p = sh(_tool("shellcheck"), *_scripts())
    assert p.returncode == 0, p.stdout + p.stderr
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/usr/bin/env bash\nrm -rf $1/*\n")
    assert sh(_tool("shellcheck"), bad).returncode != 0  # the checker does check


def test_dockerfile_passes_hadolint(tmp_path):
    p = sh(_tool("hadolint"), DEPLOY / "docker" / "Dockerfile")
    assert p.returncode == 0, p.stdout + p.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get install curl\n")
    assert sh(_tool("hadolint"), bad).returncode != 0


def _pods(cluster: dict) -> list[dict]:
    """The DaskCluster's scheduler and worker pod specs as Pods, for the core schema."""
    return [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"daskmeans-{part}"},
             "spec": cluster["spec"][part]["spec"]} for part in ("scheduler", "worker")]


def test_kubernetes_core_kinds_pass_the_kubernetes_schemas(tmp_path):
    cluster = yaml.safe_load((DEPLOY / "kubernetes" / "daskcluster.yaml").read_text())
    pods = tmp_path / "pods.yaml"
    pods.write_text(yaml.safe_dump_all(_pods(cluster)))
    p = sh(_tool("kubernetes-validate"), "--strict", DEPLOY / "kubernetes" / "job.yaml", pods)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("passed") == 4, p.stdout  # PVC, Job, and the two pod specs
    worker = cluster["spec"]["worker"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "1"
    bad = tmp_path / "bad.yaml"
    job = next(d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "job.yaml").read_text()) if d["kind"] == "Job")
    job["spec"]["template"]["spec"]["containers"][0]["comand"] = ["daskmeans"]  # a typo
    bad.write_text(yaml.safe_dump(job))
    assert sh(_tool("kubernetes-validate"), "--strict", bad).returncode != 0


def test_daskcluster_passes_the_dask_operators_crd_schema(tmp_path):
    import dask_kubernetes

    # The Helm chart's copy: the CRD as installed, its $refs resolved.
    crd_file = (Path(dask_kubernetes.__file__).parent / "operator" / "deployment" / "helm" / "dask-kubernetes-operator"
                / "crds" / "daskcluster.yaml")
    crd = yaml.safe_load(crd_file.read_text())
    assert crd["spec"]["names"]["kind"] == "DaskCluster"
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = tmp_path / "daskcluster.schema.json"
    schema.write_text(json.dumps(version["schema"]["openAPIV3Schema"]))
    manifest = DEPLOY / "kubernetes" / "daskcluster.yaml"
    assert yaml.safe_load(manifest.read_text())["apiVersion"] == f"{crd['spec']['group']}/v1"
    p = sh(_tool("check-jsonschema"), "--schemafile", schema, manifest)
    assert p.returncode == 0, p.stdout + p.stderr
    bad = tmp_path / "bad.yaml"
    doc = yaml.safe_load(manifest.read_text())
    doc["spec"]["worker"]["replicas"] = "two"
    bad.write_text(yaml.safe_dump(doc))
    assert sh(_tool("check-jsonschema"), "--schemafile", schema, bad).returncode != 0


# ------------------------------------------------------------------ air-gapped install


@pytest.mark.slow
def test_airgapped_wheelhouse_installs_with_no_index(tmp_path):
    wheels = tmp_path / "wheelhouse"
    p = sh("bash", DEPLOY / "airgap" / "build-wheelhouse.sh", wheels, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    assert list(wheels.glob("daskmeans-*.whl")) and list(wheels.glob("distributed-*.whl"))
    venv = tmp_path / "venv"
    assert sh(sys.executable, "-m", "venv", venv).returncode == 0
    env = {**ENV, "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", "PIP_INDEX_URL": "http://127.0.0.1:9/"}
    env.pop("PYTHONPATH", None)
    p = sh("bash", DEPLOY / "airgap" / "install.sh", wheels, env=env, timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "daskmeans 0.1.0" in p.stdout
    p = sh(venv / "bin" / "python", "-c", "import daskmeans, distributed, zarr; print(daskmeans.__file__)", env=env,
           cwd=tmp_path)
    assert p.returncode == 0 and str(venv) in p.stdout, p.stdout + p.stderr
