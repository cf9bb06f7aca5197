"""The one-line notice when the block splits nothing: once per process, on stderr, not for
the single-process copy a model makes of itself for export."""

from merlin.schema import Schema

from merlin_models_de import DistributedEmbeddings, comm
from merlin_models_de.block import notices
from tests.schemas import cat


def test_one_process_says_so_once(monkeypatch, capsys):
    monkeypatch.setattr(notices, "_SHOWN", set())
    for var in ("HOROVOD_RANK", "HOROVOD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    schema = Schema([cat("user", 9), cat("item", 19)])
    DistributedEmbeddings(schema, dim=4)
    DistributedEmbeddings(schema, dim=4)
    err = capsys.readouterr().err.splitlines()
    assert [l for l in err if l.startswith("merlin_models_de:")] == [
        "merlin_models_de: DistributedEmbeddings runs in one process (not started by a "
        "launcher): every table is whole here, as with mm.Embeddings; start N ranks "
        "(`horovodrun -np N`, `mpirun -np N`, `srun -n N`) to split them."
    ]


def test_one_rank_under_horovodrun_is_named_and_export_copies_stay_silent(monkeypatch):
    monkeypatch.setattr(notices, "_SHOWN", set())
    with comm.single_process():
        assert notices.one_rank_notice(1) is None
    assert notices.one_rank_notice(2) is None
    monkeypatch.setenv("HOROVOD_RANK", "0")
    assert "runs under horovodrun with one rank" in notices.one_rank_notice(1)
    assert notices.one_rank_notice(1) is None  # once per process
    monkeypatch.setattr(notices, "_SHOWN", set())
    monkeypatch.delenv("HOROVOD_RANK")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "1")  # `srun -n 1`
    assert "runs under srun with one rank" in notices.one_rank_notice(1)
