#!/usr/bin/env bash
# The rolling-deploy test (deploy/README.md "Rolling-deploy test", issue 17 item 7): a Redis
# Cluster (3 primaries + 3 replicas), agui-fanout brokers behind HAProxy, producers and
# EventSource subscribers through HAProxy, Prometheus with the alert rules; a rolling restart,
# a scale-out 3 → 5, a scale-in 5 → 3, a Redis failover, a Redis primary killed, and a primary
# killed with writes its replica never got. Writes the table to
# loadtest/results/rolling-<form>/RESULTS.md.
#
#   deploy/rolling/run.sh            full form (10 threads, 300 subscribers, about 5 minutes)
#   deploy/rolling/run.sh --short    short form (6 threads, 300 subscribers, about 3-4 minutes
#                                    on a loaded 2-core machine; scripts/test.sh)
#
# Other options: --release (build and test the release binary), --base-port N (every process
# listens on 127.0.0.1, ports N to N+140; default 17600).
# Installs what it needs when missing: haproxy and prometheus (Debian packages, apt-get),
# redis-server, Node 20 with npm, the tests/node packages (npm ci from the lockfile).
# Exits 1 when a target is missed, 2 on a set-up error. Every process it starts runs in one
# process group, killed on exit; the run is bounded in time.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

source scripts/lib.sh

profile=debug
short=0
args=()
for arg in "$@"; do
  case $arg in
    --release) profile=release ;;
    --short) short=1; args+=("$arg") ;;
    *) args+=("$arg") ;;
  esac
done

missing=()
command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v node >/dev/null 2>&1 || missing+=(nodejs npm)
if [[ ${#missing[@]} -gt 0 ]]; then
  log "installing ${missing[*]} with apt-get"
  apt_install "${missing[@]}"
fi
# Debian's prometheus package may start its own service where services start; this test runs
# its own Prometheus on a private port and leaves any other alone.
if [[ ! -d tests/node/node_modules/eventsource ]]; then
  log "installing tests/node from its lockfile"
  npm ci --prefix tests/node --no-audit --no-fund
fi

TARGET_DIR=${CARGO_TARGET_DIR:-target}
build_broker "$profile"

limit=$(( short ? 360 : 600 ))
log "rolling-deploy test ($([[ $short -eq 1 ]] && echo short || echo full) form, $profile binary, at most $limit s)"
run_bounded "rolling-deploy test" "$limit" \
  node deploy/rolling/rolling.mjs --binary "$TARGET_DIR/$profile/agui-fanout" "${args[@]}"
