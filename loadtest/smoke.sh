#!/usr/bin/env bash
# CI smoke run of the load generator (called by scripts/test.sh after the cargo tests):
#   1. runs the load generator's unit tests and builds both binaries (debug);
#   2. starts the demo agent (`agui-fanout demo-agent --pace 0`) and a broker on free loopback
#      ports (memory backend), the demo agent configured as agent `demo`;
#   3. runs a 10-second `fanout` scenario (1 thread x 50 subscribers, 200 events/s) and a short
#      `resume-storm` (50 subscribers drop and resume with Last-Event-ID at once), both with the
#      `tokens` mix (LLM token deltas inside runs, checked by the broker's order validation), and
#      a small `runs` scenario (40 gateway runs, 4 at once, 2 viewers per thread, then the same
#      events published plainly);
#   4. stops the broker (SIGTERM, then waits for it) and the demo agent.
# Fails when a scenario reports a gap, a duplicate, a connect error, a missing delivery, an
# inexact resume, or a run that is not whole or not seen whole by its viewers (the load
# generator's exit code). Nothing here asserts on timing: latency and throughput are printed,
# not checked.
# Results go to $SMOKE_OUT (default loadtest/results/smoke, git-ignored).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '==> %s\n' "$*" >&2; }

OUT=${SMOKE_OUT:-loadtest/results/smoke}
TARGET_DIR=${CARGO_TARGET_DIR:-target}
BROKER=$TARGET_DIR/debug/agui-fanout
LOADTEST=$TARGET_DIR/debug/agui-loadtest

log "cargo test -p agui-loadtest"
cargo test -p agui-loadtest
log "building agui-fanout and agui-loadtest (debug)"
cargo build -p agui-fanout -p agui-loadtest --bins

mkdir -p "$OUT"
broker_log=$(mktemp)
broker_pid=
agent_log=$(mktemp)
agent_pid=

stop_broker() {
  [[ -n $broker_pid ]] || return 0
  if kill -0 "$broker_pid" 2>/dev/null; then
    kill -TERM "$broker_pid" 2>/dev/null || true
    for _ in $(seq 1 300); do
      kill -0 "$broker_pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$broker_pid" 2>/dev/null; then
      log "broker $broker_pid still running 30 s after SIGTERM: SIGKILL"
      kill -KILL "$broker_pid" 2>/dev/null || true
    fi
  fi
  wait "$broker_pid" 2>/dev/null || true
  broker_pid=
}
stop_agent() {
  [[ -n $agent_pid ]] || return 0
  kill -TERM "$agent_pid" 2>/dev/null || true
  wait "$agent_pid" 2>/dev/null || true
  agent_pid=
}
trap 'stop_broker; stop_agent; rm -f "$broker_log" "$agent_log"' EXIT

# The demo agent prints `demo agent listening on http://ADDR` once bound.
log "starting the demo agent on a free loopback port"
AGUI_LOG=warn "$BROKER" demo-agent --listen 127.0.0.1:0 --pace 0 >"$agent_log" 2>&1 &
agent_pid=$!
agent_url=
for _ in $(seq 1 300); do
  agent_url=$(grep -o 'demo agent listening on http://[0-9.:]*' "$agent_log" | head -n1 | cut -d' ' -f5 || true)
  [[ -n $agent_url ]] && break
  if ! kill -0 "$agent_pid" 2>/dev/null; then
    log "the demo agent exited before listening:"
    cat "$agent_log" >&2
    exit 1
  fi
  sleep 0.1
done
[[ -n $agent_url ]] || { log "the demo agent did not report its address within 30 s"; exit 1; }
log "demo agent pid $agent_pid listening on $agent_url"

# Port 0: the kernel picks a free port; the broker logs the address it bound.
log "starting the broker (memory backend) on a free loopback port"
AGUI_LOG=info AGUI_REDIS_URL= AGUI_AGENTS__DEMO__URL="$agent_url/" "$BROKER" serve --listen 127.0.0.1:0 >"$broker_log" 2>&1 &
broker_pid=$!
addr=
for _ in $(seq 1 300); do
  addr=$(sed 's/\x1b\[[0-9;]*m//g' "$broker_log" | grep -o 'listening addr=[0-9.:]*' | head -n1 | cut -d= -f2 || true)
  [[ -n $addr ]] && break
  if ! kill -0 "$broker_pid" 2>/dev/null; then
    log "the broker exited before listening:"
    cat "$broker_log" >&2
    exit 1
  fi
  sleep 0.1
done
if [[ -z $addr ]]; then
  log "the broker did not report its address within 30 s:"
  cat "$broker_log" >&2
  exit 1
fi
log "broker pid $broker_pid listening on $addr"

common=(--url "http://$addr" --broker-pid "$broker_pid" --out "$OUT" --quiet)
status=0

log "fanout: 1 thread x 50 subscribers, 200 events/s for 10 s"
"$LOADTEST" "${common[@]}" --label smoke-fanout \
  fanout --mix tokens --subscribers 50 --rate 200 --duration 10 --drain-timeout 60 || status=$?
[[ $status -eq 0 ]] || log "fanout smoke FAILED (exit code $status)"

log "resume-storm: 50 subscribers reconnect with Last-Event-ID at once, 200 events/s for 4 s"
storm_status=0
"$LOADTEST" "${common[@]}" --label smoke-resume-storm \
  resume-storm --mix tokens --subscribers 50 --rate 200 --duration 4 --storm-at 2 --drain-timeout 60 \
  || storm_status=$?
if [[ $storm_status -ne 0 ]]; then
  log "resume-storm smoke FAILED (exit code $storm_status)"
  [[ $status -ne 0 ]] || status=$storm_status
fi

log "runs: 40 gateway runs against the demo agent, 4 at once, 2 viewers per thread, then published plainly"
runs_status=0
"$LOADTEST" "${common[@]}" --label smoke-runs \
  runs --agent-url "$agent_url/" --concurrency 4 --runs 40 --viewers 2 --pause 0.2 --drain-timeout 60 \
  || runs_status=$?
if [[ $runs_status -ne 0 ]]; then
  log "runs smoke FAILED (exit code $runs_status)"
  [[ $status -ne 0 ]] || status=$runs_status
fi

stop_broker
stop_agent
if [[ $status -eq 0 ]]; then
  log "loadtest smoke passed (results in $OUT)"
else
  log "loadtest smoke failed (exit code $status); broker log:"
  tail -n 50 "$broker_log" >&2 || true
fi
exit "$status"
