"""Input and output: readers to row-chunked Dask arrays, the model store. No GPU code here.

``read`` is imported on first use (PEP 562): a module of this package that needs NumPy alone
(:mod:`.headers`, which the command asks before its imports) does not load Dask with it."""


def __getattr__(name: str) -> object:
    """``read`` (:func:`daskmeans.io.readers.read`), imported on first use."""
    if name == "read":
        from .readers import read

        return read
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), "read"])
