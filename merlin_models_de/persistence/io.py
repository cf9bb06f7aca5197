"""Files written whole or not at all, and read back checked: the I/O under every store.

No TensorFlow here. A writer flushes every file it writes and the directory entries that
name it to disk (``fsync``) before anything may point at it, so a power loss after a
``latest`` or a manifest moved never finds it naming data that was still in a cache. A
reader checks everything it reads (JSON, ``.npy`` headers, sizes) and raises
:class:`StorageError` naming the file. :func:`write_whole` writes a whole directory beside
the old one and puts it in the old one's place in one step; a reader that opened the old one
(:func:`open_directory`) keeps reading it, never a mix of the two.

Example:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "x.json")
    >>> write_json(path, {"a": 1})
    >>> read_json(path, "Example")
    {'a': 1}
"""

from __future__ import annotations

import ctypes
import errno
import json
import math
import os
import shutil
import tokenize
import uuid
import zipfile

import numpy as np

from merlin_models_de.persistence.disk import write_failure

# Leftovers of interrupted writes: a small file written aside and not yet renamed over its
# target, a whole directory written beside its target, an old one on its way out.
WRITING_PREFIX, TMP_PREFIX, TRASH_PREFIX = ".writing-", ".tmp-", ".trash-"


class StorageError(ValueError):
    """A file of a checkpoint, a table export or a saved model is missing, malformed, does
    not fit the model, or cannot be taken (the message names the file). The one error type
    of :mod:`merlin_models_de.persistence`."""


# ---- flushing to disk -----------------------------------------------------------------------


def fsync_directory(directory: str) -> None:
    """Flushes ``directory``'s entries (names created, renamed or removed in it) to disk."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # a file system without directory handles: the rename is all there is
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_directories(root: str, paths) -> None:
    """Flushes the directory of every file in ``paths`` and each directory above it up to
    and with ``root`` (the entries that name the files and the directories made for them)."""
    root = os.path.abspath(root)
    seen = set()
    for path in paths:
        directory = os.path.dirname(os.path.abspath(path))
        while directory not in seen and (directory == root or directory.startswith(root + os.sep)):
            seen.add(directory)
            directory = os.path.dirname(directory)
    for directory in sorted(seen, key=len, reverse=True):  # the deepest first
        fsync_directory(directory)


def fsync_tree(root: str) -> None:
    """Flushes ``root`` and every file and directory below it to disk (what another writer
    wrote there, e.g. TensorFlow's SavedModel, which flushes nothing itself)."""
    if os.path.isfile(root):
        _fsync_file(root)
        return
    for directory, _, names in os.walk(root, topdown=False):
        for name in names:
            if not os.path.islink(os.path.join(directory, name)):
                _fsync_file(os.path.join(directory, name))
        fsync_directory(directory)


def _fsync_file(path: str) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _write_synced(path: str, write, mode: str = "wb") -> None:
    """Opens ``path``, lets ``write(f)`` fill it, and flushes it to disk before closing."""
    with open(path, mode, encoding=None if "b" in mode else "utf-8") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


# ---- small files, written whole or not at all -------------------------------------------------


def write_atomic(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` so a reader sees the old file or the whole new one, also
    after a crash: write aside, flush to disk, rename over, flush the directory entry."""
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f"{WRITING_PREFIX}{uuid.uuid4().hex}")
    try:
        _write_synced(tmp, lambda f: f.write(text), mode="w")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    fsync_directory(directory)


def write_json(path: str, value) -> None:
    """``value`` as JSON at ``path``, atomically (:func:`write_atomic`)."""
    write_atomic(path, json.dumps(value, indent=1))


def read_json(path: str, what: str, dir_fd=None):
    """The JSON at ``path``; :class:`StorageError` naming ``what`` and the file otherwise.
    With ``dir_fd``, the file of that name in the directory opened as ``dir_fd``."""
    try:
        with open(path, encoding="utf-8", opener=_opener(dir_fd)) as f:
            return json.load(f)
    except FileNotFoundError as exc:
        raise StorageError(f"{what} {path} is missing.") from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StorageError(f"{what} {path} is not readable JSON: {exc}") from exc


def open_directory(directory: str, what: str) -> int:
    """A descriptor of ``directory``, to read files of one version of it: names opened
    through it (``dir_fd``) stay in that directory even when another takes its place.

    Raises:
        StorageError: naming ``what`` and the directory, when it is missing or no directory.
    """
    try:
        return os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except FileNotFoundError as exc:
        raise StorageError(f"No {what} in {directory}: it does not exist.") from exc
    except OSError as exc:
        raise StorageError(
            f"Cannot open the {what} directory {directory}: {exc.strerror or exc}"
        ) from exc


def inside(root: str, relative: str, what: str = "file") -> str:
    """``root/relative``, resolved (symlinks too); raises if it is not inside ``root``.

    Raises:
        StorageError: naming ``what`` and ``relative``.
    """
    base = os.path.realpath(root)
    path = os.path.realpath(os.path.join(base, relative))
    if os.path.isabs(relative) or os.path.commonpath([base, path]) != base or path == base:
        raise StorageError(
            f"The {what} would lie outside the directory {base} that holds "
            f"it. Received: {what}={relative!r}"
        )
    return path


# ---- whole directories, switched in one step ----------------------------------------------------

_RENAME_EXCHANGE = 2  # renameat2's flag: swap two existing names atomically (Linux >= 3.15)
_AT_FDCWD = -100


def _exchange(a: str, b: str) -> bool:
    """Swaps the names ``a`` and ``b`` in one atomic step; False where the system or the
    file system cannot (then nothing happened)."""
    rename2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if rename2 is None:
        return False
    if rename2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(code, f"Cannot swap {b} for {a}: {os.strerror(code)}")


def swap_in(new: str, target: str, aside: str) -> str | None:
    """Puts ``new`` (a directory or a file, in ``target``'s directory) at ``target``.

    A reader of ``target`` sees the old one or the whole new one. A file is renamed over
    the old; a directory takes the old one's place in one atomic exchange where the file
    system can (Linux ``renameat2``), else in two renames: the old one to ``aside`` first,
    then ``new`` to ``target`` (a crash in between leaves the old one, whole, at
    ``aside``). Flushes the directory entries.

    Returns:
        Where the old directory now lies (``new`` or ``aside``: the caller removes it), or
        None when there was none (or ``new`` was a file).
    """
    parent = os.path.dirname(os.path.abspath(target))
    old = None
    if os.path.isdir(new) and os.path.lexists(target):
        if _exchange(new, target):
            old = new
        else:
            os.rename(target, aside)
            old = aside
    if old != new:
        try:
            os.replace(new, target)
        except OSError:
            if old is not None:
                os.rename(old, target)  # the old one back in its place
            raise
    fsync_directory(parent)
    return old


def beside(target: str) -> tuple[str, str]:
    """``(temporary, aside)``: fresh names in ``target``'s directory for a new version being
    written (``.tmp-<id>-<name>``, the same suffix) and for the old one on its way out."""
    parent, name = os.path.split(os.path.abspath(target))
    tag = uuid.uuid4().hex[:12]
    return (
        os.path.join(parent, f"{TMP_PREFIX}{tag}-{name}"),
        os.path.join(parent, f"{TRASH_PREFIX}{tag}-{name}"),
    )


def replace_whole(tmp: str, target: str, aside: str) -> None:
    """Puts the written and flushed ``tmp`` at ``target`` (:func:`swap_in`), then deletes
    the old one."""
    old = swap_in(tmp, target, aside)
    if old is not None:
        remove_path(old)


def write_whole(target: str, write) -> None:
    """Writes a directory (or a file) at ``target`` whole: ``write(path)`` fills a temporary
    beside it (:func:`beside`), which is flushed to disk and then put in the old one's place
    (:func:`replace_whole`).

    Until the swap the old ``target`` stays as it was. A ``write`` that raises leaves it and
    removes the temporary; a process killed while writing leaves it and the temporary (delete
    it). Remote paths (``gs://``, ``hdfs://``) are written in place by ``write``.
    """
    target = os.fspath(target)
    if "://" in target:
        write(target)
        return
    os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
    tmp, aside = beside(target)
    try:
        write(tmp)
        fsync_tree(tmp)
        replace_whole(tmp, target, aside)
    except BaseException:
        remove_path(tmp)
        raise


def remove_path(path: str) -> None:
    """Removes a file or a directory tree, if there is one (best effort)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        try:
            os.remove(path)
        except OSError:
            pass


# ---- arrays -----------------------------------------------------------------------------------


class _Writer:
    """A file seen by NumPy as a plain stream: it then writes through Python, whose errors
    keep their errno (its own C writes report a full disk as "N requested and M written")."""

    def __init__(self, f):
        self.write = f.write


def write_array(path: str, array) -> None:
    """Saves one array as ``.npy`` (never pickled), creating its directory, and flushes it
    to disk (its directory entries: :func:`fsync_directories`).

    Raises:
        OSError: naming the file, the rank and the cause (``No space left on device``).
    """
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _write_synced(
            path,
            lambda f: np.lib.format.write_array(_Writer(f), _c_order(array), allow_pickle=False),
        )
    except OSError as exc:
        raise write_failure(path, exc) from exc


def _c_order(array) -> np.ndarray:
    # np.ascontiguousarray would turn a scalar into shape (1,)
    return np.array(array, order="C", copy=False)


def _opener(dir_fd):
    """``open``'s opener for a file named by its path but opened by its name inside the
    directory ``dir_fd`` (as that directory was when opened, even if replaced since); no
    symlinks. None: by path."""
    if dir_fd is None:
        return None
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    return lambda path, flags: os.open(os.path.basename(path), flags | nofollow, dir_fd=dir_fd)


def _open_array(path: str, shape, dtype, dir_fd=None):
    """``(file, offset of the data)`` of a ``.npy`` file whose header and size match."""
    try:
        f = open(path, "rb", opener=_opener(dir_fd))
    except FileNotFoundError as exc:
        raise StorageError(f"File {path} is missing.") from exc
    except OSError as exc:
        raise StorageError(f"File {path} is not a readable .npy array: {exc}") from exc
    try:
        return f, _check_header(f, path, shape, dtype)
    except BaseException:
        f.close()
        raise


# What NumPy raises on a damaged ``.npy`` header: it parses the header as a Python literal,
# so a flipped bit surfaces as a tokenizer, syntax, type or key error as well as ValueError.
_BAD_HEADER = (
    OSError,
    ValueError,
    EOFError,
    SyntaxError,
    TypeError,
    KeyError,
    IndexError,
    RecursionError,
    MemoryError,
    tokenize.TokenError,
)


def _check_header(f, path: str, shape, dtype) -> int:
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            found_shape, fortran, found_dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            found_shape, fortran, found_dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"unsupported .npy version {version}")
        offset, size = f.tell(), os.fstat(f.fileno()).st_size
    except _BAD_HEADER as exc:
        raise StorageError(
            f"File {path} is not a readable .npy array: {type(exc).__name__}: {exc}"
        ) from exc
    want = (tuple(int(n) for n in shape), np.dtype(dtype))
    if (tuple(found_shape), found_dtype) != want or fortran:
        raise StorageError(
            f"File {path} does not hold what the manifest says: expected "
            f"{want[1]} {want[0]}. Received: dtype={found_dtype}, shape={tuple(found_shape)}"
            f"{', fortran_order=True' if fortran else ''}"
        )
    expected = offset + math.prod(want[0]) * want[1].itemsize
    if size != expected:
        raise StorageError(
            f"File {path} is truncated or has trailing bytes: expected "
            f"{expected} bytes. Received: size={size}"
        )
    return offset


def check_array(path: str, shape, dtype) -> None:
    """Checks that ``path`` is a ``.npy`` file holding exactly a ``dtype`` array of ``shape``.

    Reads the header only; the size check catches truncated and padded files.

    Raises:
        StorageError: naming the file and what differs.
    """
    f, _ = _open_array(path, shape, dtype)
    f.close()


def load_array(path: str, shape, dtype, dir_fd=None):
    """A read-only memory map of a checked ``.npy`` file (nothing is read until sliced),
    checked and mapped through one open file. With ``dir_fd``, the file of that name in the
    directory opened as ``dir_fd`` (see :func:`open_directory`).

    Raises:
        StorageError: naming the file, when it is missing or not what ``shape`` and
            ``dtype`` say.
    """
    f, offset = _open_array(path, shape, dtype, dir_fd)
    with f:
        if math.prod(shape) == 0:  # an empty file region cannot be mapped
            return np.zeros(shape, dtype)
        return np.memmap(
            f,
            dtype=np.dtype(dtype),
            mode="r",
            offset=offset,
            shape=tuple(int(n) for n in shape),
            order="C",
        )


def write_arrays(path: str, arrays: dict) -> None:
    """Saves ``{key: array}`` as an uncompressed ``.npz`` whose members are never pickled,
    flushed to disk.

    Raises:
        OSError: naming the file, the rank and the cause.
    """

    def write(f):
        with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
            for key, value in arrays.items():
                with archive.open(f"{key}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, _c_order(value), allow_pickle=False)

    try:
        _write_synced(path, write)
    except OSError as exc:
        raise write_failure(path, exc) from exc


def read_arrays(path: str, expected: dict) -> dict:
    """Reads a ``.npz`` holding exactly ``expected`` = ``{key: (shape, dtype)}``.

    Raises:
        StorageError: naming the file, and the key that is missing, extra or different.
    """
    try:
        archive = np.load(path, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):
            raise ValueError("it holds a single array, not an .npz archive")
        with archive:
            keys = set(archive.files)
            if keys != set(expected):
                missing, extra = sorted(set(expected) - keys), sorted(keys - set(expected))
                raise StorageError(
                    f"File {path} does not hold the arrays the manifest "
                    f"lists. Received: missing={missing}, unexpected={extra}"
                )
            arrays = {key: archive[key] for key in sorted(keys)}
    except StorageError:
        raise
    except FileNotFoundError as exc:
        raise StorageError(f"File {path} is missing.") from exc
    except (*_BAD_HEADER, zipfile.BadZipFile) as exc:
        raise StorageError(
            f"File {path} is not a readable .npz archive: {type(exc).__name__}: {exc}"
        ) from exc
    for key, (shape, dtype) in expected.items():
        got = arrays[key]
        if got.shape != tuple(shape) or got.dtype != np.dtype(dtype):
            raise StorageError(
                f"File {path}, array '{key}' does not hold what the manifest says: expected "
                f"{np.dtype(dtype)} {tuple(shape)}. Received: dtype={got.dtype}, "
                f"shape={got.shape}"
            )
    return arrays


# ``.npy`` cannot name bfloat16 (NumPy has no such type): a bfloat16 array is written as its
# uint16 bit patterns, and manifests say "bfloat16"
BFLOAT16 = "bfloat16"


def disk_dtype(name: str) -> np.dtype:
    """The NumPy dtype of the files of arrays a manifest names ``name``."""
    return np.dtype(np.uint16) if name == BFLOAT16 else np.dtype(name)


def to_disk(array: np.ndarray) -> np.ndarray:
    """``array`` as it is written: a bfloat16 array as its bits (see BFLOAT16)."""
    return array.view(np.uint16) if array.dtype.name == BFLOAT16 else array


def from_disk(array: np.ndarray, name: str) -> np.ndarray:
    """A read ``array`` as values of the dtype ``name`` it was written from (bfloat16: as
    TensorFlow's NumPy bfloat16)."""
    if name == BFLOAT16 and array.dtype == np.uint16:
        import tensorflow as tf  # only here: reading other arrays needs no TensorFlow

        return array.view(tf.bfloat16.as_numpy_dtype)
    return array
