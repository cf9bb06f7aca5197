"""One writer at a time in a checkpoint directory: an exclusive lock file.

A save takes ``directory/.lock`` (created with its holder in it by a hard link, which like
``O_CREAT | O_EXCL`` fails when the file exists, so exactly one writer succeeds) for as long
as it writes, and removes it at the end. The file names its holder:
host, pid, job id and start time. A second job that tries to save meanwhile is refused with
an error naming that holder, instead of both writing (and pruning) the same directory.

A lock is *stale* when its holder cannot be writing any more: it is this job's own (an
elastic job's rank 0 lost mid-save), its pid is gone on this host, or (another host, whose
processes cannot be seen from here) it is older than :data:`STALE_AFTER_SECONDS`. A stale lock is taken over with a warning, and the leftovers of
the saves of earlier holders are theirs to lose: the new holder removes them.

Example:
    >>> with DirectoryLock("ckpt/") as lock:  # doctest: +SKIP
    ...     write(lock.token)
"""
from __future__ import annotations

import errno
import json
import os
import socket
import time
import uuid
import warnings

from merlin_models_de.persistence.files import StorageError

LOCK = ".lock"
# A lock from another host is trusted this long (a save of the largest tables takes minutes).
STALE_AFTER_SECONDS = 6 * 3600
# errors of ``link`` on file systems without hard links (the lock is then made in two steps)
_NO_LINKS = (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EXDEV,
             errno.EMLINK)
# how long a lock made in two steps may be seen empty before it is judged as it is
_WRITING_SECONDS = 0.5
_JOB_VARIABLES = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID", "HOROVOD_JOB_ID")


class CheckpointLockedError(StorageError):
    """Another live job holds the checkpoint directory (the message names it)."""


def _job_id() -> str | None:
    """The scheduler's job id, else horovodrun's rendezvous address (one per running job,
    kept across an elastic job's resets), else None."""
    found = next((os.environ[v] for v in _JOB_VARIABLES if os.environ.get(v)), None)
    rendezvous = [os.environ.get(f"HOROVOD_GLOO_RENDEZVOUS_{k}") for k in ("ADDR", "PORT")]
    if found is None and all(rendezvous):
        found = "horovodrun@{}:{}".format(*rendezvous)
    return found


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError, TypeError):
        return True  # exists (owned by someone else), or unreadable: assume it is alive
    return True


def describe(holder: dict) -> str:
    """``host=..., pid=..., job=..., started=<UTC time>`` of a lock's holder."""
    started = holder.get("started")
    when = (time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started))
            if isinstance(started, (int, float)) else repr(started))
    return (f"host={holder.get('host')!r}, pid={holder.get('pid')!r}, "
            f"job={holder.get('job')!r}, started={when}")


class DirectoryLock:
    """The exclusive right to write ``directory`` (see the module doc)."""

    def __init__(self, directory: str):
        self.directory = directory
        self.path = os.path.join(directory, LOCK)
        self.token = uuid.uuid4().hex[:16]
        self.holder = {"host": socket.gethostname(), "pid": os.getpid(), "job": _job_id(),
                       "started": time.time(), "token": self.token}
        self.took_over = False  # True when a stale lock was replaced: its leftovers are ours

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()

    def acquire(self) -> None:
        """Takes the lock, or raises :class:`CheckpointLockedError` naming its live holder."""
        os.makedirs(self.directory, exist_ok=True)
        for _ in range(3):  # a lock removed between our attempts is retried, not misread
            if self._create():
                return
            other = self._read()
            age = self._age() if other == {} else None  # an empty lock: how new is it
            if age is not None and age < _WRITING_SECONDS:
                time.sleep(_WRITING_SECONDS)  # a holder without hard links writing it now
                other = self._read()
            if other is None:
                continue
            why = self._stale(other)
            if why is None:
                raise CheckpointLockedError(
                    f"Checkpoint directory {self.directory} is being written by another job "
                    f"({describe(other)}). Two jobs must not save into one directory: use "
                    f"another directory, or wait for that job. If it is gone, remove "
                    f"{self.path}. Received: directory={self.directory!r}")
            warnings.warn(f"Taking over the stale lock {self.path} of {describe(other)}: "
                          f"{why}.", RuntimeWarning, stacklevel=3)
            if self._read() == other:  # nobody else took it over meanwhile
                _remove(self.path)
                self.took_over = True
        raise CheckpointLockedError(f"Could not take the lock {self.path}: other jobs keep "
                                    f"taking it. Received: directory={self.directory!r}")

    def release(self) -> None:
        """Removes the lock file if it is still ours."""
        other = self._read()
        if other is not None and other.get("token") == self.token:
            _remove(self.path)

    def _create(self) -> bool:
        """Creates the lock with its holder already in it, or returns False if it exists.

        The holder is written to a file of this writer's own, which is then hard-linked as
        the lock: ``link`` fails when the lock exists, like ``O_EXCL``, and a job that finds
        the lock always finds its holder (created empty and written after, a lock read in
        between named nobody). Where the file system has no hard links, the lock is created
        with ``O_EXCL`` and written after; :meth:`acquire` waits out that moment.
        """
        own = f"{self.path}.{self.token}"
        fd = self._new_file(own)
        if fd is None:
            return False
        try:
            self._write(fd)
            os.link(own, self.path)
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in _NO_LINKS:
                raise StorageError(f"Cannot create the checkpoint lock {self.path}: "
                                   f"{exc.strerror or exc}") from exc
        finally:
            _remove(own)
        fd = self._new_file(self.path)
        if fd is None:
            return False
        self._write(fd)
        return True

    def _new_file(self, path: str) -> int | None:
        """A descriptor of ``path``, created now; None when it exists."""
        try:
            return os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return None
        except OSError as exc:
            raise StorageError(f"Cannot create the checkpoint lock {self.path}: "
                               f"{exc.strerror or exc}") from exc

    def _write(self, fd: int) -> None:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(self.holder, f)
            f.flush()
            os.fsync(f.fileno())

    def _read(self):
        """The holder recorded in the lock file; None when it is gone; ``{}`` if unreadable
        (a holder that crashed while writing it, or a foreign file: judged by its age)."""
        try:
            with open(self.path, encoding="utf-8") as f:
                holder = json.load(f)
            return holder if isinstance(holder, dict) else {}
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}

    def _stale(self, other: dict) -> str | None:
        """Why ``other``'s lock is stale, or None when its holder may still be writing."""
        if other.get("job") is not None and other.get("job") == self.holder["job"]:
            # saves are collective: this job cannot be saving elsewhere at the same time
            return "this job left it (a save interrupted by a lost rank or host)"
        if other.get("host") == self.holder["host"] and "pid" in other:
            if other["pid"] == os.getpid():  # saves of one process run one after the other
                return "this process left it (an interrupted save)"
            if not _alive(other["pid"]):
                return f"process {other['pid']} no longer runs on this host"
        age = self._age()
        if age is None:
            return None
        if age > STALE_AFTER_SECONDS:
            return f"it is {age / 3600:.1f} h old (more than {STALE_AFTER_SECONDS / 3600:g} h)"
        return None

    def _age(self) -> float | None:
        """Seconds since the lock file was last written; None when it is gone."""
        try:
            return time.time() - os.path.getmtime(self.path)
        except OSError:
            return None


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
