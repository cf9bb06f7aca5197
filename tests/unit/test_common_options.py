"""The commands' shared options (apps/common/options.py): sizes and lists parsed or refused
naming the option and the value, and a dataset directory's problems found before TensorFlow."""

import argparse
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from merlin_models_de.apps.common import options


def test_sizes_take_decimal_and_binary_units():
    assert options.parse_bytes("80GB", "--device-memory") == 80_000_000_000
    assert options.parse_bytes("16GiB", "--device-memory") == 16 * 2**30
    for bad in ("80 gigs", "-1GB", "0.0001B"):
        with pytest.raises(ValueError, match=f"Received: --device-memory={bad!r}"):
            options.parse_bytes(bad, "--device-memory")


def test_integer_lists_are_positive():
    assert options.ints("128, 64") == [128, 64]
    for bad in ("", "a,b", "64,0"):
        with pytest.raises(argparse.ArgumentTypeError, match=repr(bad)):
            options.ints(bad)


def test_elastic_needs_its_commits():
    args = SimpleNamespace(elastic=True, checkpoint_dir="/ck", checkpoint_every=None)
    assert "--checkpoint-every=None" in options.elastic_problem(args)
    assert options.elastic_problem(SimpleNamespace(**{**vars(args), "checkpoint_every": 5})) is None


def test_a_dataset_directory_is_checked_for_schema_files_and_rows(tmp_path):
    flag = "--train-dir"
    assert options.dataset_dir_problem(flag, None) is None
    assert "is not a directory" in options.dataset_dir_problem(flag, str(tmp_path / "nope"))
    assert "has no Merlin schema" in options.dataset_dir_problem(flag, str(tmp_path))
    (tmp_path / "schema.pbtxt").write_text("")
    assert options.dataset_dir_problem(flag, str(tmp_path)) is None
    assert "holds no .parquet files" in options.parquet_files_problem(flag, str(tmp_path))
    pq.write_table(pa.table({"a": pa.array([], pa.int64())}), tmp_path / "part_0.parquet")
    assert "holds no rows" in options.parquet_files_problem(flag, str(tmp_path))
    (tmp_path / "part_1.parquet").write_text("not parquet")
    assert "not parquet" in options.parquet_files_problem(flag, str(tmp_path))
    (tmp_path / "part_1.parquet").unlink()
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "part_1.parquet")
    assert options.parquet_files_problem(flag, str(tmp_path)) is None


def test_the_dlrm_options_build_the_blocks_option_objects():
    from merlin_models_de.apps.dlrm.options import check_options, parser
    from merlin_models_de.backends.options import ExchangeOptions
    from merlin_models_de.planner.options import PlacementOptions

    argv = ["--strategy", "memory_optimized", "--data-parallel-threshold", "100"]
    args = parser().parse_args(argv + ["--no-validate-ids", "--exchange-dtype", "bfloat16"])
    assert options.placement_of(args) == PlacementOptions(
        "memory_optimized", data_parallel_threshold=100
    )
    assert options.exchange_of(args) == ExchangeOptions(
        validate_ids=False, exchange_dtype="bfloat16"
    )
    # the next-item command has no exchange dtypes: those keep their defaults
    few = SimpleNamespace(backend="horovod", validate_ids=True)
    assert options.exchange_of(few) == ExchangeOptions(backend="horovod")
    bad = parser().parse_args(["--row-slice-threshold", "0"])
    assert check_options(bad) == (
        "row_slice_threshold must be a positive int or None. Received: row_slice_threshold=0"
    )


def test_the_commands_optimizers_are_the_planners_and_their_step_is_placed_for():
    """``work_balanced`` places for a command's own ``--batch-size`` and ``--optimizer`` (its
    names are the planner's); what a command has no option for keeps PlacementOptions'
    default, ``--hotness`` read as the plan command reads it."""
    from merlin_models_de.apps.common.optimizers import OPTIMIZERS
    from merlin_models_de.apps.next_item.__main__ import parser as next_item_parser
    from merlin_models_de.planner import OPTIMIZER_SLOTS
    from merlin_models_de.planner.options import PlacementOptions

    assert set(OPTIMIZERS) <= set(OPTIMIZER_SLOTS)
    args = next_item_parser().parse_args(["--strategy", "work_balanced", "--batch-size", "128"])
    assert options.placement_of(args) == PlacementOptions(
        "work_balanced", batch_size=128, optimizer="adam"
    )
    given = SimpleNamespace(strategy="basic", hotness="a=2,b=0.5", link="nvlink-nccl")
    assert options.placement_of(given) == PlacementOptions(
        "basic", hotness={"a": 2.0, "b": 0.5}, link="nvlink-nccl"
    )
    with pytest.raises(ValueError, match=r"Received: --hotness='a=x'"):
        options.placement_of(SimpleNamespace(strategy="basic", hotness="a=x"))


def test_the_dlrm_block_places_what_the_plan_command_prints_for_its_options(tmp_path, capsys):
    """A user who runs ``mmde-plan`` with the options of their DLRM run sees the placement the
    run's block makes. 256 samples a rank with SGD: on these tables ``work_balanced`` places
    otherwise than for the default step (512, Adagrad), and otherwise than for either alone."""
    from merlin.schema.io.tensorflow_metadata import TensorflowMetadata

    from merlin_models_de.apps.common.schemas import synthetic_schema
    from merlin_models_de.apps.common.synthetic import capped_schema
    from merlin_models_de.apps.dlrm.model import model_for
    from merlin_models_de.apps.dlrm.options import parser
    from merlin_models_de.apps.tools import plan as plan_command
    from merlin_models_de.planner import plan

    step = ["--batch-size", "256", "--optimizer", "sgd"]
    # the DLRM command's defaults: work_balanced, dim 16; its synthetic Criteo, tables capped
    args = parser().parse_args(["--max-table-rows", "10000", *step])
    schema = capped_schema(synthetic_schema(args.dataset), args.max_table_rows, args.table_scale)
    _, block = model_for(args, schema)  # the block as the command's run builds it
    # what the block plans on 2 ranks (here it is one process: the same call, 2 ranks)
    placed = plan(block.tables, 2, block.placement_options)
    listing = plan_command.rank_listing(placed)
    for other in (dict(), dict(batch_size=256), dict(optimizer="sgd")):
        assert plan_command.rank_listing(plan(block.tables, 2, "work_balanced", **other)) != listing
    TensorflowMetadata.from_merlin_schema(schema).to_proto_text_file(str(tmp_path))
    assert plan_command.main([str(tmp_path), "--world-size", "2", *step]) == 0
    out = capsys.readouterr().out
    assert "Planned for strategy=work_balanced, optimizer=sgd, dim=16" in out
    assert listing in out, out
