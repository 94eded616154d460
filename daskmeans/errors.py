"""Exceptions for expected failures: bad parameters, bad input data, unreadable files.

The CLI turns any :class:`DaskmeansError` into one line on stderr and a non-zero exit;
anything else is a bug and keeps its traceback.
"""

import functools
import sys


class DaskmeansError(Exception):
    """Base class of the errors a user can cause and fix."""


class InvalidParameterError(DaskmeansError, ValueError):
    """A parameter value breaks its constraint (``n_clusters=0 should be >= 1``)."""


class DataError(DaskmeansError, ValueError):
    """The data cannot be clustered as given (NaN, wrong shape, non-numeric columns...)."""


class InputChanged(DataError):
    """A chunk of the data read again during a fit differs from its first read: the input was
    changed (rewritten, replaced) while the fit was reading it."""


class FeatureNamesError(DataError):
    """The columns of ``X`` are not those the model was fitted on: renamed, reordered, added
    or dropped (scikit-learn raises a ValueError; this is one).

    Attributes
    ----------
    fitted, given : tuple of str
        The model's column names and those of ``X``, in order.
    """

    def __init__(self, message: str, fitted, given):
        super().__init__(message)
        self.fitted, self.given = tuple(fitted), tuple(given)


class DataTypeError(DataError, TypeError):
    """A value of the data is not a number at all (a dict in an object array, say)."""


class OutputError(DaskmeansError, OSError):
    """An output cannot be written (disk full, read-only file system, no permission...), is
    being written by another process, or may not be replaced (it exists without
    ``--overwrite``, or it is not a daskmeans output of the same kind). Also an ``OSError``,
    so code catching the file system's errors catches it; ``errno`` is the underlying error's
    where there is one."""

    def __init__(self, message: str, errno: int | None = None):
        super().__init__(message)
        self.errno = errno

    def __str__(self) -> str:
        return str(self.args[0])


class NotFittedError(DaskmeansError, AttributeError):
    """A fitted attribute or method was used before ``fit``."""


def not_fitted(message: str) -> NotFittedError:
    """A :class:`NotFittedError` that is also scikit-learn's when scikit-learn is in use, so
    that its checks and ``except sklearn.exceptions.NotFittedError`` catch it. scikit-learn is
    never imported for this: whoever catches its class has imported it already."""
    sk = sys.modules.get("sklearn.exceptions")
    if sk is None:
        return NotFittedError(message)
    return _with_base(sk.NotFittedError)(message)


@functools.cache
def _with_base(base: type) -> type:
    return type("NotFittedError", (NotFittedError, base), {"__module__": __name__, "__doc__": NotFittedError.__doc__})


class DaskmeansWarning(UserWarning):
    """Something was done differently from what was asked, and the user should know (the CLI
    prints it as one ``daskmeans: warning: ...`` line)."""


class FeatureNamesWarning(DaskmeansWarning):
    """Only one of the model and ``X`` names its columns: they are matched by position,
    unchecked (scikit-learn warns the same with a UserWarning; this is one)."""
