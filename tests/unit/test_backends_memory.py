"""Tables that cannot fit are refused before allocating (backends/memory.py): the busiest
rank, its largest table and the bytes named; a cgroup's limit counts, its file cache does not."""

import pytest

from merlin_models_de.backends.memory import cgroup_headroom_bytes, check_fits
from merlin_models_de.planner import plan
from merlin_models_de.tables import FeatureSpec, TableSpec

TABLES = [
    TableSpec("big", 1000, 16, (FeatureSpec("big", "big"),)),
    TableSpec("small", 10, 16, (FeatureSpec("small", "small"),)),
]


def test_the_busiest_rank_is_checked_against_its_share_of_the_host():
    two = plan(TABLES, 2)  # 64000 bytes on one rank, 640 on the other
    check_fits(two, 4, ranks_per_host=2, host_bytes=2 * 64000)
    check_fits(two, 4, ranks_per_host=2, host_bytes=None)  # unknown: no check
    with pytest.raises(MemoryError, match=r"table 'big'.*rows=1000 dim=16") as err:
        check_fits(two, 4, ranks_per_host=2, host_bytes=2 * 64000 - 2)
    assert f"Rank {two.shards_of('big')[0].rank} would hold 62.5 KiB" in str(err.value)


def test_the_key_maps_of_dynamic_tables_count():
    from merlin_models_de.planner.types import KEY_MAP_BYTES_PER_ROW
    from merlin_models_de.tables import DynamicTable

    dynamic = [TableSpec("big", 1000, 16, (FeatureSpec("big", "big"),), dynamic=DynamicTable(1000))]
    one = plan(dynamic, 1)
    held = 1000 * 16 * 4 + 1000 * KEY_MAP_BYTES_PER_ROW
    check_fits(one, 4, ranks_per_host=1, host_bytes=held)
    with pytest.raises(MemoryError, match=r"table 'big'"):
        check_fits(one, 4, ranks_per_host=1, host_bytes=held - 1)


def _cgroup(directory, limit, current, inactive):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "memory.max").write_text(f"{limit}\n")
    (directory / "memory.current").write_text(f"{current}\n")
    (directory / "memory.stat").write_text(f"anon {current}\ninactive_file {inactive}\n")


def test_a_cgroup_v2_headroom_is_the_tightest_limit_above_the_process(tmp_path):
    root = tmp_path / "cgroup"
    _cgroup(root / "job", limit=1000, current=900, inactive=400)  # 1000 - (900 - 400) = 500
    _cgroup(root / "job" / "step", limit="max", current=100, inactive=0)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    membership = tmp_path / "cgroup_of_pid"
    membership.write_text("0::/job/step\n")
    assert cgroup_headroom_bytes(str(root), str(membership)) == 500
    _cgroup(root / "job" / "step", limit=300, current=100, inactive=0)
    assert cgroup_headroom_bytes(str(root), str(membership)) == 200
    (root / "cgroup.controllers").write_text("cpu\n")  # memory not controlled
    assert cgroup_headroom_bytes(str(root), str(membership)) is None
