"""Declarative parameter constraints and the checks that produce uniform error messages.

Messages state the value and the requirement, e.g. ``n_samples=10 should be >= n_clusters=11``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Iterable

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
    """One of a fixed set of strings."""

    values: tuple[str, ...]

    def check(self, name: str, value: Any) -> None:
        if not isinstance(value, str) or value not in self.values:
            allowed = ", ".join(repr(v) for v in self.values)
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
