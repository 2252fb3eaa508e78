#!/usr/bin/env bash
# The one command that runs the whole test suite on a fresh machine (Debian, Rust toolchain,
# Node 20 + npm; Redis optional):
#   1. makes sure `redis-server` is installed (tests start private servers to stop and restart)
#      and that a Redis answers on 127.0.0.1:6379 (started here, without persistence, if not);
#   2. installs the Node test client from its lockfile (`npm ci --prefix tests/node`), builds
#      the TypeScript client package (`npm ci --prefix clients/js && npm run build --prefix
#      clients/js`; tests/client_js.rs runs its tests), installs the console's bundler
#      (console/, to check the committed bundle) and makes sure Debian's `chromium` is installed
#      (the console's browser test, tests/console.rs, drives it headless);
#   3. makes sure `python3 -m venv` works (python3-venv), for the Python example agent's test;
#   4. runs `cargo test --all-targets --no-fail-fast` and `cargo test --doc`, then the load
#      generator's smoke run (loadtest/smoke.sh) and the fault suite's short form
#      (loadtest/faults/run.sh: private redis-servers and brokers, about 2-3 minutes);
#   5. frees a subscriber that vanished without closing its connection within heartbeat +
#      write_timeout (scripts/vanished-peer.sh: a network namespace of its own, root, iproute2);
#   6. checks deploy/ (scripts/check-deploy.sh: the Kubernetes overlays render, validate and pass
#      checkov; the alert rules pass promtool's check and unit tests; installs its own tools).
#   7. runs the rolling-deploy test's short form (deploy/rolling/run.sh --short: a Redis Cluster,
#      brokers behind HAProxy, Prometheus; installs haproxy and prometheus; 3-4 minutes).
# Exits with the first failing step's code. A Redis started here is left running.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

REDIS_HOST=127.0.0.1
REDIS_PORT=6379

log() { printf '==> %s\n' "$*" >&2; }

# Runs a command as root (sudo only when not root already).
as_root() {
  if [[ $(id -u) -eq 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    log "need root to run: $* (no sudo available)"
    return 1
  fi
}

apt_updated=0
apt_install() {
  if ! command -v apt-get >/dev/null 2>&1; then
    log "apt-get not found: install $* by hand"
    return 1
  fi
  if [[ $apt_updated -eq 0 ]]; then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update
    apt_updated=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
}

# True when something on $REDIS_HOST:$REDIS_PORT answers PING with PONG.
redis_answers() {
  if command -v redis-cli >/dev/null 2>&1; then
    [[ $(timeout 3 redis-cli -h "$REDIS_HOST" -p "$REDIS_PORT" ping 2>/dev/null || true) == PONG ]]
  else
    timeout 3 bash -c '
      exec 3<>"/dev/tcp/$0/$1" || exit 1
      printf "PING\r\n" >&3
      IFS= read -r line <&3 || exit 1
      [[ $line == +PONG* ]]
    ' "$REDIS_HOST" "$REDIS_PORT" 2>/dev/null
  fi
}

# --- Redis -----------------------------------------------------------------------------------
# The binary is needed even when a Redis already answers: outage tests run private servers.
if ! command -v redis-server >/dev/null 2>&1; then
  log "redis-server not found: installing it with apt-get"
  apt_install redis-server
fi
if redis_answers; then
  log "Redis answers on $REDIS_HOST:$REDIS_PORT"
else
  log "starting redis-server on $REDIS_HOST:$REDIS_PORT (no persistence)"
  redis-server --daemonize yes --bind "$REDIS_HOST" --port "$REDIS_PORT" \
    --save "" --appendonly no
  for _ in $(seq 1 100); do
    redis_answers && break
    sleep 0.1
  done
  if ! redis_answers; then
    log "redis-server did not answer on $REDIS_HOST:$REDIS_PORT within 10 s"
    exit 1
  fi
  log "Redis is up"
fi

# --- Node test client ------------------------------------------------------------------------
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  log "node/npm not found: installing them with apt-get (Node 20+ is expected)"
  apt_install nodejs npm
fi
log "node $(node --version); installing tests/node from its lockfile"
npm ci --prefix tests/node --no-audit --no-fund
log "building the client package clients/js (@agui-fanout/client)"
npm ci --prefix clients/js --no-audit --no-fund
npm run build --prefix clients/js
log "installing the console's bundler (console/)"
npm ci --prefix console --no-audit --no-fund

# --- Chromium (tests/console.rs drives it headless through playwright-core) ----------------------
if [[ ! -x ${AGUI_TEST_CHROMIUM:-/usr/bin/chromium} ]]; then
  log "chromium not found: installing it with apt-get"
  apt_install chromium
fi
log "$("${AGUI_TEST_CHROMIUM:-/usr/bin/chromium}" --version 2>/dev/null || echo chromium)"

# --- Python (examples/python-agent) -----------------------------------------------------------
# tests/python_agent.rs installs the example agent into a virtualenv under target/ (PyPI);
# Debian's python3 needs python3-venv for `python3 -m venv` (ensurepip).
if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  log "python3 with venv not found: installing python3 and python3-venv with apt-get"
  apt_install python3 python3-venv
fi
log "$(python3 --version) with venv"

# --- Rust tests ------------------------------------------------------------------------------
# Every test binary runs (--no-fail-fast) and the doc tests run too, so one failure does not
# hide the others; the exit code is the first failure's.
status=0
log "cargo test --all-targets"
cargo test --all-targets --no-fail-fast || status=$?
log "cargo test --doc"
cargo test --doc || { doc_status=$?; [[ $status -ne 0 ]] || status=$doc_status; }
bash loadtest/smoke.sh || { smoke_status=$?; [[ $status -ne 0 ]] || status=$smoke_status; }
bash loadtest/faults/run.sh || { faults_status=$?; [[ $status -ne 0 ]] || status=$faults_status; }
bash scripts/vanished-peer.sh || { vanished_status=$?; [[ $status -ne 0 ]] || status=$vanished_status; }
bash scripts/check-deploy.sh || { deploy_status=$?; [[ $status -ne 0 ]] || status=$deploy_status; }
bash deploy/rolling/run.sh --short || { rolling_status=$?; [[ $status -ne 0 ]] || status=$rolling_status; }
if [[ $status -eq 0 ]]; then
  log "all tests passed"
else
  log "tests failed (exit code $status)"
fi
exit "$status"
