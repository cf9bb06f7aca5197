"""Failing together (runtime/agree.py), in one process: a stage's error comes back as the
rank's own or as one message naming the rank, and the shared values come back in rank order.
(The same on 2 ranks, one rank failing alone: tests/ranks/test_errors.py.)"""

import pytest

from merlin_models_de.runtime.agree import on_every_rank, on_rank_zero


def _fails():
    raise OSError("disk full")


def test_results_and_shared_values_come_back():
    result, shared = on_every_rank("count rows", lambda: [1, 2, 3], share=len)
    assert result == [1, 2, 3] and shared == [3]


def test_the_failing_rank_raises_its_own_error_unless_wrapped():
    with pytest.raises(OSError, match="disk full"):
        on_every_rank("save tables", _fails)
    with pytest.raises(ValueError, match="^Save tables failed on rank 0: OSError: disk full$"):
        on_every_rank("save tables", _fails, error_type=ValueError, wrap_own=True)


def test_rank_zero_alone_runs_the_work_and_everyone_learns_its_failure():
    assert on_rank_zero("write manifest", lambda: "written") == "written"
    with pytest.raises(RuntimeError, match="Write manifest failed on rank 0: OSError"):
        on_rank_zero("write manifest", _fails)
