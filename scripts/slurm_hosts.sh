#!/usr/bin/env bash
# A SLURM cluster on the namespace hosts of scripts/netns_hosts.sh: slurmctld in h1, a slurmd in
# every host, one partition (`main`), munge for authentication, made fresh and removed like the
# hosts. Debian's slurmctld, slurmd, slurm-client and munge (ci/setup.sh installs them).
#
#   scripts/slurm_hosts.sh up [N]        make h1..hN (netns_hosts.sh up N) and start SLURM on them
#   scripts/slurm_hosts.sh start [N]     start SLURM on hosts h1..hN that are already up
#   scripts/slurm_hosts.sh stop          stop SLURM, keep the hosts
#   scripts/slurm_hosts.sh revive hK     a node killed with `netns_hosts.sh kill hK` boots again
#   scripts/slurm_hosts.sh run CMD...    run CMD in h1 with this cluster's SLURM_CONF (sbatch,
#                                        srun, squeue, sinfo, scontrol)
#   scripts/slurm_hosts.sh down          stop SLURM and remove the hosts
#   scripts/slurm_hosts.sh cannot        why a cluster cannot be made here (exit 1), or nothing
#
# Example (needs root):
#   scripts/slurm_hosts.sh up 2
#   scripts/slurm_hosts.sh run srun -N 2 -n 2 --mpi=pmix .venv/bin/python train.py
#   scripts/slurm_hosts.sh down
#
# Contained like the hosts: slurmctld and the slurmds listen inside their namespaces only (the
# root namespace has no interface on the hosts' network); munged listens on a unix socket in
# this run's state directory; the configuration is this run's (SLURM_CONF), /etc/slurm is not
# read. Plugins that need no systemd or cgroup delegation: proctrack/linuxproc, task/none.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
NETNS="$HERE/netns_hosts.sh"
PREFIX="${MMDE_NETNS_PREFIX:-mmde}"
SUBNET="${MMDE_NETNS_SUBNET:-10.231.7}"
STATE="${MMDE_SLURM_STATE:-/run/$PREFIX-slurm}"
CONF="$STATE/slurm.conf"

die() { echo "slurm_hosts: $*" >&2; exit 1; }

cannot() {
  local why; why="$(bash "$NETNS" cannot)" || { echo "$why"; return; }
  local tool
  for tool in slurmctld slurmd munged srun sbatch; do
    command -v "$tool" >/dev/null || [[ -x "/usr/sbin/$tool" ]] \
      || { echo "$tool is missing (apt-get install slurmctld slurmd slurm-client munge)"; return; }
  done
}

write_conf() {  # $1 = number of hosts
  local n="$1" k
  {
    echo "ClusterName=$PREFIX"
    echo "SlurmctldHost=h1($SUBNET.1)"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "AuthInfo=socket=$STATE/munge.socket"
    echo "SlurmctldPort=6817"
    echo "SlurmdPort=6818"
    echo "SrunPortRange=60001-60500"
    echo "StateSaveLocation=$STATE/ctld"
    echo "SlurmdSpoolDir=$STATE/spool/%n"
    # the hosts share one /tmp; PMIx makes its directories of a step under TmpFS on each node
    echo "TmpFS=$STATE/tmp/%n"
    echo "SlurmctldPidFile=$STATE/slurmctld.pid"
    echo "SlurmdPidFile=$STATE/slurmd-%n.pid"
    echo "SlurmctldLogFile=$STATE/slurmctld.log"
    echo "SlurmdLogFile=$STATE/slurmd-%n.log"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobCompType=jobcomp/none"
    echo "SwitchType=switch/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "MpiDefault=none"
    echo "ReturnToService=2"
    echo "SlurmctldTimeout=30"
    echo "SlurmdTimeout=10"   # a lost node ends its jobs within ~20 s
    echo "MessageTimeout=10"
    echo "KillWait=5"
    echo "MinJobAge=300"
    echo "JobRequeue=1"
    for k in $(seq 1 "$n"); do
      echo "NodeName=h$k NodeAddr=$SUBNET.$k CPUs=2 RealMemory=1000 State=UNKNOWN"
    done
    echo "PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES"
  } > "$CONF"
}

up() {
  local why; why="$(cannot)"; [[ -z "$why" ]] || die "$why"
  down
  bash "$NETNS" up "${1:-2}" >/dev/null
  start "${1:-2}"
}

start() {
  local n="${1:-2}" k
  [[ "$(bash "$NETNS" status | grep -c '^== h')" -ge "$n" ]] || die "fewer than $n hosts are up"
  stop
  trap 'rc=$?; [[ $rc -eq 0 ]] || { tail -n 5 "$STATE"/*.log "$STATE"/munge/*.log >&2; stop; }; exit $rc' EXIT
  mkdir -p "$STATE/ctld" "$STATE/munge"
  chmod 711 "$STATE"   # munged wants its socket's directory searchable by all
  head -c 1024 /dev/urandom > "$STATE/munge/munge.key"
  chmod 400 "$STATE/munge/munge.key"
  write_conf "$n"
  # munged in h1 (its unix socket is a file: every host reaches it; `down` kills it with h1)
  bash "$NETNS" run h1 munged --force --socket="$STATE/munge.socket" \
    --key-file="$STATE/munge/munge.key" --pid-file="$STATE/munge/munged.pid" \
    --seed-file="$STATE/munge/munged.seed" --log-file="$STATE/munge/munged.log"
  SLURM_CONF="$CONF" bash "$NETNS" run h1 slurmctld -f "$CONF" -c
  for k in $(seq 1 "$n"); do slurmd_in "h$k"; done
  local tries=0
  until [[ "$(run sinfo -h -o '%T' -N 2>/dev/null | grep -c '^idle$')" -eq "$n" ]]; do
    tries=$((tries + 1))
    [[ $tries -lt 100 ]] || die "the $n slurmds did not register (logs in $STATE)"
    sleep 0.2
  done
  echo "slurm_hosts: up: h1..h$n in partition main, slurmctld on h1, SLURM_CONF=$CONF"
}

slurmd_in() {  # $1 = host
  mkdir -p "$STATE/spool/$1" "$STATE/tmp/$1"
  # `ip netns exec` mounts a fresh /sys, without the cgroup file system slurmd's cgroup
  # plugin looks for at start (proctrack/linuxproc and task/none use no cgroup): the
  # machine's v1 hierarchy, seen again in the host's own mount namespace only
  SLURM_CONF="$CONF" bash "$NETNS" run "$1" sh -c \
    'mount -t tmpfs cgroup /sys/fs/cgroup && mkdir /sys/fs/cgroup/systemd &&
     mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd && exec "$@"' slurmd \
    slurmd -f "$CONF" -N "$1"
}

revive() {  # a killed node boots again: its sshd and slurmd (ReturnToService=2 takes it back)
  [[ -f "$CONF" ]] || die "no cluster is up (run: $0 up)"
  bash "$NETNS" revive "$1"
  # a rebooted node starts with empty run-time directories: the killed step's PMIx socket
  # left in its spool would make the next step on it fail to bind ("Address already in use")
  rm -rf "${STATE:?}/spool/$1" "${STATE:?}/tmp/$1"
  slurmd_in "$1"
  local tries=0
  until run sinfo -h -N -n "$1" -o '%T' 2>/dev/null | grep -qx idle; do
    tries=$((tries + 1))
    [[ $tries -lt 300 ]] || die "$1 did not come back (logs in $STATE)"
    sleep 0.2
  done
}

run() {
  SLURM_CONF="$CONF" bash "$NETNS" run h1 env SLURM_CONF="$CONF" "$@"
}

stop() {  # the daemons by their pid files (a killed host's are gone with it)
  local pidfile
  for pidfile in "$STATE"/slurmctld.pid "$STATE"/slurmd-*.pid "$STATE"/munge/munged.pid; do
    [[ -f "$pidfile" ]] && kill -9 "$(cat "$pidfile")" 2>/dev/null || true
  done
  rm -rf "$STATE"
}

down() {
  stop
  bash "$NETNS" down >/dev/null 2>&1 || true
}

case "${1:-}" in
  up) up "${2:-2}" ;;
  start) start "${2:-2}" ;;
  stop) stop ;;
  revive) revive "${2:?host}" ;;
  run) shift; [[ $# -ge 1 ]] || die "usage: $0 run CMD..."; run "$@" ;;
  down) down ;;
  cannot) why="$(cannot)"; [[ -n "$why" ]] && { echo "$why"; exit 1; } || exit 0 ;;
  *) sed -n '2,20p' "$0"; exit 2 ;;
esac
