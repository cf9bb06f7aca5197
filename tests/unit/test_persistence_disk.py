"""Disk space and write errors (persistence/disk.py): a save that cannot fit stops before
writing, naming the folder, both sizes and the rank; a write error names the file."""

import errno

import pytest

from merlin_models_de.persistence import disk


def test_human_bytes_picks_the_unit():
    assert disk.human_bytes(1000) == "1000 B"
    assert disk.human_bytes(1536) == "1.5 KiB"
    assert disk.human_bytes(3 * 2**30) == "3.0 GiB"
    assert disk.human_bytes(5 * 2**40) == "5.0 TiB"


def test_a_save_larger_than_the_free_space_is_refused_before_writing(tmp_path):
    free = disk.free_bytes(str(tmp_path / "not" / "made" / "yet"))  # nearest existing parent
    assert free is not None and free > 0
    disk.check_free_space(str(tmp_path), 1, "a checkpoint")
    needed = free + 2**40
    with pytest.raises(
        OSError, match=f"{tmp_path} for a checkpoint .*rank 0.*needed={needed}"
    ) as err:
        disk.check_free_space(str(tmp_path), needed, "a checkpoint")
    assert err.value.errno == errno.ENOSPC


def test_a_write_failure_names_the_file_the_rank_and_the_cause():
    err = disk.write_failure("/ckpt/step_3/a.npy", OSError(errno.EDQUOT, "quota"))
    assert err.errno == errno.EDQUOT
    assert "Cannot write /ckpt/step_3/a.npy on rank 0" in str(err) and "EDQUOT" in str(err)


def test_npy_bytes_is_the_data_plus_a_header_bound():
    assert disk.npy_bytes((10, 4), 4) == 160 + 4096
    assert disk.npy_bytes((), 8) == 8 + 4096
