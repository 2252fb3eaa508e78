# Shell helpers the repository's scripts share (sourced, not run): logging, installing Debian
# packages as root, building the broker binary, and running a command bounded in time in its
# own process group (killed on exit, failure or signal).

log() { printf '==> %s\n' "$*" >&2; }

# Runs a command as root (sudo only when not root already).
as_root() {
  if [[ $(id -u) -eq 0 ]]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else log "need root to run: $*"; return 1
  fi
}

# apt-get install, with one apt-get update first per script run.
apt_updated=0
apt_install() {
  if [[ $apt_updated -eq 0 ]]; then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update
    apt_updated=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
}

# Builds target/<profile>/agui-fanout (profile: debug | release).
build_broker() {
  if [[ $1 == release ]]; then
    log "cargo build --release --bin agui-fanout"
    cargo build --release --bin agui-fanout
  else
    log "cargo build --bin agui-fanout"
    cargo build --bin agui-fanout
  fi
}

# run_bounded WHAT LIMIT CMD...: runs CMD in a process group of its own for at most LIMIT
# seconds (`timeout`: SIGTERM, SIGKILL 20 s later), kills the group if this script exits
# first, and returns CMD's exit code (1 when it overran, after logging "WHAT stopped after").
bounded_pid=
stop_bounded() {
  [[ -n $bounded_pid ]] || return 0
  kill -TERM -- "-$bounded_pid" 2>/dev/null || true
  for _ in $(seq 1 50); do
    kill -0 -- "-$bounded_pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL -- "-$bounded_pid" 2>/dev/null || true
  bounded_pid=
}
run_bounded() {
  local what=$1 limit=$2 status=0
  shift 2
  trap stop_bounded EXIT
  setsid timeout --kill-after=20 "$limit" "$@" &
  bounded_pid=$!
  wait "$bounded_pid" || status=$?
  bounded_pid=
  if [[ $status -eq 124 ]]; then
    log "$what stopped after $limit s"
    status=1
  fi
  return "$status"
}
