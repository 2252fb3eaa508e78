#!/usr/bin/env bash
# The Cluster-vs-single-Redis comparison of loadtest/REPORT.md (issue 17): `threads` 1,000 x 10
# at a fixed rate with the tokens mix, broker on CPU 0 and load generator on CPU 1 (release
# builds: `cargo build --release -p agui-fanout -p agui-loadtest`), on the single Redis at
# 127.0.0.1:6379, then on a 3-primary Redis Cluster on 18001-18003, then on the single Redis
# again (the spread between the two single runs is the noise). Start the cluster first:
#   for p in 18001 18002 18003; do mkdir -p /tmp/cl/$p; redis-server --port $p \
#     --cluster-enabled yes --cluster-config-file /tmp/cl/$p/nodes.conf --dir /tmp/cl/$p \
#     --save "" --appendonly no --daemonize yes; done
#   redis-cli --cluster create 127.0.0.1:18001 127.0.0.1:18002 127.0.0.1:18003 \
#     --cluster-replicas 0 --cluster-yes
# Results in loadtest/results/cluster-vs-single/ (git-ignored).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TARGET_DIR=${CARGO_TARGET_DIR:-target}
B=$TARGET_DIR/release/agui-fanout; L=$TARGET_DIR/release/agui-loadtest
OUT=loadtest/results/cluster-vs-single; mkdir -p "$OUT"
run() { # label url port rate
  env AGUI_LOG=warn AGUI_REDIS_URL="$2" AGUI_SHUTDOWN__DRAIN=1s AGUI_RETENTION__IDLE_TTL=1h taskset -c 0 $B serve --listen 127.0.0.1:$3 > $OUT/$1.server.log 2>&1 &
  local pid=$!; sleep 2
  taskset -c 1 $L --url http://127.0.0.1:$3 --broker-pid $pid --out $OUT --label $1 --quiet threads --threads 1000 --subscribers 10 --rate $4 --duration 10 --max-batch 1 --publish-conns 32 --mix tokens > $OUT/$1.log 2>&1
  echo "$1 rc=$?"; kill -TERM $pid; wait $pid 2>/dev/null
}
for rate in ${RATES:-2000}; do  # RATES="1000 2000 4000" for more steps
  run single-$rate redis://127.0.0.1:6379 18390 $rate
  run cluster-$rate redis://127.0.0.1:18001,redis://127.0.0.1:18002,redis://127.0.0.1:18003 18391 $rate
  run single2-$rate redis://127.0.0.1:6379 18392 $rate
done
