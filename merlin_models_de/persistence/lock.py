"""One writer at a time in a checkpoint directory: an exclusive lock file.

A save takes ``directory/.lock`` (created with its holder in it by a hard link, which like
``O_CREAT | O_EXCL`` fails when the file exists, so exactly one writer succeeds) for as long
as it writes, and removes it at the end. The file names its holder: host, boot, PID
namespace, pid and the pid's start time, launch, job and wall-clock start. A second job that
tries to save meanwhile is refused with an error naming that holder, instead of both writing
(and pruning) the same directory.

A lock is *stale* -- taken over with a warning, the leftovers of its holder's save removed
by the new holder -- only when its holder provably cannot be writing any more:

- on this host, in this PID namespace: its pid no longer runs, or runs another process
  (another start time, the pid reused). A pid says nothing outside its namespace: containers
  that share a host name (pods with host networking) each have a process 1, so a holder in
  another namespace -- or in an unknown one: a lock of an earlier version -- is never judged
  by its pid;
- this host restarted since (another boot id, and the lock is older than this boot: a
  younger lock with another boot id comes from another machine of the same name);
- from this very launch (the same ``horovodrun``, or the same SLURM job *step*; an elastic
  job's rank 0 lost mid-save, seen from the new rank 0 on another host): saves are
  collective, so while this rank 0 saves no other rank of its launch is saving. A scheduler's
  job id alone proves nothing: the job steps of one allocation share it;
- an empty lock older than :data:`EMPTY_STALE_SECONDS` (its writer died between creating
  and writing it: a holder writes it at once).

Anything else blocks: a live holder, and a holder whose processes cannot be seen from here
(another host, another PID namespace) or an unreadable lock until it is
:data:`STALE_AFTER_SECONDS` old. The error says which file to delete, after checking what,
to release it sooner. A holder whose lock was taken over all the same (it saved for longer
than that) finds out before it commits (:meth:`DirectoryLock.check_held`) and raises naming
the lock and the job that took it, instead of failing on files the taker removed.

Example:
    >>> with DirectoryLock("ckpt/") as lock:  # doctest: +SKIP
    ...     write(lock.token)
"""

from __future__ import annotations

import errno
import json
import os
import time
import uuid
import warnings

from merlin_models_de.persistence.holder import (
    boot_time,
    describe,
    is_holder,
    process_start,
    this_holder,
)
from merlin_models_de.persistence.io import StorageError

LOCK = ".lock"
# A lock from another host is trusted this long (a save of the largest tables takes minutes).
STALE_AFTER_SECONDS = 6 * 3600
# A holder writes its lock at once: an empty one this old has lost its writer.
EMPTY_STALE_SECONDS = 5.0
# errors of ``link`` on file systems without hard links (the lock is then made in two steps)
_NO_LINKS = (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EXDEV, errno.EMLINK)


class CheckpointLockedError(StorageError):
    """Another live job holds the checkpoint directory (the message names it)."""


class DirectoryLock:
    """The exclusive right to write ``directory`` (see the module doc)."""

    def __init__(self, directory: str):
        self.directory = directory
        self.path = os.path.join(directory, LOCK)
        self.token = uuid.uuid4().hex[:16]
        self.holder = this_holder(self.token)
        self.took_over = False  # True when a stale lock was replaced: its leftovers are ours

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()

    def acquire(self) -> None:
        """Takes the lock, or raises :class:`CheckpointLockedError` naming its holder and
        how to release it."""
        os.makedirs(self.directory, exist_ok=True)
        for _ in range(3):  # a lock removed between our attempts is retried, not misread
            if self._create():
                return
            other = self._read_settled()
            if other is None:
                continue
            why = self._stale(other)
            if why is None:
                raise CheckpointLockedError(self._refusal(other))
            shown = describe(other) if is_holder(other) else f"content {other[:200]!r}"
            warnings.warn(
                f"Taking over the stale lock {self.path} of {shown}: {why}.",
                RuntimeWarning,
                stacklevel=3,
            )
            if self._read() == other:  # nobody else took it over meanwhile
                _remove(self.path)
                self.took_over = True
        raise CheckpointLockedError(
            f"Could not take the lock {self.path}: other jobs keep "
            f"taking it. Received: directory={self.directory!r}"
        )

    def release(self) -> None:
        """Removes the lock file if it is still ours."""
        other = self._read()
        if isinstance(other, dict) and other.get("token") == self.token:
            _remove(self.path)

    def _create(self) -> bool:
        """Creates the lock with its holder already in it, or returns False if it exists.

        The holder is written to a file of this writer's own, which is then hard-linked as
        the lock: ``link`` fails when the lock exists, like ``O_EXCL``, and a job that finds
        the lock always finds its holder. Where the file system has no hard links, the lock
        is created with ``O_EXCL`` and written after; :meth:`_read_settled` waits out that
        moment.
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
                raise StorageError(
                    f"Cannot create the checkpoint lock {self.path}: {exc.strerror or exc}"
                ) from exc
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
            raise StorageError(
                f"Cannot create the checkpoint lock {self.path}: {exc.strerror or exc}"
            ) from exc

    def _write(self, fd: int) -> None:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(self.holder, f)
            f.flush()
            os.fsync(f.fileno())

    def _read(self):
        """The lock's content: its holder (a dict naming host and pid), else the text as it
        is (``""`` when empty); None when there is no lock."""
        try:
            with open(self.path, encoding="utf-8", errors="replace") as f:
                text = f.read(65536)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return f"<unreadable: {exc.strerror or exc}>"
        try:
            value = json.loads(text)
        except ValueError:
            return text
        return value if is_holder(value) else text

    def _read_settled(self):
        """:meth:`_read`, waiting while the lock is empty and younger than
        :data:`EMPTY_STALE_SECONDS` (a holder without hard links is writing it now)."""
        other = self._read()
        while other == "" and (self._age() or 0.0) < EMPTY_STALE_SECONDS:
            time.sleep(0.1)
            other = self._read()
        return other

    def _stale(self, other) -> str | None:
        """Why the lock holding ``other`` is stale, or None when its holder may still write."""
        age = self._age()
        if other == "":
            return f"it has been empty for {age or 0.0:.0f} s (its writer died creating it)"
        where = self._where(other)
        if where == "restarted":
            return "this host restarted since it was taken"
        if where == "here":
            return self._gone_here(other)  # seen: alive or provably gone
        if (
            is_holder(other)
            and other.get("launch") is not None
            and other.get("launch") == self.holder["launch"]
        ):
            # saves are collective: no other rank of this launch is saving now
            return "this launch left it (a save interrupted by a lost rank or host)"
        if age is not None and age > STALE_AFTER_SECONDS:
            return f"it is {age / 3600:.1f} h old (more than {STALE_AFTER_SECONDS / 3600:g} h)"
        return None

    def _where(self, other) -> str:
        """Where the holder ``other`` runs, as far as this process can see: ``"here"`` (this
        host and PID namespace: its pid can be checked), ``"restarted"`` (this host before
        its last boot), ``"namespace"`` (this host name, another or an unknown PID
        namespace), ``"machine"`` (this host name, another machine) or ``"elsewhere"``."""
        mine = self.holder
        if not is_holder(other) or other["host"] != mine["host"]:
            return "elsewhere"
        boot = other.get("boot")
        if boot is not None and mine["boot"] is not None and boot != mine["boot"]:
            booted, written = boot_time(), self._written()
            if booted is not None and written is not None and written < booted:
                return "restarted"
            return "machine"  # a lock written since this boot under another boot id
        if other.get("pid_ns") is None or other["pid_ns"] != mine["pid_ns"]:
            return "namespace"
        return "here"

    def _gone_here(self, other: dict) -> str | None:
        """Why the holder in this host's PID namespace is gone, or None while it runs."""
        pid, start = other["pid"], other.get("pid_start")
        if pid == os.getpid() and start in (None, self.holder["pid_start"]):
            return "this process left it (an interrupted save)"  # its saves run in turn
        runs, now = process_start(pid)
        if not runs:
            return f"process {pid} no longer runs on this host"
        if start is not None and now is not None and now != start:
            return (
                f"process {pid} on this host is not its holder (it started at tick {now}, "
                f"the holder at {start}: the pid was reused)"
            )
        return None

    def check_held(self) -> None:
        """Raises :class:`CheckpointLockedError` when this writer no longer holds the lock
        (see :meth:`lost`); a writer checks before it commits."""
        problem = self.lost()
        if problem:
            raise CheckpointLockedError(problem)

    def lost(self) -> str | None:
        """None while this writer holds the lock; else why not, naming the lock and the job
        that took it over (as stale: see the module doc) -- the taker removes what it finds
        of this writer's save."""
        other = self._read()
        if isinstance(other, dict) and other.get("token") == self.token:
            return None
        if other is None:
            taker = "it is gone (deleted by hand, or taken over by a job that finished since)"
        elif is_holder(other):
            taker = f"it now names another job ({describe(other)})"
        else:
            taker = f"it now holds {other[:200]!r}"
        return (
            f"This save lost the lock {self.path} of {self.directory} while it wrote: {taker}. "
            f"Another job judged this one gone and took the directory over (its save "
            f"removes what it finds of this one), so this save stops without committing "
            f"anything. Two "
            f"jobs must not save into one directory: give each its own. Received: "
            f"lock={self.path!r}, holder={describe(self.holder)}"
        )

    def _refusal(self, other) -> str:
        """The error for a lock that is not stale: who holds it, and how to release it."""
        where = f"Received: directory={self.directory!r}"
        if not is_holder(other):
            return (
                f"The checkpoint lock {self.path} does not name its holder (it holds "
                f"{other[:200]!r}), so no save can tell whether that job still writes "
                f"{self.directory}. Make sure no job saves there (your scheduler's running "
                f"jobs; the processes on the hosts that share it), then delete {self.path}. "
                f"It is taken over by itself once it is {STALE_AFTER_SECONDS / 3600:g} h "
                f"old. {where}"
            )
        held = (
            f"Checkpoint directory {self.directory} is being written by another job "
            f"({describe(other)}). Two jobs must not save into one directory: use another "
            f"directory, or wait for that job"
        )
        seen = self._where(other)
        if seen == "here":
            return f"{held} (process {other['pid']} runs on this host). {where}"
        host, pid = other["host"], other["pid"]
        if seen == "namespace":
            unseen = (
                f"Its process {pid} runs in "
                + (
                    f"another PID namespace of host {host!r} ({other['pid_ns']}; this "
                    f"process: {self.holder['pid_ns']}), a container sharing the host name"
                    if other.get("pid_ns")
                    else f"an unknown PID namespace of host {host!r} (the lock does not "
                    f"record it: an earlier version wrote it)"
                )
                + ", whose processes cannot be seen from here"
            )
            check = f"`ps -p {pid}` in that container"
        elif seen == "machine":
            unseen = (
                f"It was written by a machine named {host!r} like this one that booted "
                f"otherwise (boot id {other.get('boot')}), whose processes cannot be seen "
                f"from here"
            )
            check = f"`ps -p {pid}` on that machine"
        else:
            unseen = f"This host cannot see the processes of host {host!r}"
            check = f"`ps -p {pid}` on {host}"
        job = f" or job {other['job']} in your scheduler" if other.get("job") else ""
        return (
            f"{held}. {unseen}: if that job is gone (check {check}{job}), delete "
            f"{self.path}; the next save then removes what its save left. It is taken over "
            f"by itself once it is {STALE_AFTER_SECONDS / 3600:g} h old. {where}"
        )

    def _written(self) -> float | None:
        """When the lock file was last written (seconds since the epoch); None when gone."""
        try:
            return os.path.getmtime(self.path)
        except OSError:
            return None

    def _age(self) -> float | None:
        """Seconds since the lock file was last written; None when it is gone."""
        written = self._written()
        return None if written is None else time.time() - written


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass
