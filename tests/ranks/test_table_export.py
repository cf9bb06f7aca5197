"""export_table: every rank writes its own part of one table (no gather), rank 0 the manifest;
the reader gives back exactly the table, whole or in row batches, for every sharding kind; a
new export replaces the old one whole (a failed one leaves it, a reader streaming it sees it
whole)."""

import errno
import json
import os

import numpy as np
import pytest

from merlin_models_de import comm
from merlin_models_de.persistence import table_export
from merlin_models_de.persistence.table_export import (
    export_table,
    iter_table,
    read_manifest,
    read_table,
)
from merlin_models_de.planner import ShardingType
from tests.ranks import oracle

PLACEMENTS = {
    "table_wise": (dict(strategy="basic"), ShardingType.TABLE_WISE),
    "row_sliced": (dict(strategy="basic", row_slice_threshold=1000), ShardingType.ROW_WISE),
    "column_sliced": (
        dict(strategy="basic", column_slice_threshold=1000),
        ShardingType.COLUMN_WISE,
    ),
    "data_parallel": (
        dict(strategy="basic", data_parallel_threshold=10**6),
        ShardingType.DATA_PARALLEL,
    ),
}


def shared_dir(tmp_path_factory, name):
    path = str(tmp_path_factory.mktemp(name)) if comm.rank() == 0 else None
    return comm.broadcast_object(path)


def built_block(options, seed):
    import merlin.models.tf as mm

    block = mm.DistributedEmbeddings(
        oracle.mixed_schema(),
        dim=oracle.DIMS,
        sequence_combiner=oracle.COMBINERS,
        backend="horovod",
        **options,
    )
    block.ensure_built()
    arrays = oracle.global_tables(block.tables, seed)
    block.set_global_weights(arrays)
    return block, arrays


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_every_rank_writes_its_part_and_the_reader_gives_the_table(
    hvd, tmp_path_factory, placement
):
    options, kind = PLACEMENTS[placement]
    block, arrays = built_block(options, seed=sum(map(ord, placement)))
    table = "user"  # 2000 x 8: sliced by the thresholds above
    assert block.plan.kind_of(table) is kind
    directory = shared_dir(tmp_path_factory, "export")
    assert export_table(block, table, directory) == directory
    manifest = read_manifest(directory)
    shards = block.plan.stored_shards_of(table)
    assert [(p["row_start"], p["rows"], p["col_start"], p["cols"]) for p in manifest["parts"]] == [
        (s.row_start, s.rows, s.col_start, s.cols) for s in shards
    ]
    assert sorted(os.listdir(directory)) == sorted(
        ["manifest.json"] + [p["file"] for p in manifest["parts"]]
    )
    np.testing.assert_array_equal(read_table(directory), arrays[table])
    batches = list(iter_table(directory, batch_rows=300))
    assert [first for first, _ in batches] == list(range(0, 2000, 300))
    np.testing.assert_array_equal(np.concatenate([b for _, b in batches]), arrays[table])


def test_an_unknown_table_is_named_on_every_rank(hvd, tmp_path_factory):
    block, _ = built_block(PLACEMENTS["table_wise"][0], seed=1)
    with pytest.raises(ValueError, match=r"has no table 'nope'\. Tables: \["):
        export_table(block, "nope", shared_dir(tmp_path_factory, "unknown"))
    oracle_in_step()


def test_a_write_failing_on_one_rank_fails_every_rank_and_keeps_the_old_export(
    hvd, tmp_path_factory, monkeypatch
):
    block, arrays = built_block(PLACEMENTS["row_sliced"][0], seed=2)
    directory = shared_dir(tmp_path_factory, "failing")
    export_table(block, "user", directory)  # a complete export first
    block.set_global_weights({k: v + 1 for k, v in arrays.items()})

    def full_disk(path, array):
        raise OSError(errno.ENOSPC, f"Cannot write {path} on rank 1: No space left on device")

    if comm.rank() == 1:  # rank 1's part cannot be written
        monkeypatch.setattr(table_export, "write_array", full_disk)
    with pytest.raises(OSError, match=r"Exporting table 'user' to .* failed on rank 1: "):
        export_table(block, "user", directory)
    np.testing.assert_array_equal(read_table(directory), arrays["user"])  # the old one, whole
    comm.barrier("mmde_test_export_failed")
    parent, name = os.path.split(directory)
    assert [n for n in os.listdir(parent) if n.endswith(f"-{name}")] == []  # no temporary left
    oracle_in_step()


def test_a_reader_streaming_during_a_new_export_sees_the_old_one_whole(hvd, tmp_path_factory):
    block, arrays = built_block(PLACEMENTS["row_sliced"][0], seed=4)
    directory = shared_dir(tmp_path_factory, "streamed")
    export_table(block, "user", directory)
    batches = iter_table(directory, batch_rows=300)  # every rank reads it, and exports
    got = [next(batches)]
    new = {k: v + 1 for k, v in arrays.items()}
    block.set_global_weights(new)
    export_table(block, "user", directory)  # each rank's part used to be rewritten in place
    got += list(batches)
    np.testing.assert_array_equal(np.concatenate([b for _, b in got]), arrays["user"])
    np.testing.assert_array_equal(read_table(directory), new["user"])
    oracle_in_step()


def test_a_damaged_export_is_named(hvd, tmp_path_factory):
    from merlin_models_de.persistence.io import StorageError

    block, _ = built_block(PLACEMENTS["row_sliced"][0], seed=3)
    directory = shared_dir(tmp_path_factory, "damaged")
    export_table(block, "user", directory)
    comm.barrier("mmde_test_export_done")
    if comm.rank() == 0:
        path = os.path.join(directory, "manifest.json")
        manifest = json.load(open(path, encoding="utf-8"))
        manifest["parts"][0]["file"] = "../outside.npy"
        json.dump(manifest, open(path, "w", encoding="utf-8"))
        with pytest.raises(StorageError, match=r"outside.*'\.\./outside\.npy'"):
            read_table(directory)
        manifest["parts"] = manifest["parts"][1:]
        json.dump(manifest, open(path, "w", encoding="utf-8"))
        with pytest.raises(StorageError, match="parts do not cover the table"):
            read_table(directory)
    comm.barrier("mmde_test_export_checked")


def oracle_in_step():
    got = comm.allgather_object(comm.rank(), name="mmde_test_export_in_step")
    assert got == list(range(comm.size()))


def test_export_table_writes_a_dynamic_tables_keys_with_its_rows(hvd, tmp_path_factory):
    from merlin_models_de.persistence.io import StorageError
    from merlin_models_de.persistence.table_export import read_keys
    from merlin_models_de.variables import embedding_blocks
    from tests.ranks import dynamic_model as dm
    from tests.ranks.test_dynamic_exchange import PER_RANK, rank_rows

    n, r = comm.size(), comm.rank()
    data = comm.broadcast_object(dm.make_data(n * PER_RANK * 3, 3, seed=7))
    model = dm.build_model(dm.no_eviction())
    model.compile(optimizer="adagrad")
    model.fit(dm.dataset(data, rank_rows(len(data["label"])), PER_RANK), epochs=1, verbose=0)
    (block,) = embedding_blocks(model)
    root = comm.broadcast_object(str(tmp_path_factory.mktemp("tables")) if r == 0 else None)
    for table in ("item", "user"):
        export_table(block, table, f"{root}/{table}")
    want_keys, want_rows = block.dynamic_table("item")
    keys, rows = read_keys(f"{root}/item")
    np.testing.assert_array_equal(keys, want_keys)
    assert len(keys) > 20
    np.testing.assert_array_equal(read_table(f"{root}/item")[rows], want_rows)
    with pytest.raises(StorageError, match=r"table 'user'\) holds no keys"):
        read_keys(f"{root}/user")
