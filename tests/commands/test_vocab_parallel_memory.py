"""The vocab-parallel loss never forms the [batch, catalog] logits: a 10x larger catalog
raises one step's peak memory by about the table and its gradient, not by the logits."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BATCH, DIM, CHUNK = 512, 16, 4096


def measure(catalog):
    env = dict(
        os.environ,
        CUDA_VISIBLE_DEVICES="",
        TF_CPP_MIN_LOG_LEVEL="2",
        OMP_NUM_THREADS="1",
        TF_NUM_INTRAOP_THREADS="1",
        TF_NUM_INTEROP_THREADS="1",
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.commands.vocab_parallel_memory",
            str(catalog),
            str(BATCH),
            str(DIM),
            str(CHUNK),
        ],
        cwd=ROOT,
        env=env,
        timeout=300,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_peak_memory_grows_with_the_table_not_with_the_logits():
    small, large = measure(30_000), measure(300_000)
    growth = {k: m["after"] - m["before"] for k, m in (("small", small), ("large", large))}
    # the step's own growth: at most the table's gradient, a copy, and the chunk temporaries
    # (~[batch, chunk] floats); the full logits of the large catalog alone are 614 MB
    assert growth["large"] < 3 * large["table"] + 4 * BATCH * CHUNK * 4 * 4, growth
    assert growth["large"] < large["full_logits"] / 4, growth
    # and the whole process: a 10x catalog, less than 2x the peak
    assert large["after"] < 2 * small["after"], (small, large)
