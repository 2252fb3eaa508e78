#!/usr/bin/env bash
# A subscriber that vanishes without closing its connection (no FIN, no RST: a laptop closed,
# a NAT entry dropped) is freed within sse.heartbeat + sse.write_timeout (issue 17, item 4),
# not after the kernel's ~15 minutes of retransmissions: its writer sees, at a heartbeat tick,
# bytes outstanding and no ACK for write_timeout (src/stream/socket.rs `peer_vanished`).
#
# Real parts, nothing global touched: the broker (debug build) runs in a network namespace of
# its own (`unshare -n`, root), with a subscriber that is a bash /dev/tcp socket; once the
# stream is open, a tc u32 filter on that namespace's loopback stops every packet to the
# subscriber's port (held in a class of 8 bit/s), so nothing the broker writes (heartbeats,
# retransmissions) is ever acknowledged: the subscriber's machine is gone. The script then reads `agui_connections`
# from the broker's /metrics (a second connection, not filtered) until it is 0, and fails when
# that takes longer than heartbeat + write_timeout + 4 s of slack, or 40 s at most.
#
# Needs root (or CAP_SYS_ADMIN + CAP_NET_ADMIN), `unshare` (util-linux), `ip`, `ss` and `tc`
# (iproute2: installed with apt-get when missing) and target/debug/agui-fanout (built when
# missing). Usage: scripts/vanished-peer.sh
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

HEARTBEAT_S=2
WRITE_TIMEOUT_S=5
SLACK_S=4

log() { printf '==> vanished-peer: %s\n' "$*" >&2; }

if [[ ${1:-} != --inside ]]; then
  if ! command -v tc >/dev/null 2>&1 || ! command -v ss >/dev/null 2>&1 || ! command -v ip >/dev/null 2>&1; then
    log "iproute2 (ip, ss, tc) not found: installing it with apt-get"
    env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
    env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends iproute2 >/dev/null
  fi
  if [[ ! -x target/debug/agui-fanout ]]; then
    log "building the debug binary"
    cargo build --bin agui-fanout
  fi
  # Everything below runs in a new network namespace; it and its filter go with the process.
  exec timeout 60 unshare --net -- bash "$0" --inside
fi

ip link set lo up
port=18090
dir=$(mktemp -d)
AGUI_LOG=info AGUI_SSE__HEARTBEAT="${HEARTBEAT_S}s" AGUI_SSE__WRITE_TIMEOUT="${WRITE_TIMEOUT_S}s" \
  target/debug/agui-fanout serve --listen "127.0.0.1:$port" >"$dir/broker.log" 2>&1 &
broker=$!
trap 'kill "$broker" 2>/dev/null || true; rm -rf "$dir"' EXIT
trap 'exit 1' INT TERM

# `agui_connections` from /metrics (a fresh connection each time).
connections() {
  exec 4<>"/dev/tcp/127.0.0.1/$port" || return 1
  printf 'GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n' >&4
  awk '/^agui_connections /{print $2}' <&4
  exec 4<&-
}

for _ in $(seq 1 100); do
  if (exec 5<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
  sleep 0.1
done

# The subscriber: a socket that reads nothing (the kernel acknowledges what arrives).
exec 3<>"/dev/tcp/127.0.0.1/$port"
printf 'GET /v1/threads/vanishing/events HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n' >&3
for _ in $(seq 1 50); do
  [[ $(connections) == 1 ]] && break
  sleep 0.1
done
if [[ $(connections) != 1 ]]; then
  log "FAILED: the subscriber's stream did not open"
  cat "$dir/broker.log" >&2
  exit 1
fi
client_port=$(ss -Htn state established "( dport = :$port )" | awk '{print $3}' | sed 's/.*://' | head -1)
if [[ -z $client_port ]]; then
  log "FAILED: the subscriber's port was not found"
  exit 1
fi

# The subscriber's machine goes away: nothing reaches its port any more.
# (An htb class of 8 bit/s holds them: the container kernels this runs on may have no tc
# actions, hence no `action drop`; a 100-byte packet would take 100 s through that class.)
tc qdisc add dev lo root handle 1: htb default 10 2>/dev/null
tc class add dev lo parent 1: classid 1:10 htb rate 10gbit 2>/dev/null
tc class add dev lo parent 1: classid 1:20 htb rate 8bit ceil 8bit burst 1 cburst 1 2>/dev/null
tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip dport "$client_port" 0xffff flowid 1:20
log "subscriber on port $client_port cut off (heartbeat ${HEARTBEAT_S} s, write_timeout ${WRITE_TIMEOUT_S} s)"
start=$(date +%s.%N)
bound=$((HEARTBEAT_S + WRITE_TIMEOUT_S + SLACK_S))
while true; do
  now=$(date +%s.%N)
  elapsed=$(awk -v a="$start" -v b="$now" 'BEGIN{printf "%.1f", b - a}')
  if [[ $(connections) == 0 ]]; then
    break
  fi
  if awk -v e="$elapsed" 'BEGIN{exit !(e > 40)}'; then
    log "FAILED: the vanished subscriber still holds its stream after $elapsed s"
    exit 1
  fi
  sleep 0.2
done
if awk -v e="$elapsed" -v b="$bound" 'BEGIN{exit !(e > b)}'; then
  log "FAILED: the vanished subscriber was freed after $elapsed s (bound: $bound s)"
  exit 1
fi
log "passed: the vanished subscriber was freed after $elapsed s (bound: heartbeat + write_timeout + ${SLACK_S} s = $bound s)"
