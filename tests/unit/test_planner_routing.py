"""The static routing of a plan (planner/routing.py): which owner answers which lookup, in
which order, and where each output column of a feature comes from. Pure Python."""

from merlin_models_de.planner import plan
from merlin_models_de.planner.routing import Routing
from merlin_models_de.planner.types import ShardingType
from merlin_models_de.tables import FeatureSpec, TableSpec

USER = FeatureSpec("user", "user")
TAGS = FeatureSpec("tags", "tags", multi_hot=True, combiner="sum")
HISTORY = FeatureSpec("history", "item", multi_hot=True, combiner=None)
ITEM = FeatureSpec("item", "item")
COUNTRY = FeatureSpec("country", "country")
TABLES = [
    TableSpec("user", 1000, 8, (USER,)),
    TableSpec("tags", 1000, 4, (TAGS,)),
    TableSpec("item", 2000, 6, (HISTORY, ITEM)),
    TableSpec("country", 3, 2, (COUNTRY,)),
]
FEATURES = (USER, TAGS, HISTORY, ITEM, COUNTRY)


def _routing(**options):
    return Routing.build(plan(TABLES, 2, data_parallel_threshold=10, **options), FEATURES)


def test_each_owner_serves_its_tables_one_hot_lookups_first():
    routing = _routing()
    for owner, lookups in enumerate(routing.served):
        tables = {s.table for s in plan_shards(owner)}
        assert {lookup.shard.table for lookup in lookups} <= tables
        hot = [lookup.multi_hot for lookup in lookups]
        assert hot == sorted(hot), f"rank {owner} serves a multi-hot lookup before a one-hot"
    served = sorted(FEATURES[lookup.feature].name for ls in routing.served for lookup in ls)
    assert served == ["history", "item", "tags", "user"]  # country is replicated


def plan_shards(owner):
    return plan(TABLES, 2, data_parallel_threshold=10).shards_on(owner)


def test_pieces_point_at_the_owner_and_index_that_answer():
    routing = _routing()
    for i, pieces in enumerate(routing.pieces):
        for piece in pieces:
            if piece.kind is ShardingType.DATA_PARALLEL:
                assert piece.table == FEATURES[i].table == "country" and piece.cols == 2
                continue
            lookup = routing.served[piece.owner][piece.index]
            assert lookup.feature == i and lookup.shard.cols == piece.cols
    assert sum(p.cols for p in routing.pieces[0]) == 8


def test_column_slices_come_back_in_column_order_and_add_up_to_the_dim():
    routing = _routing(column_slice_threshold=4000)
    user = routing.pieces[0]
    assert [p.kind for p in user] == [ShardingType.COLUMN_WISE] * 2
    assert [p.owner for p in user] != [user[0].owner] * 2  # the slices sit on both ranks
    starts = [routing.served[p.owner][p.index].shard.col_start for p in user]
    assert starts == sorted(starts) and sum(p.cols for p in user) == 8


def test_width_counts_pooled_columns_and_sequences_the_unpooled_ones():
    routing = _routing()
    for owner in range(2):
        pooled = sum(lk.shard.cols for lk in routing.served[owner] if not lk.sequence)
        assert routing.width(owner) == pooled
        one, multi = routing.counts(owner)
        assert one + multi == len(routing.served[owner])
    sequences = [(o, lk) for o in range(2) for _, lk in routing.sequences(o)]
    assert [FEATURES[lk.feature].name for _, lk in sequences] == ["history"]
    owner, lookup = sequences[0]
    assert routing.served[owner].index(lookup) in [k for k, _ in routing.sequences(owner)]
