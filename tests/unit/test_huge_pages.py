"""The commands on 2 MB pages (apps/common/huge_pages.py): when a command starts itself again
with glibc's huge page tunable, and that it does so once, in the same process, before its work."""

import os
import subprocess
import sys

import pytest

from merlin_models_de.apps.common.huge_pages import (
    glibc_version,
    relaunch_env,
    thp_mode,
)

ON = "glibc.malloc.hugetlb=1"


@pytest.mark.parametrize(
    "env, mode, glibc, tunables",
    [
        ({}, "madvise", (2, 36), ON),
        ({}, "always", (2, 35), ON),
        (
            {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"},
            "madvise",
            (2, 36),
            "glibc.malloc.arena_max=2:" + ON,
        ),
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, "madvise", (2, 36), None),  # the user's
        ({}, "never", (2, 36), None),  # the kernel's transparent huge pages are off
        ({}, None, (2, 36), None),  # no transparent huge pages (not Linux)
        ({}, "madvise", (2, 34), None),  # glibc before the tunable
        ({}, "madvise", None, None),  # another C library
    ],
)
def test_relaunch_adds_the_tunable_only_where_it_changes_something(env, mode, glibc, tunables):
    got = relaunch_env({"PATH": "/bin", **env}, mode, glibc)
    if tunables is None:
        assert got is None
    else:
        assert got == {"PATH": "/bin", "GLIBC_TUNABLES": tunables}


def test_the_kernel_mode_is_the_bracketed_word(tmp_path):
    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    assert thp_mode(str(setting)) == "madvise"
    assert thp_mode(str(tmp_path / "missing")) is None


# The DLRM command's front door, run as a program (argv None), as its console script does.
FRONT_DOOR = (
    "import os, sys\n"
    "print('started', os.getpid(), os.environ.get('GLIBC_TUNABLES'), flush=True)\n"
    "from merlin_models_de.apps.dlrm.options import check_host, check_options, parser\n"
    "from merlin_models_de.apps.common.options import checked_arguments\n"
    "args = checked_arguments(parser(), None, check_options, check_host)\n"
    "print('checked', os.getpid(), os.environ.get('GLIBC_TUNABLES'), flush=True)\n"
)


def _front_door(*options, **env):
    run = subprocess.run(
        [sys.executable, "-c", FRONT_DOOR, *options],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in {**os.environ, **env}.items() if v is not None},
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return [line.split() for line in run.stdout.splitlines()]


@pytest.mark.skipif(
    relaunch_env({}, thp_mode(), glibc_version()) is None,
    reason="this host's kernel or glibc gives no transparent huge pages",
)
def test_a_command_starts_itself_again_once_on_huge_pages():
    lines = _front_door("--rows", "1024", GLIBC_TUNABLES=None)
    (first, pid, before), (again, pid2, after), (checked, pid3, tunables) = lines
    assert (first, again, checked) == ("started", "started", "checked")
    assert pid == pid2 == pid3  # the same process, started again before its work
    assert before == "None" and after == tunables == ON


@pytest.mark.parametrize(
    "options, tunables",
    [
        (("--no-huge-pages",), None),  # 4 KB pages asked for
        ((), "glibc.malloc.hugetlb=0"),  # the user's own setting
    ],
)
def test_no_huge_pages_and_the_users_own_tunable_are_kept(options, tunables):
    lines = _front_door("--rows", "1024", *options, GLIBC_TUNABLES=tunables)
    assert [line[0] for line in lines] == ["started", "checked"]  # not started again
    assert lines[1][2] == str(tunables)
