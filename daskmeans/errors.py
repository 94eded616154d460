"""Exceptions for expected failures: bad parameters, bad input data, unreadable files.

The CLI turns any :class:`DaskmeansError` into one line on stderr and a non-zero exit;
anything else is a bug and keeps its traceback.
"""


class DaskmeansError(Exception):
    """Base class of the errors a user can cause and fix."""


class InvalidParameterError(DaskmeansError, ValueError):
    """A parameter value breaks its constraint (``n_clusters=0 should be >= 1``)."""


class DataError(DaskmeansError, ValueError):
    """The data cannot be clustered as given (NaN, wrong shape, non-numeric columns...)."""


class NotFittedError(DaskmeansError, AttributeError):
    """A fitted attribute or method was used before ``fit``."""


class DaskmeansWarning(UserWarning):
    """Something was done differently from what was asked, and the user should know (the CLI
    prints it as one ``daskmeans: warning: ...`` line)."""
