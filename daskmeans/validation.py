"""Declarative parameter constraints and the checks that produce uniform error messages.

Messages state the value and the requirement, e.g. ``n_samples=10 should be >= n_clusters=11``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .errors import DataError, InvalidParameterError


@dataclass(frozen=True)
class Interval:
    """A numeric range; ``integer`` requires an integral value."""

    low: float | None = None
    high: float | None = None
    closed: str = "both"  # "both", "left", "right", "neither"
    integer: bool = False

    def check(self, name: str, value: Any) -> None:
        kind = numbers.Integral if self.integer else numbers.Real
        if isinstance(value, bool) or not isinstance(value, kind):
            what = "an integer" if self.integer else "a real number"
            raise InvalidParameterError(f"{name}={value!r} should be {what}")
        if self.low is not None:
            if self.closed in ("both", "left") and not value >= self.low:
                raise InvalidParameterError(f"{name}={value!r} should be >= {self.low}")
            if self.closed in ("right", "neither") and not value > self.low:
                raise InvalidParameterError(f"{name}={value!r} should be > {self.low}")
        if self.high is not None:
            if self.closed in ("both", "right") and not value <= self.high:
                raise InvalidParameterError(f"{name}={value!r} should be <= {self.high}")
            if self.closed in ("left", "neither") and not value < self.high:
                raise InvalidParameterError(f"{name}={value!r} should be < {self.high}")


@dataclass(frozen=True)
class Options:
    """One of a set of strings: fixed, or a registry's at the time of the check (a callable
    returning them, so that an entry registered later is accepted)."""

    values: tuple[str, ...] | Callable[[], tuple[str, ...]]

    def check(self, name: str, value: Any) -> None:
        values = self.values() if callable(self.values) else self.values
        if not isinstance(value, str) or value not in values:
            allowed = ", ".join(repr(v) for v in values)
            raise InvalidParameterError(f"{name}={value!r} should be one of {allowed}")


class ArrayLike:
    """Anything with ``shape`` and ``dtype`` (a NumPy, CuPy or Dask array) or a ``.npy`` path."""

    def check(self, name: str, value: Any) -> None:
        if isinstance(value, str) and value.endswith(".npy") or hasattr(value, "shape"):
            return
        raise InvalidParameterError(
            f"{name}={value!r} should be an array of shape (n_clusters, n_features) or a .npy path"
            if isinstance(value, str) else
            f"{name} should be an array of shape (n_clusters, n_features) or a .npy path, got {type(value).__name__}"
        )


class PathLike:
    """A file system path (str or os.PathLike)."""

    def check(self, name: str, value: Any) -> None:
        import os

        if not isinstance(value, (str, os.PathLike)):
            raise InvalidParameterError(f"{name} should be a path, got {type(value).__name__}")


class ByteSize:
    """A positive number of bytes, a size string ("4GiB"), or "auto"."""

    def check(self, name: str, value: Any) -> None:
        if isinstance(value, str):
            if value.strip().lower() == "auto":
                return
            from dask.utils import parse_bytes

            try:
                ok = parse_bytes(value) > 0
            except ValueError:
                ok = False
        else:
            ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and value > 0
        if not ok:
            raise InvalidParameterError(f"{name}={value!r} should be a size such as '4GiB' or a number of bytes > 0")


class RandomStateLike:
    """An integer seed in [0, 2**32 - 1], a ``numpy.random.Generator`` or a ``RandomState``."""

    def check(self, name: str, value: Any) -> None:
        import numpy as np

        if isinstance(value, (np.random.Generator, np.random.RandomState)):
            return
        Interval(0, 2**32 - 1, integer=True).check(name, value)


def seed_of(random_state: Any) -> int | None:
    """An integer seed for ``random_state`` (a Generator or RandomState gives its next draw,
    as scikit-learn consumes them)."""
    import numpy as np

    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(0, 2**32))
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(0, 2**32, dtype=np.uint64))
    return random_state


class NoneOr:
    def __init__(self, inner: Any):
        self.inner = inner

    def check(self, name: str, value: Any) -> None:
        if value is not None:
            self.inner.check(name, value)


class AnyOf:
    def __init__(self, *options: Any):
        self.options = options

    def check(self, name: str, value: Any) -> None:
        errors = []
        for opt in self.options:
            try:
                opt.check(name, value)
                return
            except InvalidParameterError as e:
                errors.append(str(e).split(" should ", 1)[-1])
        raise InvalidParameterError(f"{name}={value!r} should " + " or ".join(errors))


class Verbose:
    """``verbose``: True, False, or an integer >= 0 (scikit-learn's)."""

    def check(self, name: str, value: Any) -> None:
        import numpy as np  # here, not at import: the module stays light for --help

        if isinstance(value, (bool, np.bool_)):
            return
        if not isinstance(value, numbers.Integral) or value < 0:
            raise InvalidParameterError(f"{name}={value!r} should be True, False or an integer >= 0")


class NInit:
    """``n_init``: ``"auto"`` or an integer >= 1."""

    def check(self, name: str, value: Any) -> None:
        if isinstance(value, str) and value == "auto":
            return
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise InvalidParameterError(f"{name}={value!r} should be an integer >= 1 or 'auto'")
        if value < 1:
            raise InvalidParameterError(f"{name}={value!r} should be >= 1 (or 'auto')")


class Boolean:
    """``True`` or ``False`` (NumPy's booleans too)."""

    def check(self, name: str, value: Any) -> None:
        import numpy as np

        if not isinstance(value, (bool, np.bool_)):
            raise InvalidParameterError(f"{name}={value!r} should be True or False")


class InitLike:
    """An init other than a name: an array-like of centres (an array, a list of rows), a
    ``.npy`` path, or a callable ``init(X, n_clusters, random_state)``."""

    def check(self, name: str, value: Any) -> None:
        import os

        if callable(value) or isinstance(value, os.PathLike) or (isinstance(value, str) and value.endswith(".npy")):
            return
        if is_array_like(value):
            return
        shown = f"{name}={value!r}" if isinstance(value, (str, numbers.Number)) else f"{name} ({type(value).__name__})"
        raise InvalidParameterError(f"{shown} should be an array-like of shape (n_clusters, n_features), a .npy path "
                                    f"or a callable init(X, n_clusters, random_state)")


def is_array_like(value: Any) -> bool:
    """scikit-learn's ``_is_arraylike_not_scalar``: an array, a list of rows, anything with
    ``__array__``, ``shape`` or a length that is not a string."""
    import numpy as np

    if isinstance(value, (str, bytes)) or np.isscalar(value):
        return False
    return hasattr(value, "__len__") or hasattr(value, "shape") or hasattr(value, "__array__")


def validate_params(params: dict[str, Any], constraints: dict[str, Any]) -> None:
    """Check each parameter against its constraint; raise on the first violation."""
    for name, constraint in constraints.items():
        constraint.check(name, params[name])


def check_n_clusters(n_samples: int, n_clusters: int) -> None:
    if n_samples < n_clusters:
        raise DataError(f"n_samples={n_samples} should be >= n_clusters={n_clusters}")


def check_2d_numeric(shape: Iterable[int], dtype: Any, name: str = "X") -> None:
    """Data must be 2-D and numeric (bool and complex are refused)."""
    import numpy as np

    shape = tuple(shape)
    if len(shape) != 2:
        raise DataError(f"{name} should be 2-D (n_samples, n_features), got shape {shape}. Reshape your data: "
                        f"x.reshape(-1, 1) for one feature, x.reshape(1, -1) for one sample")
    kind = np.dtype(dtype).kind
    if kind == "c":
        raise DataError(f"Complex data not supported: {name} has dtype {np.dtype(dtype)}, should be real")
    if kind not in "iuf":
        raise DataError(f"{name} should be numeric, got dtype {np.dtype(dtype)}")
    if shape[1] < 1:
        raise DataError(f"{name} has 0 feature(s) (shape={shape}) while a minimum of 1 is required.")
    if shape[0] < 1:
        raise DataError(f"{name} has 0 sample(s) (shape={shape}) while a minimum of 1 is required.")


def _ordinal(i: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, ..., 21st."""
    suffix = "th" if 10 <= i % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(i % 10, "th")
    return f"{i}{suffix}"


def _listing(names, most: int = 8) -> str:
    """Up to ``most`` names, comma-separated (``a, b, c, ... (20 in all)`` beyond)."""
    names = [str(n) for n in names]
    if len(names) <= most:
        return ", ".join(names)
    return ", ".join(names[:most]) + f", ... ({len(names)} in all)"


def _sklearn_names_message(fitted: list[str], given: list[str]) -> str:
    """scikit-learn's message for other feature names than those seen at fit, verbatim."""
    def lines(names: list[str]) -> str:
        return "".join(f"- {n}\n" for n in names[:5]) + ("- ...\n" if len(names) > 5 else "")

    message = "The feature names should match those that were passed during fit.\n"
    unseen, missing = sorted(set(given) - set(fitted)), sorted(set(fitted) - set(given))
    if unseen:
        message += "Feature names unseen at fit time:\n" + lines(unseen)
    if missing:
        message += "Feature names seen at fit time, yet now missing:\n" + lines(missing)
    if not unseen and not missing:
        message += "Feature names must be in the same order as they were in fit.\n"
    return message


def _file_names_message(fitted: list[str], given: list[str], source: str) -> str:
    """Other column names in the file ``source`` than the model's, in one line: the first
    position where they differ, what is unseen or missing, and the requirement."""
    n = min(len(fitted), len(given))
    i = next((j for j in range(n) if fitted[j] != given[j]), n)
    if i < n:
        what = f"its {_ordinal(i + 1)} column is {given[i]!r} where the model's is {fitted[i]!r}"
    else:
        what = f"it has {len(given)} columns where the model has {len(fitted)}"
    unseen = [g for g in given if g not in set(fitted)]
    missing = [f for f in fitted if f not in set(given)]
    if not unseen and not missing and len(given) == len(fitted):
        what += " (the same names in another order)"
    else:
        parts = ([f"not in the model: {_listing(unseen)}"] if unseen else []) + \
                ([f"missing: {_listing(missing)}"] if missing else [])
        what += f" ({'; '.join(parts)})"
    return (f"the columns of {source} are not the model's: {what}; they should be the model's, in its order ("
            f"{_listing(fitted)})")


def check_feature_names(fitted, given, *, estimator: str = "KMeans", source: str | None = None,
                        stacklevel: int = 2) -> None:
    """Compare the columns of ``X`` with those a model was fitted on, as scikit-learn does.

    Parameters
    ----------
    fitted, given : sequence of str, or None
        The model's ``feature_names_in_`` and the names of ``X``'s columns (None: unnamed).
    estimator : str
        The estimator's class name, for scikit-learn's messages.
    source : str, optional
        The file ``X`` was read from: the messages are one line each and name it (the
        command prints them as they are); None for data in memory: scikit-learn's messages,
        word for word.
    stacklevel : int
        Of the warning, counted from the caller of this function.

    Raises
    ------
    FeatureNamesError
        Both have names and they differ (in a name, their number or their order).

    Warns
    -----
    FeatureNamesWarning
        Only one of them has names: the columns are matched by position, unchecked.
    """
    import warnings

    from .errors import FeatureNamesError, FeatureNamesWarning

    if fitted is None and given is None:
        return
    if fitted is None:
        message = (f"X has feature names, but {estimator} was fitted without feature names" if source is None else
                   f"{source} names its columns ({_listing(given)}), but the model was fitted without column names: "
                   f"they are taken in their order, unchecked")
        warnings.warn(message, FeatureNamesWarning, stacklevel=stacklevel + 1)
        return
    if given is None:
        message = (f"X does not have valid feature names, but {estimator} was fitted with feature names"
                   if source is None else
                   f"{source} does not name its columns, but the model was fitted on named columns "
                   f"({_listing(fitted)}): they are taken in that order, unchecked")
        warnings.warn(message, FeatureNamesWarning, stacklevel=stacklevel + 1)
        return
    fitted, given = [str(f) for f in fitted], [str(g) for g in given]
    if fitted == given:
        return
    message = _sklearn_names_message(fitted, given) if source is None else _file_names_message(fitted, given, source)
    raise FeatureNamesError(message, fitted, given)


def check_n_features(expected: int, got: int, name: str = "X") -> None:
    if expected != got:
        raise DataError(f"{name} has {got} features, but KMeans is expecting {expected} features as input")


# ---------------------------------------------------------------- command-line option values
#
# argparse ``type=`` callables: a bad value is a usage error (exit 2) before any work, with a
# message naming the option, the value and what it should be
# (``--chunk-bytes -1: should be a size > 0 such as 512MiB``).


def _option_error(flag: str, value: str, requirement: str) -> Exception:
    import argparse

    return argparse.ArgumentTypeError(f"{flag} {value}: should be {requirement}")


def int_option(flag: str, low: int = 1, high: int | None = None):
    """An integer option's ``type=``: an int in ``[low, high]`` (``high`` None: no bound)."""
    requirement = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"

    def parse(value: str) -> int:
        try:
            n = int(value, 10)
        except ValueError:
            raise _option_error(flag, value, requirement) from None
        if n < low or (high is not None and n > high):
            raise _option_error(flag, value, requirement)
        return n

    parse.__name__ = "integer"  # argparse's name for the type in its own messages
    return parse


def float_option(flag: str, low: float = 0.0, strict: bool = False):
    """A real option's ``type=``: a finite number >= ``low`` (> ``low`` where ``strict``)."""
    import math

    requirement = f"a finite number {'>' if strict else '>='} {low:g}"

    def parse(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            raise _option_error(flag, value, requirement) from None
        if not math.isfinite(x) or x < low or (strict and x == low):
            raise _option_error(flag, value, requirement)
        return x

    parse.__name__ = "number"
    return parse


def path_option(flag: str):
    """An output path option's ``type=``: any path but the empty one (``-o ""`` named no
    output; it was taken for the working directory and refused as "would overwrite the
    input")."""

    def parse(value: str) -> str:
        if not value:
            raise _option_error(flag, "''", "a non-empty path")
        return value

    parse.__name__ = "path"
    return parse


def size_option(flag: str, auto: bool = False):
    """A byte-size option's ``type=``: a size > 0 in Dask's notation (``512MiB``, ``4GB``,
    ``1e9``), or ``auto`` where ``auto`` is True; the value is kept as given (it is parsed
    where it is used)."""
    requirement = "a size > 0 such as 512MiB" + (" or auto" if auto else "")

    def parse(value: str) -> str:
        if auto and value.strip().lower() == "auto":
            return value
        from dask.utils import parse_bytes  # only when a size is given: the parser stays light

        try:
            ok = parse_bytes(value) > 0
        except (ValueError, TypeError):
            ok = False
        if not ok:
            raise _option_error(flag, value, requirement)
        return value

    parse.__name__ = "size"
    return parse


def labels_path_option(flag: str):
    """A labels output's ``type=``: a path whose suffix names a labels format
    (:data:`daskmeans.options.LABEL_SUFFIXES`; no suffix: Zarr), kept as given."""
    from .options import LABEL_SUFFIXES, label_format

    *most, last = LABEL_SUFFIXES
    requirement = f"a path ending in {', '.join(most)} or {last} (no suffix: Zarr)"

    def parse(value: str) -> str:
        if not value:
            raise _option_error(flag, "''", "a non-empty path")
        if label_format(value) is None:
            raise _option_error(flag, value, requirement)
        return value

    parse.__name__ = "path"
    return parse
