#!/usr/bin/env bash
# The Cluster-vs-single-Redis comparison of loadtest/REPORT.md (issue 17): the `threads` scenario
# (1,000 threads x 10 subscribers, tokens mix) as a rate sweep, broker on CPU 0 and load generator
# on CPU 1 (release builds: `cargo build --release -p agui-fanout -p agui-loadtest`), on a single
# Redis, on a 3-primary Redis Cluster, then on the single Redis again (the spread between the two
# single runs is the noise). Both Redis setups are started here (ports 18000 and 18001-18003, no
# persistence, under a temporary directory) and stopped at the end; nothing else is touched.
#
#   loadtest/cluster-vs-single.sh                 # sweep geom:1000:16000:2 (events/s), 10 s a step
#   SWEEP=geom:2000:8000:2 DURATION=5 loadtest/cluster-vs-single.sh
#
# Prints, per setup and step: offered events/s, deliveries/s, p99 (ms), sustained or not, broker
# CPU per delivery (µs), and the Redis CPU per append of each server (µs; per primary on the
# cluster, from /proc/<pid>/stat around the whole sweep). Reports in
# loadtest/results/cluster-vs-single/ (git-ignored). Bounded: every step is DURATION seconds, the
# whole run stops after 15 minutes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TARGET_DIR=${CARGO_TARGET_DIR:-target}
B=$TARGET_DIR/release/agui-fanout
L=$TARGET_DIR/release/agui-loadtest
SWEEP=${SWEEP:-geom:1000:16000:2}
DURATION=${DURATION:-10}
OUT=loadtest/results/cluster-vs-single
[[ -x $B && -x $L ]] || { echo "build first: cargo build --release -p agui-fanout -p agui-loadtest" >&2; exit 2; }
command -v jq >/dev/null || { echo "jq is needed (apt-get install jq)" >&2; exit 2; }
mkdir -p "$OUT"
DIR=$(mktemp -d /tmp/cluster-vs-single.XXXXXX)
PORTS=(18000 18001 18002 18003)
cleanup() {
  for p in "${PORTS[@]}"; do redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true; done
  rm -rf "$DIR"
}
( sleep 900; echo "cluster-vs-single: 15 minutes passed, stopping" >&2; kill -TERM $$ ) &
WATCHDOG=$!
trap 'kill $WATCHDOG 2>/dev/null || true; cleanup' EXIT

start_redis() { # port [cluster]
  mkdir -p "$DIR/$1"
  local extra=()
  [[ ${2:-} == cluster ]] && extra=(--cluster-enabled yes --cluster-config-file "$DIR/$1/nodes.conf")
  redis-server --port "$1" --dir "$DIR/$1" --save "" --appendonly no --daemonize yes \
    --logfile "$DIR/$1/log" "${extra[@]}"
  for _ in $(seq 50); do redis-cli -p "$1" ping >/dev/null 2>&1 && return; sleep 0.1; done
  echo "redis on $1 did not start" >&2; exit 2
}
start_redis 18000
for p in 18001 18002 18003; do start_redis $p cluster; done
redis-cli --cluster create 127.0.0.1:18001 127.0.0.1:18002 127.0.0.1:18003 \
  --cluster-replicas 0 --cluster-yes >/dev/null
for _ in $(seq 100); do
  [[ $(redis-cli -p 18001 cluster info | tr -d '\r' | grep cluster_state) == cluster_state:ok ]] && break
  sleep 0.1
done

# CPU seconds (user + system) of the redis-server on port $1.
redis_cpu() {
  local pid ticks
  pid=$(redis-cli -p "$1" info server | tr -d '\r' | sed -n 's/^process_id://p')
  ticks=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  echo "$ticks $(getconf CLK_TCK)" | awk '{printf "%.3f", $1 / $2}'
}

run() { # label url port redis-ports...
  local label=$1 url=$2 port=$3; shift 3
  local before=() p
  for p in "$@"; do before+=("$(redis_cpu "$p")"); done
  env AGUI_LOG=warn AGUI_REDIS_URL="$url" AGUI_SHUTDOWN__DRAIN=1s AGUI_RETENTION__IDLE_TTL=1h \
    taskset -c 0 "$B" serve --listen "127.0.0.1:$port" >"$OUT/$label.server.log" 2>&1 &
  local pid=$!
  sleep 2
  set +e
  taskset -c 1 "$L" --url "http://127.0.0.1:$port" --broker-pid "$pid" --out "$OUT" --label "$label" \
    --quiet threads --threads 1000 --subscribers 10 --sweep "$SWEEP" --duration "$DURATION" \
    --max-batch 1 --publish-conns 32 --mix tokens >"$OUT/$label.log" 2>&1
  local rc=$?
  set -e
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
  local appends
  appends=$(jq '[.steps[].publish.posts] | add' "$OUT/$label.json")
  echo "## $label (load generator exit $rc)"
  echo "offered/s deliveries/s p99_ms sustained cpu_us_per_delivery"
  jq -r '.steps[] | [.offered_rate, (.deliveries_per_s|floor), ((.latency.p99_us // 0)/1000),
    .sustained, ((.broker.total_ns_per_delivery // 0)/1000)] | @tsv' "$OUT/$label.json"
  local i=0
  for p in "$@"; do
    echo "redis :$p CPU per append: $(awk -v a="${before[$i]}" -v b="$(redis_cpu "$p")" -v n="$appends" \
      'BEGIN {printf "%.1f µs (%.2f s over %d appends)", (b - a) * 1e6 / n, b - a, n}')"
    i=$((i + 1))
  done
}

run single redis://127.0.0.1:18000 18390 18000
run cluster redis://127.0.0.1:18001,redis://127.0.0.1:18002,redis://127.0.0.1:18003 18391 18001 18002 18003
run single2 redis://127.0.0.1:18000 18392 18000
