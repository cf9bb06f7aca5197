"""The planner's memory model (planner/memory.py): a rank's predicted peak grows with what it
holds exactly as the model's terms say (tables, optimizer copies, row state, 16-bit tables)."""

from merlin_models_de.planner import plan
from merlin_models_de.planner.memory import (
    ALLOCATOR_OVERHEAD,
    RUNTIME_BYTES,
    plan_peak_bytes,
    rank_peak_bytes,
)
from merlin_models_de.tables import FeatureSpec, TableSpec

E = 1_000_000  # elements


def _extra(**kwargs):
    return rank_peak_bytes(E, runtime=0, overhead=0.0, **kwargs)


def test_terms_of_a_ranks_peak():
    assert rank_peak_bytes(0, "sgd") == RUNTIME_BYTES
    assert _extra(optimizer="sgd") == 4 * E
    assert _extra(optimizer="adam") == 3 * 4 * E  # two slot copies
    assert _extra(optimizer="rowwise_adagrad", rows=1000) == 4 * E + 4 * 1000
    assert _extra(optimizer="sgd", table_bytes=2) == 2 * E  # 16-bit tables
    assert _extra(optimizer="adagrad", table_bytes=2) == 2 * E + 4 * E  # state stays 32-bit
    assert _extra(optimizer="sgd", dense_gradients=True) > _extra(optimizer="sgd")
    overhead = rank_peak_bytes(E, "sgd", runtime=0)
    assert overhead == int((1 + ALLOCATOR_OVERHEAD) * 4 * E)


def test_a_plans_peaks_follow_its_ranks():
    tables = [TableSpec(n, 1000, 8, (FeatureSpec(n, n),)) for n in ("a", "b", "c")]
    two = plan(tables, 2)
    peaks = plan_peak_bytes(two, "adagrad")
    held = [two.rank_elements(r) for r in range(2)]
    assert len(peaks) == 2 and (peaks[0] > peaks[1]) == (held[0] > held[1])
    # one process draws its largest table whole: more than the same tables on a rank of two
    one = plan(tables, 1)
    assert plan_peak_bytes(one, "sgd")[0] > rank_peak_bytes(one.rank_elements(0), "sgd")
