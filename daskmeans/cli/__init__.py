"""The ``daskmeans`` command line (a package: :mod:`.main`, the parser, dispatch, exit codes
and signals; one module per subcommand; :mod:`.common`, what they share).

``main(argv)`` runs a command and returns its exit status (what tests and other programs
call); ``run()`` is the console entry point (``daskmeans``, ``python -m daskmeans``), which
exits the process. Importing this package loads neither NumPy nor Dask, so ``--help``
answers at once.

``daskmeans.cli.main`` is the function: the module of that name is
``sys.modules["daskmeans.cli.main"]`` (``from daskmeans.cli.main import parser`` reaches it).
"""

from .main import main, run

__all__ = ["main", "run"]
