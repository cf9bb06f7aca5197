"""A command's run report (apps/common/reports.py): the host's stolen ticks read from
/proc/stat, huge pages from smaps_rollup, and rank 0 writing the JSON."""

import json

from merlin_models_de.apps.common import reports


def test_stolen_and_all_ticks_of_the_host(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  10 0 5 80 1 0 0 4 7 0\ncpu0 5 0 2 40 0 0 0 2 0 0\n")
    assert reports.host_cpu_ticks(str(stat)) == (4, 100)  # guest time is inside user
    stat.write_text("intr 1 2 3\n")
    assert reports.host_cpu_ticks(str(stat)) is None
    assert reports.host_cpu_ticks(str(tmp_path / "missing")) is None


def test_huge_pages_are_read_in_bytes_or_none(tmp_path):
    rollup = tmp_path / "smaps_rollup"
    rollup.write_text("Rss:  100 kB\nAnonHugePages:  2048 kB\n")
    assert reports.huge_page_bytes(str(rollup)) == 2 * 2**20
    assert reports.huge_page_bytes(str(tmp_path / "missing")) is None


def test_rank_zero_writes_the_report_in_a_new_folder(tmp_path, capsys):
    path = tmp_path / "runs" / "report.json"
    reports.write_report(str(path), {"steps": 3})
    assert json.loads(path.read_text()) == {"steps": 3}
    assert f"Report: {path}" in capsys.readouterr().out
    reports.write_report(None, {"steps": 3})  # no path: nothing written, no error
