#!/usr/bin/env bash
# "Hosts" on one Linux machine: N network namespaces (h1..hN) joined by a bridge, each with its
# own address and its own sshd, so horovodrun launches over ssh exactly as on a cluster.
#
#   scripts/netns_hosts.sh up [N]          make h1..hN (default 2) and start their sshds
#   scripts/netns_hosts.sh run hK CMD...   run CMD inside host hK (e.g. horovodrun from h1)
#   scripts/netns_hosts.sh kill hK         kill every process inside hK (a host that dies)
#   scripts/netns_hosts.sh revive hK       start a killed host's sshd again (the host is back)
#   scripts/netns_hosts.sh cut hK          take hK's link down (a cable pulled); `mend hK` undoes
#   scripts/netns_hosts.sh down            remove everything, also what a killed run left behind
#   scripts/netns_hosts.sh status          list the hosts, their addresses and listeners
#
# Example (needs root; Debian's openssh-server, which ci/setup.sh installs):
#   scripts/netns_hosts.sh up 2
#   scripts/netns_hosts.sh run h1 horovodrun --gloo -np 2 -H h1:1,h2:1 \
#       --network-interface mmde0 .venv/bin/python train.py
#   scripts/netns_hosts.sh down
#
# Layout: each host is a network namespace and, for its processes (sshd and what `run`
# starts), a UTS namespace whose hostname is hK, as on a cluster. The bridge lives in a namespace of its own (mmde-sw), so the root namespace has no
# interface on this network and no traffic leaves it. Inside a host, `ip netns exec` mounts
# the files of /etc/netns/mmde-hK/ over /etc: its `hosts` names every host, and its `ssh/`
# holds this run's client and server configuration and keys (made fresh by `up`, in $STATE).
# The namespaces share the file system, so the same venv path works on every host.
set -euo pipefail
PREFIX="${MMDE_NETNS_PREFIX:-mmde}"
SUBNET="${MMDE_NETNS_SUBNET:-10.231.7}"   # host hK gets $SUBNET.K/24
IFACE="${MMDE_NETNS_IFACE:-mmde0}"        # the hosts' interface: pass it to --network-interface
PORT="${MMDE_NETNS_SSH_PORT:-22}"
STATE="${MMDE_NETNS_STATE:-/run/$PREFIX-hosts}"
SW="$PREFIX-sw"
BR="${PREFIX}br"

die() { echo "netns_hosts: $*" >&2; exit 1; }
exec_() { "$@"; }
ns() { echo "$PREFIX-$1"; }                       # h2 -> mmde-h2
hosts_up() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-h[0-9]+$" | sed "s/^$PREFIX-//" | sort -V || true; }

# Why namespaces cannot be made here, or nothing (the tests skip with this reason).
cannot() {
  [[ $(id -u) -eq 0 ]] || { echo "needs root (ip netns add)"; return; }
  command -v ip >/dev/null || { echo "iproute2's ip is missing"; return; }
  [[ -x /usr/sbin/sshd ]] || { echo "/usr/sbin/sshd is missing (apt-get install openssh-server)"; return; }
  local probe="$PREFIX-probe$$"
  if ! ip netns add "$probe" 2>/dev/null; then echo "ip netns add is not permitted here"; return; fi
  if ! ip netns exec "$probe" true 2>/dev/null; then ip netns del "$probe"; echo "ip netns exec is not permitted here"; return; fi
  ip netns del "$probe"
}

down() {
  local name pid
  for name in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$PREFIX-(h[0-9]+|sw)$" || true); do
    for pid in $(ip netns pids "$name" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$name" 2>/dev/null || true
  done
  rm -rf /etc/netns/"$PREFIX"-h* "$STATE"
  # veth ends left in the root namespace by an interrupted `up`
  for name in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "^$PREFIX-(h|s)[0-9]+$" || true); do
    ip link del "$name" 2>/dev/null || true
  done
}

write_ssh_config() {  # $1 = host number, $2 = number of hosts
  local k="$1" n="$2" etc="/etc/netns/$(ns "h$1")"
  mkdir -p "$etc/ssh"
  { echo "127.0.0.1 localhost"; for j in $(seq 1 "$n"); do echo "$SUBNET.$j h$j"; done; } > "$etc/hosts"
  echo "h$k" > "$etc/hostname"
  cat > "$etc/ssh/ssh_config" <<EOF
Host *
  Port $PORT
  IdentityFile $STATE/id_ed25519
  IdentitiesOnly yes
  BatchMode yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  ConnectTimeout 5
  ServerAliveInterval 5
  ServerAliveCountMax 2
EOF
  cat > "$etc/ssh/sshd_config" <<EOF
ListenAddress $SUBNET.$k:$PORT
HostKey $STATE/host_ed25519
AuthorizedKeysFile $STATE/authorized_keys
PidFile $STATE/sshd-h$k.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AcceptEnv *
PermitUserEnvironment no
ClientAliveInterval 5
ClientAliveCountMax 2
EOF
}

up() {
  local n="${1:-2}" k
  [[ "$n" =~ ^[1-9]$ ]] || die "up takes 1..9 hosts, got '$n'"
  local why; why="$(cannot)"; [[ -z "$why" ]] || die "$why"
  down
  trap 'rc=$?; [[ $rc -eq 0 ]] || down; exit $rc' EXIT   # a failed `up` leaves nothing behind
  mkdir -p "$STATE" /run/sshd
  chmod 700 "$STATE"
  ssh-keygen -q -t ed25519 -N "" -C "$PREFIX-hosts" -f "$STATE/id_ed25519"
  ssh-keygen -q -t ed25519 -N "" -C "$PREFIX-host" -f "$STATE/host_ed25519"
  cp "$STATE/id_ed25519.pub" "$STATE/authorized_keys"
  ip netns add "$SW"
  ip -n "$SW" link add "$BR" type bridge
  ip -n "$SW" link set "$BR" up
  for k in $(seq 1 "$n"); do
    ip netns add "$(ns "h$k")"
    ip link add "$PREFIX-h$k" type veth peer name "$PREFIX-s$k"
    ip link set "$PREFIX-h$k" netns "$(ns "h$k")"
    ip link set "$PREFIX-s$k" netns "$SW"
    ip -n "$SW" link set "$PREFIX-s$k" master "$BR" up
    ip -n "$(ns "h$k")" link set "$PREFIX-h$k" name "$IFACE"
    ip -n "$(ns "h$k")" addr add "$SUBNET.$k/24" dev "$IFACE"
    ip -n "$(ns "h$k")" link set "$IFACE" up
    ip -n "$(ns "h$k")" link set lo up
    write_ssh_config "$k" "$n"
    in_host "h$k" /usr/sbin/sshd -f /etc/ssh/sshd_config
  done
  # Every host reaches every other over ssh before we say ready (sshd needs a moment to listen).
  for k in $(seq 1 "$n"); do reachable "h$k"; done
  echo "netns_hosts: up: $(hosts_up | tr '\n' ' ')on $SUBNET.0/24, interface $IFACE, state in $STATE"
}

# A host has its own network and its own name: Gloo's TCP transport resolves the machine's
# hostname, which must be the host's (hK, in its /etc/hosts), not the one machine's name.
in_host() {
  local host="$1"; shift
  exec_ ip netns exec "$(ns "$host")" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$host" "$@"
}

run() {
  local host="$1"; shift
  ip netns list | awk '{print $1}' | grep -qx "$(ns "$host")" || die "no host $host (run: $0 up)"
  exec_() { exec "$@"; }  # the command replaces this script (signals reach it)
  in_host "$host" "$@"
}

reachable() {  # ssh from h1 to $1 works (or die after 5 s)
  local tries=0
  until ip netns exec "$(ns h1)" ssh "$1" true 2>/dev/null; do
    tries=$((tries + 1)); [[ $tries -lt 50 ]] || die "ssh from h1 to $1 does not work"
    sleep 0.1
  done
}

revive_host() {  # a killed host boots again: its sshd (its namespace and link were kept)
  ip netns list | awk '{print $1}' | grep -qx "$(ns "$1")" || die "no host $1 (run: $0 up)"
  in_host "$1" /usr/sbin/sshd -f /etc/ssh/sshd_config
  reachable "$1"
}

kill_host() {  # every process of the host, by the ids its namespace lists
  local pid
  for pid in $(ip netns pids "$(ns "$1")"); do kill -9 "$pid" 2>/dev/null || true; done
}

status() {
  local h
  for h in $(hosts_up); do
    echo "== $h: $(ip -n "$(ns "$h")" -4 -o addr show dev "$IFACE" 2>/dev/null | awk '{print $4}') $(ip -n "$(ns "$h")" -o link show dev "$IFACE" | grep -o 'state [A-Z]*')"
    ip netns exec "$(ns "$h")" ss -ltnp | tail -n +2
  done
}

case "${1:-}" in
  up) up "${2:-2}" ;;
  down) down ;;
  run) [[ $# -ge 3 ]] || die "usage: $0 run hK CMD..."; shift; run "$@" ;;
  kill) kill_host "${2:?host}" ;;
  revive) revive_host "${2:?host}" ;;
  cut) ip -n "$(ns "${2:?host}")" link set "$IFACE" down ;;
  mend) ip -n "$(ns "${2:?host}")" link set "$IFACE" up ;;
  status) status ;;
  cannot) why="$(cannot)"; [[ -n "$why" ]] && { echo "$why"; exit 1; } || exit 0 ;;
  *) sed -n '2,14p' "$0"; exit 2 ;;
esac
