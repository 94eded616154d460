"""The command's options of the parameter records' fields derive from the records
(``daskmeans.params.options``): each parser default is the record's (or the command's
documented override), its choices the record's or the registry's, and a value the field's
constraint refuses is a one-line usage error naming the option, the value and the requirement
(the estimator refuses the same value)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from daskmeans import KMeans, backends, seeding
from daskmeans.cli import common, main
from daskmeans.cli.main import parser as command_parser
from daskmeans.errors import InvalidParameterError
from daskmeans.options import METRICS, PRECISIONS, TIERS
from daskmeans.params import BACKENDS, KMeansParams, RunParams, defaults, spec_of
from daskmeans.validation import RandomStateLike

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
FIT = ["fit", "x.npy", "--k", "3"]
SWEEP = ["sweep", "x.npy", "--k", "2,3"]
FIELD = object()  # the record's default

# (subcommand, dest, record, field, the command's default: FIELD, or its documented override)
OPTIONS = [
    ("fit", "init", KMeansParams, "init", FIELD),
    ("fit", "n_init", KMeansParams, "n_init", 1),  # one run; KMeans's "auto" is scikit-learn's rule
    ("fit", "max_iter", KMeansParams, "max_iter", FIELD),
    ("fit", "tol", KMeansParams, "tol", FIELD),
    ("fit", "seed", KMeansParams, "random_state", FIELD),
    ("fit", "metric", KMeansParams, "metric", FIELD),
    ("fit", "precision", KMeansParams, "precision", FIELD),
    ("fit", "max_samples_per_cluster", KMeansParams, "max_samples_per_cluster", FIELD),
    ("fit", "max_imbalance", KMeansParams, "max_imbalance", FIELD),
    ("fit", "algorithm", KMeansParams, "algorithm", FIELD),
    ("fit", "tier", RunParams, "tier", FIELD),
    ("fit", "memory_limit", RunParams, "memory_limit", FIELD),
    ("fit", "device_memory_limit", RunParams, "device_memory_limit", FIELD),
    ("fit", "checkpoint", RunParams, "checkpoint", FIELD),
    ("fit", "checkpoint_every", RunParams, "checkpoint_every", FIELD),
    ("fit", "backend", RunParams, "backend", FIELD),
    ("fit", "collective", RunParams, "collective", FIELD),
    ("sweep", "init", KMeansParams, "init", FIELD),
    ("sweep", "n_init", KMeansParams, "n_init", 1),  # as fit's
    ("sweep", "max_iter", KMeansParams, "max_iter", FIELD),
    ("sweep", "seed", KMeansParams, "random_state", 0),  # the sweep's sample is drawn from it: reproducible
    ("sweep", "backend", RunParams, "backend", FIELD),
    ("sweep", "collective", RunParams, "collective", FIELD),
]


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    for a in command_parser()._actions:  # argparse has no public listing of a parser's options
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    raise AssertionError("the command has no subcommands")


def _option(command: str, dest: str) -> argparse.Action:
    return next(a for a in _subparsers()[command]._actions if a.dest == dest and a.option_strings)


@pytest.mark.parametrize("command, dest, record, name, override", OPTIONS,
                         ids=[f"{c} {d}" for c, d, *_ in OPTIONS])
def test_an_options_default_is_the_records_or_the_documented_override(command, dest, record, name, override):
    action = _option(command, dest)
    want = defaults(record)[name] if override is FIELD else override
    assert action.default == want
    if override is not FIELD:  # an override differs on purpose, and says so in the help
        assert override != defaults(record)[name] and f"(default {override})" in action.help


def test_the_records_defaults_are_the_registries():
    assert defaults(KMeansParams)["init"] == seeding.DEFAULT
    assert defaults(RunParams)["backend"] in backends.choices()


@pytest.mark.parametrize("command, dest, want", [
    ("fit", "metric", METRICS),
    ("fit", "precision", PRECISIONS),
    ("fit", "tier", tuple(TIERS)),
    ("fit", "backend", backends.choices()),
    ("sweep", "backend", backends.choices()),
    # Registries read only once the option is given (an init may also be a .npy file; the
    # collectives' module loads Dask): no argparse choices.
    ("fit", "init", None),
    ("fit", "collective", None),
])
def test_an_options_choices_are_the_records_and_the_registries(command, dest, want):
    assert (None if _option(command, dest).choices is None else tuple(_option(command, dest).choices)) == want


def test_the_backends_light_lists_are_the_registrys():
    """``import daskmeans.backends`` loads NumPy, and ``--help`` loads none: the command's
    choices are params' light copies of the registry's, kept equal here."""
    assert spec_of(RunParams, "backend").choices == backends.choices()
    assert BACKENDS == backends.names()
    row = next(line for line in README.splitlines() if line.startswith("| `--backend "))
    assert tuple(re.search(r"\{([^}]*)\}", row).group(1).split(",")) == backends.choices()


def test_the_estimators_docstring_lists_the_registries():
    doc = KMeans.__doc__
    listed = lambda names: "{" + ", ".join(f'"{n}"' for n in names) + "}"  # noqa: E731
    assert f"    backend : {listed(backends.choices())}\n" in doc
    assert f"    init : {listed(seeding.names())}, callable" in doc


def test_fit_help_lists_the_backends_registry(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    assert "--backend {" + ",".join(backends.choices()) + "}" in capsys.readouterr().out


# (argv, flag, the estimator's parameter, a refused value as typed, the same value as Python)
REFUSED = [
    (FIT, "--n-init", "n_init", "0", 0),
    (FIT, "--max-iter", "max_iter", "0", 0),
    (FIT, "--tol", "tol", "-0.5", -0.5),
    (FIT, "--seed", "random_state", "4294967296", 2**32),
    (FIT, "--seed", "random_state", "-1", -1),
    (FIT, "--max-samples-per-cluster", "max_samples_per_cluster", "0", 0),
    (FIT, "--max-imbalance", "max_imbalance", "1", 1.0),
    (FIT, "--memory-limit", "memory_limit", "0", "0"),
    (FIT, "--device-memory-limit", "device_memory_limit", "lots", "lots"),
    (FIT, "--checkpoint-every", "checkpoint_every", "0", 0),
    (["fit", "x.npy"], "--k", "n_clusters", "0", 0),
    (SWEEP, "--n-init", "n_init", "-1", -1),
    (SWEEP, "--max-iter", "max_iter", "0", 0),
    (SWEEP, "--seed", "random_state", "-3", -3),
]


@pytest.mark.parametrize("argv, flag, name, typed, value", REFUSED, ids=[f"{a[0]} {f} {t}" for a, f, _, t, _ in REFUSED])
def test_a_value_the_field_refuses_is_the_constraints_usage_error(tmp_path, monkeypatch, capsys, argv, flag, name,
                                                                  typed, value):
    with pytest.raises(InvalidParameterError, match=f"^{name}="):  # the estimator's check of the same value
        KMeans(**{name: value}).check_params()
    record = KMeansParams if name in KMeansParams.__dataclass_fields__ else RunParams
    need = common.requirement(spec_of(record, name).constraint)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        main([*argv, flag, typed])
    assert e.value.code == 2
    command = argv[0]
    assert capsys.readouterr().err == (f"daskmeans {command}: error: {flag} {typed}: should be {need} "
                                       f"(see daskmeans {command} --help)\n")


@pytest.mark.parametrize("name, need", [
    ("n_clusters", "an integer >= 1"),
    ("n_init", "an integer >= 1"),  # the command counts runs: no "auto"
    ("tol", "a finite number >= 0"),
    ("random_state", "an integer from 0 to 4294967295"),
    ("max_imbalance", "a finite number > 1"),
    ("memory_limit", "a size > 0 such as 512MiB or auto"),
    ("checkpoint", "a non-empty path"),
])
def test_the_requirement_is_read_from_the_constraint(name, need):
    record = KMeansParams if name in KMeansParams.__dataclass_fields__ else RunParams
    assert common.requirement(spec_of(record, name).constraint) == need


def test_the_command_seed_range_is_random_states():
    """``--seed`` is checked without NumPy against ``common.SEED``: the integer seeds
    ``RandomStateLike`` takes, bound for bound."""
    for seed in (common.SEED.low, common.SEED.high):
        RandomStateLike().check("random_state", seed)
        common.SEED.check("--seed", seed)
    for seed in (common.SEED.low - 1, common.SEED.high + 1):
        with pytest.raises(InvalidParameterError):
            RandomStateLike().check("random_state", seed)
        with pytest.raises(InvalidParameterError):
            common.SEED.check("--seed", seed)


def test_accepted_values_reach_the_namespace_as_the_estimator_takes_them():
    args = command_parser().parse_args(FIT + ["--max-imbalance", "1.5", "--memory-limit", "auto", "--seed",
                                              "4294967295", "--checkpoint", "c.zarr", "--max-iter", "7"])
    assert (args.max_imbalance, args.memory_limit, args.seed, args.checkpoint, args.max_iter) == \
           (1.5, "auto", 2**32 - 1, "c.zarr", 7)
    KMeans(3, max_imbalance=args.max_imbalance, memory_limit=args.memory_limit, random_state=args.seed,
           checkpoint=args.checkpoint, max_iter=args.max_iter, n_init=args.n_init).check_params()


def test_the_sweeps_seed_default_is_the_api_sweeps():
    import inspect

    from daskmeans.sweep import sweep

    assert _option("sweep", "seed").default == inspect.signature(sweep).parameters["random_state"].default
