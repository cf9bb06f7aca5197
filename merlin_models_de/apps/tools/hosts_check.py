"""``python -m merlin_models_de.apps.tools.hosts_check -H h1:2,h2:2``: every host answers ssh,
or one line per host that does not, within ``--timeout`` seconds (all hosts at once).

horovodrun checks ssh itself before it starts, but with 5 attempts of 10 s each: a host that
does not answer at all (down, or its link cut) takes about 50 s to be named. Run this first:
``python -m merlin_models_de.apps.tools.hosts_check -H $HOSTS && horovodrun -H $HOSTS ...``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from merlin_models_de.apps.common.program import program_name


def unreachable(
    hosts: list, timeout: float, port: int | None = None, identity: str | None = None
) -> dict:
    """{host: ssh's last line} for every host where ``ssh host true`` fails."""

    def probe(host):
        cmd = [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={max(1, int(timeout))}",
            "-o",
            "StrictHostKeyChecking=no",
            *(["-p", str(port)] if port else []),
            *(["-i", identity] if identity else []),
            host,
            "true",
        ]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 2)
        except subprocess.TimeoutExpired:
            return f"no answer within {timeout:.0f} s"
        lines = done.stderr.strip().splitlines()
        return None if done.returncode == 0 else (lines[-1] if lines else f"exit {done.returncode}")

    with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        return {h: e for h, e in zip(hosts, pool.map(probe, hosts)) if e is not None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog=program_name("merlin_models_de.apps.tools.hosts_check"))
    ap.add_argument("-H", "--hosts", required=True, help="horovodrun's -H (host:slots,...)")
    ap.add_argument("--timeout", type=float, default=3.0, help="seconds per host (at once)")
    ap.add_argument("-p", "--ssh-port", type=int, default=None)
    ap.add_argument("-i", "--ssh-identity-file", default=None)
    args = ap.parse_args(argv)
    hosts = [h.split(":")[0] for h in args.hosts.split(",") if h]
    bad = unreachable(hosts, args.timeout, args.ssh_port, args.ssh_identity_file)
    for host, why in bad.items():
        print(f"error: host {host} is unreachable over ssh: {why}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
