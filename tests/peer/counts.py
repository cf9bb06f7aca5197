"""Per-file counts of a peer run from the plugin's records (tests/peer/mmde_swap.py).

Usage: python tests/peer/counts.py OUT_DIR TAG SELECTION_FILE
       python tests/peer/counts.py --check-lists XFAIL_FILE SELECTION_FILE...
         (every expected failure names a selected test, no test is selected twice)

Prints, per Merlin test file, how many selected tests passed / failed / xfailed / xpassed /
were skipped / errored (per rank under horovodrun), the failures with their first error line,
and checks the run: every selected test reported on every rank, ranks agree, and every
selected test built at least one block (else it does not test the swap; a test marked
``# no block: <reason>`` in its selection file is exempt). Exit code 1 when a
check fails; pytest's own exit code decides pass/fail of the tests.
"""

import collections
import glob
import json
import os
import re
import sys

OUTCOMES = ("passed", "failed", "xfailed", "xpassed", "skipped", "error")


def ids_of(path):
    with open(path) as f:
        return [
            line.split("#", 1)[0].split("|", 1)[0].strip()
            for line in f
            if line.split("#", 1)[0].strip()
        ]


NO_BLOCK = "# no block:"  # a selected test that builds no Embeddings block, with the reason


def builds_no_block(path):
    """Selected tests marked ``<node id>  # no block: <reason>`` (Merlin's own Horovod tests
    include a V1 two-tower model, which makes its tables without ``mm.Embeddings``)."""
    with open(path) as f:
        return {line.split("#", 1)[0].strip() for line in f if NO_BLOCK in line}


def load(out, tag):
    """``{rank label: {node id: record}}``; the call record wins over setup/teardown ones."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(out, f"{tag}*.results.jsonl"))):
        label = path[len(os.path.join(out, tag)) : -len(".results.jsonl")].lstrip(".")
        label = re.sub(r"\.?gw\d+$", "", label) or "-"  # pytest-xdist workers: one run
        recs = runs.setdefault(label, {})
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                prev = recs.get(rec["test"])
                if prev is None or prev["outcome"] in ("passed", "xfailed", "xpassed", "skipped"):
                    recs[rec["test"]] = rec
    return runs


def main(out, tag, selection):
    selected = ids_of(selection)
    no_block = builds_no_block(selection)
    runs = load(out, tag)
    problems = []
    if not runs:
        print(f"[peer] no records for {tag} in {out}")
        return 1
    files = sorted({t.split("::")[0] for t in selected})
    for label, recs in runs.items():
        print(f"[peer] {tag} rank {label}: per-file counts")
        print(f"  {'file':48s} " + " ".join(f"{o:>7s}" for o in OUTCOMES))
        total = collections.Counter()
        for fname in files:
            c = collections.Counter(
                recs[t]["outcome"] for t in selected if t.split("::")[0] == fname and t in recs
            )
            total.update(c)
            short = fname.replace("tests/unit/tf/", "")
            print(f"  {short:48s} " + " ".join(f"{c[o]:7d}" for o in OUTCOMES))
        print(
            f"  {'total (' + str(len(selected)) + ' selected)':48s} "
            + " ".join(f"{total[o]:7d}" for o in OUTCOMES)
        )
        for t in selected:
            rec = recs.get(t)
            if rec is None:
                problems.append(f"rank {label}: no result for {t}")
            elif rec["outcome"] in ("failed", "error"):
                print(f"  FAILED {t}: {rec.get('error', '')}")
            elif rec["outcome"] == "xpassed":
                print(f"  XPASS  {t} (passes now: remove it from the xfail list)")
            if (
                rec is not None
                and rec["outcome"] == "passed"
                and rec.get("built", 1) == 0
                and t not in no_block
            ):
                problems.append(f"rank {label}: {t} passed without building an Embeddings block")
    labels = list(runs)
    for t in selected:
        seen = {lab: runs[lab][t]["outcome"] for lab in labels if t in runs[lab]}
        if len(set(seen.values())) > 1:
            problems.append(f"ranks disagree on {t}: {seen}")
    for p in problems:
        print(f"[peer] CHECK FAILED: {p}")
    return 1 if problems else 0


def check_lists(xfail, *selections):
    """Stale or mistyped list entries fail before the (long) run starts."""
    problems = []
    selected = set()
    for path in selections:
        ids = ids_of(path)
        problems += [
            f"{path}: {t} listed twice" for t, n in collections.Counter(ids).items() if n > 1
        ]
        selected.update(ids)
    problems += [f"{xfail}: {t} is in no selection" for t in ids_of(xfail) if t not in selected]
    for p in problems:
        print(f"[peer] LIST ERROR: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--check-lists"]:
        sys.exit(check_lists(*sys.argv[2:]))
    sys.exit(main(*sys.argv[1:]))
