"""The bench's runs (apps/bench/runs.py): the one-process baseline trains the global batch at
n times the rate, and local horovodrun lines keep Gloo on loopback."""

import json

from merlin_models_de.apps.bench.runs import baseline_and_ranks_args, horovodrun, write_results


def test_the_baseline_takes_the_global_batch_at_n_times_the_rate():
    single, ranks = baseline_and_ranks_args(["--steps", "5"], 64, 0.01, 4)
    assert single == ["--steps", "5", "--embeddings", "merlin", "--batch-size", "256",
                      "--learning-rate", "0.04"]  # fmt: skip
    assert ranks == ["--steps", "5", "--batch-size", "64", "--learning-rate", "0.01"]


def test_local_runs_stay_on_loopback_and_host_runs_take_the_hosts():
    assert horovodrun(2, ["python", "x.py"]) == [
        "horovodrun", "--gloo", "-np", "2", "-H", "localhost:2", "--network-interface", "lo",
        "python", "x.py",
    ]  # fmt: skip
    line = horovodrun(4, ["x"], hosts="a:2,b:2")
    assert line[line.index("-H") + 1] == "a:2,b:2" and "--network-interface" not in line
    assert horovodrun(4, ["x"], hosts="a:2,b:2", network_interface="eth1")[7] == "eth1"


def test_results_are_the_payload_as_json_and_the_table_as_markdown(tmp_path):
    write_results(str(tmp_path), "dlrm", "| a |", {"rows": [1]})
    assert json.loads((tmp_path / "dlrm.json").read_text()) == {"rows": [1]}
    assert (tmp_path / "dlrm.md").read_text() == "| a |\n"
