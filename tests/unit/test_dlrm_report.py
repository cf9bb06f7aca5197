"""The DLRM command's report (apps/dlrm/report.py): the share of CPU time the hypervisor stole,
the worst host's over all epochs, and None when a host does not say."""

import pytest

from merlin_models_de.apps.dlrm.report import steal_share


def test_the_worst_hosts_share_over_all_epochs():
    epochs = [
        {"host_cpu_ticks": [[1, 100], [10, 100]]},
        {"host_cpu_ticks": [[9, 100], [30, 300]]},
    ]
    assert steal_share(epochs) == pytest.approx(40 / 400)  # rank 1: (10 + 30) / (100 + 300)


def test_unknown_when_any_host_does_not_say():
    assert steal_share([]) is None
    assert steal_share([{"host_cpu_ticks": [[1, 100], None]}]) is None
    assert steal_share([{"host_cpu_ticks": [[0, 0]]}]) == 0.0
