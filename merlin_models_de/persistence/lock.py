"""One writer at a time in a checkpoint directory: an exclusive lock file.

A save takes ``directory/.lock`` (created with its holder in it by a hard link, which like
``O_CREAT | O_EXCL`` fails when the file exists, so exactly one writer succeeds) for as long
as it writes, and removes it at the end. The file names its holder: host, boot, pid and the
pid's start time, launch, job and wall-clock start. A second job that tries to save
meanwhile is refused with an error naming that holder, instead of both writing (and
pruning) the same directory.

A lock is *stale* -- taken over with a warning, the leftovers of its holder's save removed
by the new holder -- only when its holder provably cannot be writing any more:

- on this host: its pid no longer runs, or runs another process (another start time, the
  pid reused), or the host restarted since (another boot id);
- from this very launch (the same ``horovodrun``, or the same SLURM job *step*; an elastic
  job's rank 0 lost mid-save, seen from the new rank 0 on another host): saves are
  collective, so while this rank 0 saves no other rank of its launch is saving. A scheduler's
  job id alone proves nothing: the job steps of one allocation share it;
- an empty lock older than :data:`EMPTY_STALE_SECONDS` (its writer died between creating
  and writing it: a holder writes it at once).

Anything else blocks: a live holder, and a lock from another host (whose processes cannot be
seen from here) or an unreadable one until it is :data:`STALE_AFTER_SECONDS` old. The error
says which file to delete, after checking what, to release it sooner.

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

from merlin_models_de.persistence.io import StorageError

LOCK = ".lock"
# A lock from another host is trusted this long (a save of the largest tables takes minutes).
STALE_AFTER_SECONDS = 6 * 3600
# A holder writes its lock at once: an empty one this old has lost its writer.
EMPTY_STALE_SECONDS = 5.0
# errors of ``link`` on file systems without hard links (the lock is then made in two steps)
_NO_LINKS = (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EXDEV, errno.EMLINK)
_JOB_VARIABLES = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "JOB_ID")


class CheckpointLockedError(StorageError):
    """Another live job holds the checkpoint directory (the message names it)."""


def _launch_id() -> str | None:
    """One id per running launch: horovodrun's rendezvous address (one per running
    horovodrun, kept across an elastic job's resets), else the SLURM job step; else None."""
    rendezvous = [os.environ.get(f"HOROVOD_GLOO_RENDEZVOUS_{k}") for k in ("ADDR", "PORT")]
    if all(rendezvous):
        return "horovodrun@{}:{}".format(*rendezvous)
    step = [os.environ.get(k) for k in ("SLURM_JOB_ID", "SLURM_STEP_ID")]
    return "slurm-step@{}.{}".format(*step) if all(step) else None


def _job_id() -> str | None:
    """The scheduler's job id (for the messages: it names an allocation, not a launch)."""
    return next((os.environ[v] for v in _JOB_VARIABLES if os.environ.get(v)), None)


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip() or None
    except OSError:
        return None


def process_start(pid) -> tuple[bool, int | None]:
    """``(runs, start)`` of process ``pid`` on this host: whether it runs (a zombie does not)
    and its start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), None where
    the system does not say."""
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # after the name, which may hold ")"
        return fields[0] != "Z", int(fields[19])
    except FileNotFoundError:
        if os.path.exists("/proc/self/stat"):
            return False, None
    except (OSError, ValueError, IndexError, TypeError, OverflowError):
        pass
    return _alive(pid), None


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError, TypeError):
        return True  # exists (owned by someone else), or unreadable: assume it is alive
    return True


def describe(holder: dict) -> str:
    """``host=..., pid=..., job=..., launch=..., started=<UTC time>`` of a lock's holder."""
    started = holder.get("started")
    when = (
        time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started))
        if isinstance(started, (int, float))
        else repr(started)
    )
    return (
        f"host={holder.get('host')!r}, pid={holder.get('pid')!r}, "
        f"job={holder.get('job')!r}, launch={holder.get('launch')!r}, started={when}"
    )


def _is_holder(value) -> bool:
    """True for a lock's content that names a holder (a host and a pid)."""
    return (
        isinstance(value, dict)
        and isinstance(value.get("host"), str)
        and isinstance(value.get("pid"), int)
        and not isinstance(value.get("pid"), bool)
    )


class DirectoryLock:
    """The exclusive right to write ``directory`` (see the module doc)."""

    def __init__(self, directory: str):
        self.directory = directory
        self.path = os.path.join(directory, LOCK)
        self.token = uuid.uuid4().hex[:16]
        pid = os.getpid()
        self.holder = {
            "host": socket.gethostname(),
            "boot": _boot_id(),
            "pid": pid,
            "pid_start": process_start(pid)[1],
            "launch": _launch_id(),
            "job": _job_id(),
            "started": time.time(),
            "token": self.token,
        }
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
            shown = describe(other) if _is_holder(other) else f"content {other[:200]!r}"
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
                    f"Cannot create the checkpoint lock {self.path}: " f"{exc.strerror or exc}"
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
                f"Cannot create the checkpoint lock {self.path}: " f"{exc.strerror or exc}"
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
        return value if _is_holder(value) else text

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
        if _is_holder(other) and other["host"] == self.holder["host"]:
            return self._gone_here(other)
        if (
            _is_holder(other)
            and other.get("launch") is not None
            and other.get("launch") == self.holder["launch"]
        ):
            # saves are collective: no other rank of this launch is saving now
            return "this launch left it (a save interrupted by a lost rank or host)"
        if age is not None and age > STALE_AFTER_SECONDS:
            return f"it is {age / 3600:.1f} h old (more than {STALE_AFTER_SECONDS / 3600:g} h)"
        return None

    def _gone_here(self, other: dict) -> str | None:
        """Why the holder on this host is gone, or None while it runs."""
        boot = other.get("boot")
        if boot is not None and self.holder["boot"] is not None and boot != self.holder["boot"]:
            return "this host restarted since it was taken"
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

    def _refusal(self, other) -> str:
        """The error for a lock that is not stale: who holds it, and how to release it."""
        where = f"Received: directory={self.directory!r}"
        if not _is_holder(other):
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
        if other["host"] == self.holder["host"]:
            return f"{held} (process {other['pid']} runs on this host). {where}"
        job = f" or job {other['job']} in your scheduler" if other.get("job") else ""
        return (
            f"{held}. This host cannot see the processes of host {other['host']!r}: if "
            f"that job is gone (check `ps -p {other['pid']}` on {other['host']}{job}), "
            f"delete {self.path}; the next save then removes what its save left. It is "
            f"taken over by itself once it is {STALE_AFTER_SECONDS / 3600:g} h old. "
            f"{where}"
        )

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
