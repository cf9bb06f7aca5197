"""``apps/tools/hosts_check``: a host that does not answer ssh is named with ssh's reason, and
the command fails; the hosts are probed at once, within the timeout."""

import time

from merlin_models_de.apps.tools import hosts_check


def test_a_refused_host_is_named_and_the_check_fails(capsys):
    started = time.monotonic()
    # port 1 on loopback: nothing listens, ssh is refused at once
    code = hosts_check.main(["-H", "127.0.0.1:2,localhost:2", "-p", "1", "--timeout", "5"])
    assert code == 1
    err = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in err] == ["error"] * 2
    assert "host 127.0.0.1 is unreachable over ssh" in err[0]
    assert "host localhost is unreachable over ssh" in err[1]
    assert time.monotonic() - started < 10


def test_unreachable_maps_each_failing_host_to_a_reason():
    bad = hosts_check.unreachable(["127.0.0.1"], timeout=5, port=1)
    assert list(bad) == ["127.0.0.1"] and bad["127.0.0.1"]
