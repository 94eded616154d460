"""Output paths: checked before any work, locked while written, never half-written.

- An output that is, contains or lies inside one of the command's inputs is refused even with
  ``overwrite``: replacing it would destroy the data (or model) the command is reading.
- Each output path has a lock, an exclusive ``flock`` on the sibling file ``.NAME.lock``, held
  from the check that the path may be written to the rename that puts the output there (by a
  command, for the whole command): two writers to one path never both go on.
- An output is written to a temporary sibling ``.NAME.tmp-XXXXXXXX`` and renamed into place
  (the next writer of the path removes those a killed writer left, :func:`reap_temporaries`):
  where nothing may be replaced, only if the path still does not exist (``renameat2`` with
  ``RENAME_NOREPLACE``); where it may, swapped with the previous output in one step
  (``RENAME_EXCHANGE``), so that the path always holds a whole output. Elsewhere (other
  systems, file systems without these flags) two renames do it, the previous output put back
  if the second fails.
- ``overwrite`` replaces only a daskmeans output of the same kind (a model, labels, a
  checkpoint, generated data, a plot, a timings file), never a user's directory or file.
  Labels are a Zarr group marked as daskmeans', or a file in a format that has no room for a
  mark, recognised by its content (:func:`is_labels_file`).
- Any file system error while writing (disk full, quota, read-only...) removes the
  temporaries and becomes one :class:`~daskmeans.errors.OutputError`, ``cannot write PATH:
  No space left on device``; the previous output stays as it was.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import errno
import json
import os
import re
import shutil
import sys
import threading
import uuid
from dataclasses import dataclass
from typing import Iterable, Iterator

from ..errors import DaskmeansError, DataError, OutputError

# The format attribute of each kind of Zarr output daskmeans writes (the group's, or the
# array's for generated data): ``overwrite`` replaces a store only if it says the same kind.
FORMATS = {
    "model": "daskmeans-model",
    "checkpoint": "daskmeans-checkpoint",
    "labels": "daskmeans-labels",
    "data": "daskmeans-data",
}
# What each kind is called in messages.
NOUNS = {
    "model": "model",
    "checkpoint": "checkpoint",
    "labels": "labels output",
    "data": "generated dataset",
    "plot": "plot",
    "timings": "timings file",
}
# The first bytes of the image formats a plot is usually written in.
_SIGNATURES = {
    ".png": (b"\x89PNG\r\n\x1a\n",),
    ".pdf": (b"%PDF-",),
    ".svg": (b"<?xml", b"<svg", b"<!DOCTYPE svg"),
    ".jpg": (b"\xff\xd8\xff",),
    ".jpeg": (b"\xff\xd8\xff",),
    ".eps": (b"%!PS",),
    ".ps": (b"%!PS",),
    ".tif": (b"II*\x00", b"MM\x00*"),
    ".tiff": (b"II*\x00", b"MM\x00*"),
    ".webp": (b"RIFF",),
    ".svgz": (b"\x1f\x8b",),
}
_IMAGE_SUFFIXES = set(_SIGNATURES) | {".pgf", ".raw", ".rgba"}
# Errors that can only come from writing: any of them raised while an output is written is
# that output's failure, wherever the file system reported it.
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


def _real(path: str) -> str:
    return os.path.realpath(os.path.abspath(os.fspath(path)))


def _within(child: str, parent: str) -> bool:
    """Whether real path ``child`` is ``parent`` or lies below it."""
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


# ---------------------------------------------------------------- what a path holds


def _zarr_format(path: str) -> tuple[str, str | None] | None:
    """``(node type, format attribute or None)`` of the Zarr store at directory ``path``
    (format 3 or 2), or None if it is not one."""
    try:
        with open(os.path.join(path, "zarr.json")) as f:
            meta = json.load(f)
        attrs = meta.get("attributes") or {}
        return str(meta.get("node_type")), attrs.get("format") if isinstance(attrs, dict) else None
    except (OSError, ValueError, AttributeError):
        pass
    for node, name in (("group", ".zgroup"), ("array", ".zarray")):
        if os.path.isfile(os.path.join(path, name)):
            try:
                with open(os.path.join(path, ".zattrs")) as f:
                    attrs = json.load(f)
            except (OSError, ValueError):
                attrs = {}
            return node, attrs.get("format") if isinstance(attrs, dict) else None
    return None


def _is_timings(path: str) -> bool:
    """Whether the regular file ``path`` holds a ``--timings`` document."""
    try:
        if os.path.getsize(path) > 2**26:  # far larger than any timings file
            return False
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and isinstance(doc.get("phases"), dict) and "main_seconds" in doc


def _is_image(path: str) -> bool:
    """Whether the regular file ``path`` is an image of the format its suffix names (one of
    Matplotlib's: its signature where the format has one, else any content)."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in _IMAGE_SUFFIXES:
        return False
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return False
    signatures = _SIGNATURES.get(suffix)
    if signatures is None:  # .pgf, .raw, .rgba: no signature to check
        return bool(head)
    return head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(signatures)


def is_labels_file(path: str) -> bool:
    """Whether the regular file ``path`` holds labels as daskmeans writes them, by the format
    its suffix names (:mod:`daskmeans.io.labels`) and its content:

    - ``.npy``: a whole 1-D int32 array (its header says ``<i4``, C order, one dimension, and
      the file holds exactly that many values): the format has no room for a mark;
    - ``.csv``: a header whose last column is ``label`` and a first row (if any) whose last
      value is an integer;
    - ``.parquet``: the file's metadata says ``format: daskmeans-labels``.
    """
    suffix = os.path.splitext(path)[1].lower()
    try:
        with open(path, "rb") as f:
            if suffix == ".npy":
                return _npy_labels(f, os.fstat(f.fileno()).st_size)
            if suffix == ".csv":
                return _csv_labels(f.read(1 << 16))
            if suffix == ".parquet":
                return _parquet_labels(f, os.fstat(f.fileno()).st_size)
    except (OSError, ValueError, SyntaxError, MemoryError):
        pass
    return False


def _npy_labels(f, size: int) -> bool:
    import ast

    head = f.read(12)
    if len(head) < 10 or not head.startswith(b"\x93NUMPY"):
        return False
    major = head[6]
    n, start = (int.from_bytes(head[8:10], "little"), 10) if major == 1 else (int.from_bytes(head[8:12], "little"), 12)
    f.seek(start)
    header = ast.literal_eval(f.read(min(n, 1 << 16)).decode("latin1"))
    shape = header.get("shape") if isinstance(header, dict) else None
    return (header.get("descr") in ("<i4", "=i4") and header.get("fortran_order") is False
            and isinstance(shape, tuple) and len(shape) == 1 and size == start + n + 4 * int(shape[0]))


def _csv_labels(head: bytes) -> bool:
    import csv
    import io

    lines = head.decode("utf-8", "replace").lstrip("\ufeff").splitlines()
    rows = list(csv.reader(io.StringIO("\n".join(lines[:2]))))
    if not rows or not rows[0] or rows[0][-1].strip() != "label":
        return False
    return len(rows) == 1 or (len(rows[1]) == len(rows[0]) and rows[1][-1].strip().lstrip("-").isdigit())


def _parquet_labels(f, size: int) -> bool:
    if size < 12 or f.read(4) != b"PAR1":
        return False
    f.seek(size - 8)
    tail = f.read(8)
    n = int.from_bytes(tail[:4], "little")
    if tail[4:] != b"PAR1" or n > size - 12:
        return False
    f.seek(size - 8 - n)
    return FORMATS["labels"].encode() in f.read(n)  # the key-value metadata, as Thrift stores its strings


def describe(path: str) -> str:
    """What is at ``path``, in a few words for a message ("a directory that is not a Zarr
    store", "a daskmeans model", "a file"...)."""
    if os.path.islink(path) and not os.path.exists(path):
        return "a broken symbolic link"
    if os.path.isdir(path):
        z = _zarr_format(path)
        if z is None:
            return "a directory that is not a Zarr store"
        node, fmt = z
        for kind, f in FORMATS.items():
            if fmt == f:
                return f"a daskmeans {NOUNS[kind]}"
        return f"a Zarr {node} " + (f"of format {fmt!r}" if fmt is not None else "that daskmeans did not write")
    if os.path.isfile(path):
        if _is_timings(path):
            return "a daskmeans timings file"
        if is_labels_file(path):
            return f"a daskmeans {NOUNS['labels']}"
        return "an image" if _is_image(path) else "a file"
    return "neither a file nor a directory"


def is_kind(path: str, kind: str) -> bool:
    """Whether ``path`` holds a daskmeans output of ``kind`` (see :data:`NOUNS`)."""
    if kind in FORMATS and os.path.isdir(path):
        z = _zarr_format(path)
        return bool(z) and z[1] == FORMATS[kind]
    if not os.path.isfile(path):  # a directory, a device, a broken link...
        return False
    if kind == "labels":  # a .npy, .csv or .parquet file
        return is_labels_file(path)
    if kind in FORMATS:  # the other kinds are Zarr stores only
        return False
    if kind == "plot":
        return _is_image(path)
    if kind == "timings":
        return _is_timings(path)
    raise ValueError(f"kind={kind!r} should be one of {', '.join(NOUNS)}")


def check_replaceable(path: str, kind: str | None, by: str = "daskmeans") -> None:
    """Refuse to replace ``path`` unless it holds a daskmeans output of ``kind`` (None: any).

    ``by`` names what would replace it in the message (``--overwrite``, ``--checkpoint``).
    """
    if kind is None or not os.path.lexists(path) or is_kind(path, kind):
        return
    noun = NOUNS[kind]
    raise OutputError(f"{path} is not a daskmeans {noun} ({describe(path)}): {by} replaces only a daskmeans {noun}")


# ---------------------------------------------------------------- checks before any work


def check_output(path: str | None, overwrite: bool, inputs: Iterable[str | None] = (), kind: str | None = None,
                 by: str = "--overwrite") -> None:
    """Refuse an output path that cannot or must not be written.

    Parameters
    ----------
    path : str or None
        The output (None: nothing to check).
    overwrite : bool
        Whether an existing output may be replaced.
    inputs : iterable of str or None
        Paths the command reads (data, model, init file); the output may not be one of them,
        contain one, or lie inside one, whatever ``overwrite`` says.
    kind : str, optional
        The kind of output (a key of :data:`NOUNS`): an existing path is replaced only if it
        holds a daskmeans output of this kind.
    by : str
        What replaces it, for the message.
    """
    if path is None:
        return
    _check_inputs(path, overwrite, inputs)
    _check_existing(path, overwrite, kind, by)
    _check_parent(path)


def _check_named(path: str) -> None:
    """Refuse the empty path: it names no output (``os.path.abspath`` would make it the
    working directory, which holds the inputs)."""
    if not os.fspath(path):
        raise DaskmeansError("an output path is empty: name the file or directory to write")


def _check_inputs(path: str, overwrite: bool, inputs: Iterable[str | None]) -> None:
    _check_named(path)
    out = _real(path)
    for src in inputs:
        if src is None or not isinstance(src, (str, os.PathLike)):
            continue
        inp = _real(src)
        if _within(out, inp) or _within(inp, out):
            raise DaskmeansError(
                f"output {path} would overwrite the input {src}: choose another output path"
                + (" (--overwrite never replaces an input)" if overwrite else "")
            )


def _check_existing(path: str, overwrite: bool, kind: str | None, by: str) -> None:
    if os.path.lexists(path):
        if not overwrite:
            raise _exists_error(path)
        check_replaceable(path, kind, by)


def _check_parent(path: str) -> None:
    parent = os.path.dirname(_real(path))
    if not os.path.isdir(parent):
        raise DaskmeansError(f"cannot write {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise DaskmeansError(f"cannot write {path}: directory {parent} is not writable")


# ---------------------------------------------------------------- locks


def lock_file(path: str) -> str:
    """The lock file of output ``path``: ``.NAME.lock`` beside it (its directory resolved, so
    that every spelling of one output has one lock)."""
    parent, name = os.path.split(os.path.abspath(os.fspath(path)))
    return os.path.join(os.path.realpath(parent), f".{name}.lock")


@dataclass
class _Held:
    fd: int
    count: int
    pid: int


_held: dict[str, _Held] = {}  # lock file -> this process's hold on it
_held_guard = threading.Lock()


def _holder(fd: int) -> str:
    """`` (pid N)`` of the process holding the lock open on ``fd``, as it wrote it, or ''."""
    try:
        pid = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""


def _acquire(path: str, key: str, wait: bool) -> None:
    import fcntl

    with _held_guard:
        held = _held.get(key)
        if held is not None and held.pid == os.getpid():  # this process holds it: nested use
            held.count += 1
            return
    while True:
        try:
            fd = os.open(key, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise OutputError(f"cannot write {path}: {e.strerror}", e.errno) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            # The holder we waited for removes the file as it lets go, and a third process
            # may have made a new one since: a lock on a file no longer at ``key`` is no lock.
            try:
                same = os.path.samestat(os.stat(key), os.fstat(fd))
            except FileNotFoundError:
                same = False
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise OutputError(f"{path} is being written by another process{holder}: wait for it to end or choose "
                              f"another output", errno.EBUSY) from None
        except OSError as e:
            os.close(fd)
            raise OutputError(f"cannot lock {path} (lock file {key}): {e.strerror}", e.errno) from None
        except BaseException:  # an interrupt while waiting
            os.close(fd)
            raise
        if same:
            break
        os.close(fd)
    try:  # who holds it, for the message another writer gets (a disk too full for it is no matter)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass
    with _held_guard:
        _held[key] = _Held(fd, 1, os.getpid())
    reap_temporaries(path)


def _temporary_name(name: str) -> re.Pattern:
    """The names of the temporaries :func:`_atomic` makes for output ``name``:
    ``.NAME.tmp-XXXXXXXX``, with ``NAME``'s suffix after it for a file."""
    suffix = os.path.splitext(name)[1]
    if suffix == ".old":  # never a name ending .old: it could be the fallback's previous output (_swap)
        suffix = ""
    return re.compile(rf"\.{re.escape(name)}\.tmp-[0-9a-f]{{8}}(?:{re.escape(suffix)})?\Z" if suffix
                      else rf"\.{re.escape(name)}\.tmp-[0-9a-f]{{8}}\Z")


def reap_temporaries(path: str) -> list[str]:
    """Remove the hidden temporaries of output ``path`` that a killed writer left behind
    (``.NAME.tmp-XXXXXXXX``: a SIGKILLed ``predict -o NAME`` leaves its partial labels), and
    return their paths.

    Called by this process once it newly holds ``path``'s lock: every writer makes its
    temporary while it holds the lock and removes or renames it before letting go, and the
    lock dies with its process, so no writer of such a temporary is alive any more (a block
    write a lost client left running on a worker finds the directory gone and removes what it
    recreated: :func:`~daskmeans.io.model_store.write_array`). A ``.old`` beside them (the
    previous output the two-rename fallback set aside, perhaps its only copy) is never
    removed. Reaping is housekeeping: a failure to list or remove is no error of the command.
    """
    parent, name = os.path.split(os.path.abspath(os.fspath(path)))
    pattern = _temporary_name(name)
    try:
        stale = [os.path.join(parent, n) for n in os.listdir(parent) if pattern.match(n)]
    except OSError:
        return []
    for tmp in stale:
        with contextlib.suppress(OSError):
            _remove(tmp)
    return stale


def _release(key: str) -> None:
    with _held_guard:
        held = _held.get(key)
        if held is None or held.pid != os.getpid():
            return
        held.count -= 1
        if held.count:
            return
        del _held[key]
    # Removed while still held (see _acquire's check), so no lock file stays behind.
    with contextlib.suppress(OSError):
        os.unlink(key)
    os.close(held.fd)


@contextlib.contextmanager
def output_lock(path: str, *, wait: bool = True) -> Iterator[None]:
    """Hold the exclusive lock on output ``path`` (the ``flock`` of :func:`lock_file`).

    Parameters
    ----------
    path : str
    wait : bool
        Wait while another process holds it; else raise :class:`OutputError` at once
        (``PATH is being written by another process (pid N)``).

    Locks are per process: a nested ``output_lock`` of a path this process holds returns at
    once (a command holds its outputs' locks while the writers it calls take them again).
    """
    key = lock_file(path)
    _acquire(path, key, wait)
    try:
        yield
    finally:
        _release(key)


# ---------------------------------------------------------------- renames


_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2


def _load_renameat2():
    """glibc's ``renameat2`` (2.28 and later; musl 1.2.2), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28, musl >= 1.2.2
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


_renameat2_fn = _load_renameat2()


def _renameat2(src: str, dst: str, flags: int) -> bool:
    """Rename with ``flags``: True when done, False where the kernel or file system does not
    support them (the caller falls back); any other failure raises its OSError."""
    if _renameat2_fn is None:
        return False
    if _renameat2_fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), dst)


def _rename_noreplace(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst`` only if ``dst`` does not exist, else FileExistsError."""
    if _renameat2(src, dst, _RENAME_NOREPLACE):
        return
    if not os.path.isdir(src):
        try:
            os.link(src, dst)  # atomic, and fails if dst exists
        except FileExistsError:
            raise
        except OSError:  # no hard links here (some network and FUSE file systems)
            pass
        else:
            os.unlink(src)
            return
    # A directory renamed onto an empty directory replaces it: checked first (a window that
    # only a writer ignoring the lock can use).
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
    try:
        os.rename(src, dst)
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst) from None
        raise


def _swap(new: str, path: str) -> None:
    """Put ``new`` at ``path`` in place of its present content, which ends at ``new``: in one
    step where the system can, so the path is never without a whole output."""
    if not os.path.isdir(new) and not (os.path.isdir(path) and not os.path.islink(path)):
        os.replace(new, path)  # a file over a file (or link): rename itself replaces atomically
        return
    if _renameat2(new, path, _RENAME_EXCHANGE):
        return
    old = new + ".old"
    os.rename(path, old)
    try:
        os.rename(new, path)
    except BaseException as e:
        try:
            os.rename(old, path)
        except OSError as again:  # kept, never removed: the only copy of the previous output
            raise OutputError(f"cannot write {path}: {getattr(e, 'strerror', None) or e}; the previous output "
                              f"could not be put back ({again.strerror}) and is at {old}", again.errno) from e
        raise
    _remove(old)


def _remove(path: str) -> None:
    """Remove ``path`` (a directory tree, file or link) if it is there."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


def _exists_error(path: str) -> OutputError:
    return OutputError(f"{path} exists: choose another output or pass --overwrite", errno.EEXIST)


def _commit(tmp: str, path: str, replace: bool, kind: str | None, by: str) -> None:
    """Rename the written ``tmp`` to ``path``; ``tmp`` is gone afterwards, whatever happens."""
    try:
        if not os.path.lexists(path):
            try:
                _rename_noreplace(tmp, path)
                return
            except FileExistsError:  # made since the check by a writer that takes no lock
                pass
        if not replace:
            raise _exists_error(path)
        check_replaceable(path, kind, by)
        _swap(tmp, path)
    except OSError as e:
        err = _as_output_error(e, path, tmp)
        if err is e:
            raise
        raise err from e
    finally:
        _remove(tmp)  # the previous output after a swap; the new one after a failure


def _as_output_error(e: OSError, path: str, tmp: str) -> OSError:
    """``e`` as ``cannot write PATH: <reason>`` if it came from writing ``path`` (its
    temporary, or an error only writes raise), else ``e`` itself (an input that failed to
    read while the output was computed keeps its own error)."""
    if isinstance(e, OutputError):
        return e
    names = [f for f in (e.filename, e.filename2) if isinstance(f, (str, os.PathLike))]
    ours = e.errno in _WRITE_ERRNOS or any(_within(_real(f), _real(p)) for f in names for p in (tmp, path))
    if not ours:
        return e
    return OutputError(f"cannot write {path}: {e.strerror or e}", e.errno)


# ---------------------------------------------------------------- a command's outputs


@dataclass
class _Claim:
    kind: str | None
    replace: bool
    by: str
    defer: bool


class Outputs:
    """The outputs of one command, as a context manager: each locked from :meth:`claim` to the
    end, checked under its lock, and (unless claimed with ``defer=False``) written to its
    temporary by :func:`atomic_dir` or :func:`atomic_file` and renamed into place only when
    the context ends without an error, all together, so that a failure of any output (a full
    disk while writing the last one) leaves every previous output as it was.

    Writers called inside it (``KMeans.save``, :func:`~daskmeans.io.model_store.write_array`)
    take the policy of a claimed path (replace or not, its kind) from it.
    """

    def __init__(self) -> None:
        self._claims: dict[str, _Claim] = {}
        self._staged: list[tuple[str, str, _Claim]] = []
        self._locks = contextlib.ExitStack()
        self._token: contextvars.Token | None = None

    def claim(self, path: str | None, kind: str | None, overwrite: bool, inputs: Iterable[str | None] = (), *,
              defer: bool = True, by: str = "--overwrite") -> None:
        """Lock ``path`` (refused at once if another process holds it), then check it as
        :func:`check_output` does. None: nothing to claim.

        Parameters
        ----------
        path : str or None
        kind : str or None
            What it holds (a key of :data:`NOUNS`).
        overwrite : bool
            Whether an existing output of the same kind may be replaced.
        inputs : iterable of str or None
            The command's inputs (never overwritten).
        defer : bool
            Rename into place at the end of the context (True), or at once when each write
            ends (a checkpoint, rewritten as the fit goes).
        by : str
            What replaces the path, for messages.
        """
        if path is None:
            return
        _check_inputs(path, overwrite, inputs)
        _check_parent(path)  # where its lock file goes
        self._locks.enter_context(output_lock(path, wait=False))
        _check_existing(path, overwrite, kind, by)  # under the lock
        self._claims[lock_file(path)] = _Claim(kind, overwrite, by, defer)

    def _claim_of(self, path: str) -> _Claim | None:
        return self._claims.get(lock_file(path))

    def _stage(self, tmp: str, path: str, claim: _Claim) -> None:
        self._staged.append((tmp, path, claim))

    def __enter__(self) -> "Outputs":
        self._token = _active.set(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        _active.reset(self._token)
        staged, self._staged = self._staged, []
        try:
            if exc_type is None:
                for i, (tmp, path, c) in enumerate(staged):
                    try:
                        _commit(tmp, path, c.replace, c.kind, c.by)
                    except BaseException:
                        for t, _, _ in staged[i + 1:]:
                            _remove(t)
                        raise
            else:
                for t, _, _ in staged:
                    _remove(t)
        finally:
            self._locks.close()


_active: contextvars.ContextVar[Outputs | None] = contextvars.ContextVar("daskmeans_outputs", default=None)


# ---------------------------------------------------------------- atomic writes


@contextlib.contextmanager
def _atomic(path: str, kind: str | None, replace: bool, suffix: str) -> Iterator[str]:
    path = os.fspath(path)
    _check_named(path)
    parent, name = os.path.split(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise DataError(f"cannot write {path}: directory {parent} does not exist")
    outputs = _active.get()
    claim = outputs._claim_of(path) if outputs is not None else None
    if claim is None:
        claim = _Claim(kind, replace, "daskmeans", False)
    with output_lock(path):  # at once where a command claimed it (it holds the lock)
        _check_existing(path, claim.replace, claim.kind, claim.by)  # under the lock; again at the rename
        tmp = os.path.join(parent, f".{name}.tmp-{uuid.uuid4().hex[:8]}{suffix}")
        try:
            yield tmp
        except OSError as e:
            _remove(tmp)
            err = _as_output_error(e, path, tmp)
            if err is e:
                raise
            raise err from e
        except BaseException:
            _remove(tmp)
            raise
        if claim.defer:
            outputs._stage(tmp, path, claim)
        else:
            _commit(tmp, path, claim.replace, claim.kind, claim.by)


def atomic_dir(path: str, *, kind: str | None = None, replace: bool = True):
    """Context manager yielding a temporary directory path (not yet made) that replaces
    ``path`` on success; on failure it is removed and an OSError from writing it is raised as
    ``OutputError('cannot write PATH: <reason>')``.

    Parameters
    ----------
    path : str
    kind : str, optional
        What the output is (a key of :data:`FORMATS`): an existing ``path`` is replaced only
        if it holds a daskmeans output of this kind.
    replace : bool
        Whether an existing ``path`` may be replaced at all.

    The output's lock is held from the check to the rename. Inside a command's
    :class:`Outputs` that claimed ``path``, its claim decides instead, and the rename waits
    for the end of the command.
    """
    return _atomic(path, kind, replace, "")


def atomic_file(path: str, *, kind: str | None = None, replace: bool = True):
    """As :func:`atomic_dir` for a single file; the temporary's name ends with ``path``'s
    suffix (a writer choosing the format from it finds the same)."""
    return _atomic(path, kind, replace, os.path.splitext(os.fspath(path))[1])
