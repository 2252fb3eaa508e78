#!/usr/bin/env bash
# The fault suite (loadtest/faults/README.md): builds the broker, checks the checker, then runs
# every experiment against private redis-server and broker processes on loopback, and writes
# the table to loadtest/results/faults-<form>/RESULTS.md.
#
#   loadtest/faults/run.sh            short form (CI: each fault once, small counts, ~2 minutes)
#   loadtest/faults/run.sh --long     long form (more subscribers, 2,000 fuzzed requests, ~5 min)
#
# Other options: --release (build and test the release binary), --record (also write
# loadtest/faults/RESULTS.md), --only a,b (some experiments), --strict (ignore waivers.txt).
# Needs what scripts/test.sh installs: redis-server and redis-cli, Node 20 with npm, the
# tests/node packages (installed here from the lockfile when missing).
# Exits 1 when a target that is not waived is missed, 2 on a set-up error. Every process it
# starts runs in one process group, which is killed on exit, and the run is bounded in time.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

source scripts/lib.sh

profile=debug
long=0
args=()
for arg in "$@"; do
  case $arg in
    --release) profile=release ;;
    --long) long=1; args+=("$arg") ;;
    *) args+=("$arg") ;;
  esac
done

for tool in redis-server redis-cli node npm cargo; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    log "$tool not found (scripts/test.sh installs what the suite needs)"
    exit 2
  fi
done
if [[ ! -d tests/node/node_modules/eventsource || ! -d tests/node/node_modules/@ag-ui/client ]]; then
  log "installing tests/node from its lockfile"
  npm ci --prefix tests/node --no-audit --no-fund
fi

TARGET_DIR=${CARGO_TARGET_DIR:-target}
build_broker "$profile"

log "checker unit tests"
node --test loadtest/faults/checker.test.mjs >/dev/null

# The whole run is bounded: each experiment has its own limit inside, this is the backstop.
limit=$(( long ? 2700 : 900 ))
log "fault suite ($([[ $long -eq 1 ]] && echo long || echo short) form, $profile binary, at most $limit s)"
run_bounded "fault suite" "$limit" \
  node loadtest/faults/faults.mjs --binary "$TARGET_DIR/$profile/agui-fanout" "${args[@]}"
