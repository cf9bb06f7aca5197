"""What a writer flushes to disk and when: every fsync (the path behind its descriptor),
rename, replace and directory exchange, in order. A spy: each call still runs (only a power
loss would show what the flushes protect)."""

import os

import pytest

from merlin_models_de.persistence import io


def record_flushes(monkeypatch):
    """Starts recording; returns the list of events ``(kind, path[, destination])``."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc to name the file behind a descriptor")
    events = []
    real = {name: getattr(os, name) for name in ("fsync", "rename", "replace")}
    real_exchange = io._exchange

    def fsync(fd):
        events.append(("fsync", os.path.realpath(f"/proc/self/fd/{fd}")))
        return real["fsync"](fd)

    def move(name):
        def run(src, dst, *args, **kwargs):
            events.append((name, os.path.realpath(src), os.path.realpath(dst)))
            return real[name](src, dst, *args, **kwargs)

        return run

    def exchange(a, b):
        done = real_exchange(a, b)
        if done:
            events.append(("exchange", os.path.realpath(a), os.path.realpath(b)))
        return done

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", move("rename"))
    monkeypatch.setattr(os, "replace", move("replace"))
    monkeypatch.setattr(io, "_exchange", exchange)
    return events


def on_disk(events, until: int) -> set:
    """The paths whose content was flushed before event ``until``: fsync'ed there, or renamed
    there from a path that was (a file written aside, then renamed over its target)."""
    flushed = set()
    for event in events[:until]:
        if event[0] == "fsync":
            flushed.add(event[1])
        elif event[0] in ("rename", "replace") and event[1] in flushed:
            flushed.add(event[2])
    return flushed
