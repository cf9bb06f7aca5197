"""The commands' --dynamic options (merlin_models_de/apps/common/dynamic.py)."""

import pytest

from merlin_models_de.apps.common.dynamic import dynamic_tables
from merlin_models_de.apps.dlrm.options import check_options, parser
from merlin_models_de.tables import DynamicTable
from tests.schemas import cat


def args(*argv):
    return parser().parse_args(list(argv))


def test_a_capacity_left_out_is_the_columns_cardinality():
    from merlin.schema import Schema

    schema = Schema([cat("C1", 999), cat("C2", 49)])
    parsed = args("--dynamic", "C1", "--dynamic", "C2=7", "--admit-after", "2", "--evict", "lru")
    assert check_options(parsed) is None
    assert dynamic_tables(parsed, schema) == {
        "C1": DynamicTable(1000, admit_after=2, evict="lru"),
        "C2": DynamicTable(7, admit_after=2, evict="lru"),
    }
    with pytest.raises(ValueError, match="Received: --dynamic C9"):
        dynamic_tables(args("--dynamic", "C9"), schema)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dynamic", "C1=many"], "FEATURE=CAPACITY. Received: --dynamic ['C1=many']"),
        (["--dynamic", "C1", "--evict", "ttl"], "--dynamic: DynamicTable takes ttl with"),
        (["--dynamic", "C1", "--admit-after", "0"], "Received: admit_after=0"),
    ],
)
def test_bad_dynamic_options_are_named(argv, message):
    assert message in check_options(args(*argv))


def test_dynamic_tables_go_with_sharded_checkpoints():
    assert check_options(args("--dynamic", "C1", "--checkpoint-dir", "/tmp/x")) is None
