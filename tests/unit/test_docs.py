"""Every ``python`` and ``bash`` block of README.md and docs/*.md runs as written, on the
README's small data, in one working directory shared in page order (README first: its
``make_data.py`` makes the data the later blocks read).

- A python block runs as a file in its own process; when its first line says
  ``launched with: horovodrun -np 2 python <file>``, under ``horovodrun -np 2`` on local ranks.
- A bash block runs with ``bash -e``, as written (its own ``horovodrun`` lines included).
- A block right after ``<!-- docs-test: skip (why) -->`` is not run (a real cluster, a GPU,
  the CI itself); :func:`test_skipped_blocks_stay_few` lists them and keeps them few.
Blocks of other languages (``text``, none) are not code and are not run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP = re.compile(r"^<!-- docs-test: skip \((?P<why>[^)]+)\) -->$")
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\s*$")
HOROVOD = re.compile(r"^# (?P<file>[\w.-]+\.py), launched with: horovodrun -np 2 python ")
FILE = re.compile(r"^# (?P<file>[\w.-]+\.py)\b")
RUN = ("python", "bash")
# skipped blocks that no test of the repository runs either: a cluster, a GPU, the CI itself
MAX_UNTESTED = 6
TESTED_BY = re.compile(r"\btests/[\w/.]+")  # a skip note may name the test that runs the block
TIMEOUT = 600


def pages() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def blocks_of(path: Path) -> list[dict]:
    """The fenced blocks of ``path``: language, code, first line number, skip reason."""
    lines = path.read_text().split("\n")
    found, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        skip = SKIP.match(lines[i - 1]) if i else None
        found.append(
            {
                "page": path.relative_to(ROOT).as_posix(),
                "line": i + 1,
                "lang": match["lang"],
                "code": "\n".join(lines[i + 1 : end]) + "\n",
                "skip": skip["why"] if skip else None,
            }
        )
        i = end + 1
    return found


def all_blocks(lang=RUN) -> list[dict]:
    return [b for page in pages() for b in blocks_of(page) if b["lang"] in lang]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A fresh directory that reads like the repository's root for the pages' relative paths
    (``examples/...``, ``scripts/...``), so nothing a block writes lands in the repository."""
    path = tmp_path_factory.mktemp("docs")
    for name in ("examples", "scripts"):
        (path / name).symlink_to(ROOT / name, target_is_directory=True)
    return path


def command_for(block: dict, workdir: Path) -> list[str]:
    if block["lang"] == "bash":
        return ["bash", "-e", "-o", "pipefail", "-c", block["code"]]
    first = block["code"].split("\n", 1)[0]
    named = FILE.match(first)
    script = workdir / (named["file"] if named else f"block_{block['line']}.py")
    script.write_text(block["code"])
    if HOROVOD.match(first):
        return [
            "horovodrun",
            "--gloo",
            "-np",
            "2",
            "-H",
            "localhost:2",
            "--network-interface",
            "lo",
            sys.executable,
            script.name,
        ]
    return [sys.executable, script.name]


@pytest.mark.parametrize("block", all_blocks(), ids=lambda b: f"{b['page']}:{b['line']}")
def test_block_runs_as_written(block, workdir):
    if block["skip"]:
        pytest.skip(f"marked: {block['skip']}")
    env = dict(
        os.environ,
        TF_CPP_MIN_LOG_LEVEL="3",
        PYTHONWARNINGS="ignore",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONPATH=str(ROOT),
    )
    done = subprocess.run(
        command_for(block, workdir),
        cwd=workdir,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, (
        f"{block['page']}:{block['line']} exited with {done.returncode}:\n{block['code']}\n"
        f"--- output (last 4000 characters) ---\n{done.stdout[-4000:]}"
    )


def test_skipped_blocks_stay_few(capsys):
    """A skipped block needs what this test cannot give (root, a cluster, a GPU, the CI
    itself); one that another test runs (root's network namespaces: tests/multihost) names
    that test, which must exist. Those that nothing runs stay few."""
    skipped = [b for b in all_blocks() if b["skip"]]
    with capsys.disabled():
        print(f"\n[docs] {len(skipped)} of {len(all_blocks())} code blocks not run:")
        for b in skipped:
            print(f"[docs]   {b['page']}:{b['line']}: {b['skip']}")
    named = {f"{b['page']}:{b['line']}": TESTED_BY.findall(b["skip"]) for b in skipped}
    missing = {k: p for k, paths in named.items() for p in paths if not (ROOT / p).exists()}
    assert not missing, f"skip notes name tests that do not exist: {missing}"
    untested = [k for k, paths in named.items() if not paths]
    assert len(untested) <= MAX_UNTESTED, untested


def test_the_extractor_sees_the_markers_and_the_launchers():
    readme = {b["line"]: b for b in blocks_of(ROOT / "README.md")}
    launched = [
        b
        for b in readme.values()
        if b["lang"] == "python" and HOROVOD.match(b["code"].split("\n", 1)[0])
    ]
    assert launched, "the README's ranking quick start runs under horovodrun"
    assert any(b["skip"] and "bash ci/test.sh" in b["code"] for b in readme.values())
    assert all(b["code"].strip() for b in all_blocks())
