#!/usr/bin/env bash
# Side by side: agui-fanout and nchan (the nginx pub/sub module) under the same load.
#
#   1. installs nginx + libnginx-mod-nchan (and jq) with apt-get when missing, without starting
#      nginx as a system service (nothing here reads /etc/nginx or listens on port 80);
#   2. builds agui-fanout and agui-loadtest (release) and copies both binaries aside, so a
#      rebuild during the run cannot mix versions;
#   3. per scenario and target: starts the server on a loopback port pinned to CPU 0 (agui-fanout
#      with its memory or Redis backend; nginx with one worker, in-memory or Redis storage),
#      with the open-files limit raised to the hard limit, runs the load generator pinned to
#      CPU 1, stops the server (a fresh server for every scenario);
#   4. prints a table (scenario, metric, agui-fanout, nchan, ratio) and writes it, with a JSON
#      summary, the raw results, the logs and the nginx configurations, into the output dir.
#
# Usage: loadtest/compare.sh [options]      (every option also has an environment variable)
#   --quick              QUICK=1        small and short (a check that everything runs, minutes)
#   --scenarios LIST     SCENARIOS      comma-separated, default all:
#                                       fanout,fanout-sweep,threads,threads-sweep,threads-redis,
#                                       idle,resume-storm,slow
#   --targets LIST       TARGETS        agui-fanout,nchan (default both)
#   --out DIR            OUT            default loadtest/results/compare-<UTC time> (relative
#                                       paths are taken from the repository root)
#   --mix MIX            MIX            event mix of the streaming scenarios: tokens (default),
#                                       agent or custom (loadtest/README.md "Event mixes")
#   --no-build           BUILD=0        use the binaries already in $CARGO_TARGET_DIR/release
#   --install-only                      install nginx + nchan and exit
#   --list                              print the scenarios' load generator arguments and exit
# Other settings (environment only):
#   MAX_BATCH=1           events per POST for both targets (nchan stores one POST as one message)
#   PUBLISH_CONNS=32      publishing keep-alive connections (at most one per thread: a thread's
#                         events go through one connection, in order)
#   NCHAN_BUFFER=10000    nchan_message_buffer_length (agui-fanout keeps retention.max_events =
#                         10000 per thread by default)
#   NCHAN_TIMEOUT=1h      nchan_message_timeout
#   NCHAN_SHM=2048m       nchan_shared_memory_size (nchan's message store; mapped lazily)
#   REDIS_URL=redis://127.0.0.1:6379   Redis for the threads-redis scenario (shared: keys of
#                         this run are deleted afterwards unless KEEP_REDIS_KEYS=1; no FLUSHALL)
#   BROKER_PORT=18380 NCHAN_PORT=18381 (the next free port is taken when busy)
#   SERVER_CPU=0 LOADGEN_CPU=1
#   LOADGEN_ARGS="..."    extra global options for every load generator run
#   SCENARIO_ARGS="..."   extra scenario options, appended to every streaming scenario's arguments
#                         (e.g. "--event-bytes 1000"; later options win)
#
# Exit code: 0 when every run completed (whatever its checks said: the table shows them), 1 when
# a run could not be done (server did not start, load generator error).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

log() { printf '==> %s\n' "$*" >&2; }
die() {
  printf 'error: %s\n' "$*" >&2
  exit 1
}

ALL_SCENARIOS=fanout,fanout-sweep,threads,threads-sweep,threads-redis,idle,resume-storm,slow
ALL_TARGETS=agui-fanout,nchan

QUICK=${QUICK:-0}
SCENARIOS=${SCENARIOS:-$ALL_SCENARIOS}
TARGETS=${TARGETS:-$ALL_TARGETS}
OUT=${OUT:-}
BUILD=${BUILD:-1}
MIX=${MIX:-tokens}
INSTALL_ONLY=0
LIST_ONLY=0
MAX_BATCH=${MAX_BATCH:-1}
PUBLISH_CONNS=${PUBLISH_CONNS:-32}
NCHAN_BUFFER=${NCHAN_BUFFER:-10000}
NCHAN_TIMEOUT=${NCHAN_TIMEOUT:-1h}
NCHAN_SHM=${NCHAN_SHM:-2048m}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
BROKER_PORT=${BROKER_PORT:-18380}
NCHAN_PORT=${NCHAN_PORT:-18381}
SERVER_CPU=${SERVER_CPU:-0}
LOADGEN_CPU=${LOADGEN_CPU:-1}
KEEP_REDIS_KEYS=${KEEP_REDIS_KEYS:-0}
LOADGEN_ARGS=${LOADGEN_ARGS:-}
SCENARIO_ARGS=${SCENARIO_ARGS:-}
NCHAN_MODULE=/usr/lib/nginx/modules/ngx_nchan_module.so

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'; }

while [[ $# -gt 0 ]]; do
  case $1 in
    --quick) QUICK=1 ;;
    --scenarios) SCENARIOS=${2:?--scenarios needs a list}; shift ;;
    --scenarios=*) SCENARIOS=${1#*=} ;;
    --targets) TARGETS=${2:?--targets needs a list}; shift ;;
    --targets=*) TARGETS=${1#*=} ;;
    --out) OUT=${2:?--out needs a directory}; shift ;;
    --out=*) OUT=${1#*=} ;;
    --mix) MIX=${2:?--mix needs tokens, agent or custom}; shift ;;
    --mix=*) MIX=${1#*=} ;;
    --no-build) BUILD=0 ;;
    --install-only) INSTALL_ONLY=1 ;;
    --list) LIST_ONLY=1 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift
done

IFS=, read -r -a SCENARIO_LIST <<<"$SCENARIOS"
IFS=, read -r -a TARGET_LIST <<<"$TARGETS"
for s in "${SCENARIO_LIST[@]}"; do
  [[ ,$ALL_SCENARIOS, == *,"$s",* ]] || die "unknown scenario $s (known: $ALL_SCENARIOS)"
done
for t in "${TARGET_LIST[@]}"; do
  [[ ,$ALL_TARGETS, == *,"$t",* ]] || die "unknown target $t (known: $ALL_TARGETS)"
done
[[ $MIX == tokens || $MIX == agent || $MIX == custom ]] || die "unknown mix $MIX (tokens, agent, custom)"

# ---------------------------------------------------------------------------------------------
# Scenarios: the load generator's arguments (identical for both targets), full size and QUICK.
# Sets SC_BACKEND (memory | redis), SC_KIND (how to read the result) and SC_ARGS.
# ---------------------------------------------------------------------------------------------
scenario() {
  local name=$1 q=$QUICK
  local batch=(--max-batch "$MAX_BATCH" --publish-conns "$PUBLISH_CONNS")
  SC_BACKEND=memory
  case $name in
    fanout)
      SC_KIND=single
      if [[ $q == 1 ]]; then
        SC_ARGS=(fanout --subscribers 200 --rate 100 --duration 5)
      else
        SC_ARGS=(fanout --subscribers 1000 --rate 100 --duration 10)
      fi ;;
    fanout-sweep)
      SC_KIND=sweep
      if [[ $q == 1 ]]; then
        SC_ARGS=(fanout --subscribers 200 --sweep geom:200:3200:2 --duration 3 --sweep-refine 1 --pause 0.5)
      else
        SC_ARGS=(fanout --subscribers 1000 --sweep geom:100:12800:2 --duration 10)
      fi ;;
    threads)
      SC_KIND=single
      if [[ $q == 1 ]]; then
        SC_ARGS=(threads --threads 100 --subscribers 10 --rate 600 --duration 5)
      else
        SC_ARGS=(threads --threads 1000 --subscribers 10 --rate 6000 --duration 10)
      fi ;;
    threads-sweep | threads-redis)
      SC_KIND=sweep
      [[ $name == threads-redis ]] && SC_BACKEND=redis
      if [[ $q == 1 ]]; then
        SC_ARGS=(threads --threads 100 --subscribers 10 --sweep geom:500:8000:2 --duration 3 --sweep-refine 1 --pause 0.5)
      elif [[ $name == threads-redis ]]; then
        SC_ARGS=(threads --threads 1000 --subscribers 10 --sweep geom:1000:64000:2 --duration 10)
      else
        SC_ARGS=(threads --threads 1000 --subscribers 10 --sweep geom:2000:64000:2 --duration 10)
      fi ;;
    idle)
      SC_KIND=idle
      if [[ $q == 1 ]]; then
        SC_ARGS=(idle --connections 2000 --threads 100)
      else
        SC_ARGS=(idle --connections 15000 --threads 100)
      fi
      return ;;
    resume-storm)
      SC_KIND=storm
      if [[ $q == 1 ]]; then
        SC_ARGS=(resume-storm --threads 10 --subscribers 100 --rate 100 --duration 6 --storm-at 3)
      else
        SC_ARGS=(resume-storm --threads 10 --subscribers 1000 --rate 100 --duration 20 --storm-at 10)
      fi ;;
    slow)
      SC_KIND=slow
      if [[ $q == 1 ]]; then
        SC_ARGS=(slow --threads 1 --subscribers 200 --slow-share 0.1 --rate 100 --duration 8 --event-bytes 2000)
      elif [[ $MIX == custom ]]; then
        # 2 kB events: a stalled connection then outgrows what the kernel's socket buffers
        # absorb (a few MB on loopback) within the step, so the servers' own buffering shows.
        SC_ARGS=(slow --threads 1 --subscribers 1000 --slow-share 0.1 --rate 100 --duration 30 --event-bytes 2000)
      else
        # The mixes' events keep their own size (~200 B): 1,000 events/s for 60 s make a
        # stalled connection outgrow the socket buffers (~12 MB), with 50 subscribers so the
        # others' deliveries stay within one core.
        SC_ARGS=(slow --threads 1 --subscribers 50 --slow-share 0.1 --rate 1000 --duration 60)
      fi ;;
    *) die "unknown scenario $name" ;;
  esac
  # Both targets get the same measured events, byte for byte (nchan only skips the unmeasured
  # opening events: the RUN_STARTED, and with --mix agent the initial STATE_SNAPSHOT).
  SC_ARGS+=("${batch[@]}" --mix "$MIX")
  # shellcheck disable=SC2206 # SCENARIO_ARGS is split on purpose
  [[ -z $SCENARIO_ARGS ]] || SC_ARGS+=($SCENARIO_ARGS)
}

if [[ $LIST_ONLY == 1 ]]; then
  for s in "${SCENARIO_LIST[@]}"; do
    scenario "$s"
    printf '%-14s %-6s agui-loadtest %s\n' "$s" "$SC_BACKEND" "${SC_ARGS[*]}"
  done
  exit 0
fi

# ---------------------------------------------------------------------------------------------
# Installation: nginx + nchan from Debian, never started as a service.
# ---------------------------------------------------------------------------------------------
install_packages() {
  local pkgs=()
  command -v nginx >/dev/null 2>&1 || pkgs+=(nginx)
  [[ -f $NCHAN_MODULE ]] || pkgs+=(libnginx-mod-nchan)
  command -v jq >/dev/null 2>&1 || pkgs+=(jq)
  command -v taskset >/dev/null 2>&1 || pkgs+=(util-linux)
  command -v curl >/dev/null 2>&1 || pkgs+=(curl)
  [[ ${#pkgs[@]} -gt 0 ]] || return 0
  [[ $(id -u) == 0 ]] || die "missing ${pkgs[*]}; run as root or: sudo apt-get install -y ${pkgs[*]}"
  local nginx_before=0
  command -v nginx >/dev/null 2>&1 && nginx_before=1
  # policy-rc.d exit 101 tells invoke-rc.d (and deb-systemd-invoke) not to start services
  # during the install: the package would otherwise start nginx on port 80.
  local own_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\n# written by agui-fanout loadtest/compare.sh during apt-get install\nexit 101\n' \
      >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  log "apt-get install ${pkgs[*]} (nginx is not started as a service)"
  local rc=0
  {
    apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${pkgs[@]}"
  } || rc=$?
  [[ $own_policy == 1 ]] && rm -f /usr/sbin/policy-rc.d
  [[ $rc == 0 ]] || die "apt-get install ${pkgs[*]} failed"
  # A system whose init ignored policy-rc.d: stop and disable what this install started.
  if [[ $nginx_before == 0 ]] && command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
    systemctl disable --now nginx >/dev/null 2>&1 || true
  fi
  [[ -f $NCHAN_MODULE ]] || die "$NCHAN_MODULE is missing after the install"
}

install_packages
nginx -v >/dev/null 2>&1 || die "nginx does not run"
if [[ $INSTALL_ONLY == 1 ]]; then
  log "nginx and nchan are installed ($(nginx -v 2>&1), $(dpkg-query -W -f '${Version}' libnginx-mod-nchan 2>/dev/null || echo '?'))"
  exit 0
fi
command -v redis-cli >/dev/null 2>&1 || log "note: redis-cli not found; Redis keys of this run will not be deleted"

# ---------------------------------------------------------------------------------------------
# Binaries, output directory, work directory.
# ---------------------------------------------------------------------------------------------
TARGET_DIR=${CARGO_TARGET_DIR:-target}
if [[ $BUILD == 1 ]]; then
  log "cargo build --release -p agui-fanout -p agui-loadtest"
  cargo build --release -p agui-fanout -p agui-loadtest
fi
for b in agui-fanout agui-loadtest; do
  [[ -x $TARGET_DIR/release/$b ]] || die "$TARGET_DIR/release/$b is missing (run without --no-build)"
done

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=${OUT:-loadtest/results/compare-$STAMP}
mkdir -p "$OUT/raw" "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d /tmp/agui-compare.XXXXXX)
chmod 755 "$WORK" # nginx workers run as nobody
mkdir -p "$WORK/bin"
cp "$TARGET_DIR/release/agui-fanout" "$TARGET_DIR/release/agui-loadtest" "$WORK/bin/"
BROKER=$WORK/bin/agui-fanout
LOADTEST=$WORK/bin/agui-loadtest

NOFILE=$(ulimit -Hn)
[[ $NOFILE == unlimited ]] && NOFILE=1048576
WORKER_CONNECTIONS=20000
NS=aguicmp$STAMP # nchan's Redis namespace for this run

server_pid= # agui-fanout, or the nginx master
cleanup() {
  stop_server
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {
  local p=$1
  while port_busy "$p"; do p=$((p + 1)); done
  echo "$p"
}

# ---------------------------------------------------------------------------------------------
# nginx + nchan configuration (one worker; storage memory or redis).
# ---------------------------------------------------------------------------------------------
nginx_conf() {
  local backend=$1 port=$2 dir=$3
  local redis_http="" redis_loc=""
  if [[ $backend == redis ]]; then
    redis_http="
  # nchan 1.3.6 form of nchan_redis_url + nchan_use_redis (both still accepted, with a warning).
  upstream nchan_redis {
    nchan_redis_server $REDIS_URL;
  }"
    redis_loc="
      nchan_redis_pass nchan_redis;
      nchan_redis_storage_mode distributed; # every message in Redis, like agui-fanout's Streams
      nchan_redis_namespace $NS;             # unique per run (shared Redis)"
  fi
  cat <<EOF
# nchan ($backend storage) for agui-fanout's loadtest/compare.sh; generated, do not edit.
load_module $NCHAN_MODULE;
worker_processes 1;               # one worker, pinned with the master to one CPU (taskset)
worker_rlimit_nofile $NOFILE;
daemon off;
master_process on;
pid $dir/nginx.pid;
error_log $dir/error.log warn;

events {
  worker_connections $WORKER_CONNECTIONS;
}

http {
  access_log off;
  keepalive_requests 1000000;     # default 1000: publishers' keep-alive connections would be cut
  keepalive_timeout 300s;
  client_body_buffer_size 64k;    # events are read in memory
  client_max_body_size 16m;       # as agui-fanout's limits.max_body_bytes
  client_body_temp_path $dir/tmp/body;
  proxy_temp_path $dir/tmp/proxy;
  fastcgi_temp_path $dir/tmp/fastcgi;
  uwsgi_temp_path $dir/tmp/uwsgi;
  scgi_temp_path $dir/tmp/scgi;
  nchan_shared_memory_size $NCHAN_SHM;
$redis_http
  server {
    listen 127.0.0.1:$port backlog=8192;   # as agui-fanout's listen backlog
    location = /healthz {
      return 200 "ok\n";
    }
    # POST publishes one message, GET (Accept: text/event-stream) subscribes: same path as
    # agui-fanout's /v1/threads/{threadId}/events.
    location ~ ^/v1/threads/([A-Za-z0-9._:-]+)/events\$ {
      nchan_pubsub http eventsource;
      nchan_channel_id \$1;
      nchan_message_buffer_length $NCHAN_BUFFER;  # agui-fanout: retention.max_events = 10000
      nchan_message_timeout $NCHAN_TIMEOUT;
      nchan_subscriber_first_message newest;     # like agui-fanout without an id: live events
      nchan_eventsource_ping_interval 15;        # agui-fanout: sse.heartbeat = 15s$redis_loc
    }
  }
}
EOF
}

# ---------------------------------------------------------------------------------------------
# Servers.
# ---------------------------------------------------------------------------------------------
SERVER_LOG=
BROKER_PID=  # what the load generator samples: agui-fanout, or the nginx worker
URL=

wait_http() { # url, seconds, status wanted
  local url=$1 secs=$2 want=$3 code
  for _ in $(seq 1 $((secs * 10))); do
    code=$(curl -s -o /dev/null -m 1 -w '%{http_code}' "$url" || true)
    [[ $code == "$want" ]] && return 0
    kill -0 "$server_pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

start_agui() {
  local backend=$1 port
  port=$(free_port "$BROKER_PORT")
  local redis=""
  [[ $backend == redis ]] && redis=$REDIS_URL
  (
    ulimit -n "$NOFILE"
    exec env AGUI_LOG=warn AGUI_REDIS_URL="$redis" AGUI_SHUTDOWN__DRAIN=1s \
      AGUI_RETENTION__IDLE_TTL=1h taskset -c "$SERVER_CPU" "$BROKER" serve --listen "127.0.0.1:$port"
  ) >"$SERVER_LOG" 2>&1 &
  server_pid=$!
  URL=http://127.0.0.1:$port
  wait_http "$URL/readyz" 30 200 || {
    tail -n 20 "$SERVER_LOG" >&2
    return 1
  }
  BROKER_PID=$server_pid
  [[ $(cat "/proc/$BROKER_PID/comm" 2>/dev/null) == agui-fanout ]] || {
    log "pid $BROKER_PID is not agui-fanout"
    return 1
  }
}

start_nchan() {
  local backend=$1 port
  local dir=$WORK/nginx-$backend
  port=$(free_port "$NCHAN_PORT")
  rm -rf "$dir"
  mkdir -p "$dir/tmp"
  nginx_conf "$backend" "$port" "$dir" >"$dir/nginx.conf"
  cp "$dir/nginx.conf" "$OUT/nginx-$backend.conf"
  (
    ulimit -n "$NOFILE"
    exec taskset -c "$SERVER_CPU" nginx -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log"
  ) >"$SERVER_LOG" 2>&1 &
  server_pid=$!
  URL=http://127.0.0.1:$port
  wait_http "$URL/healthz" 30 200 || {
    cat "$SERVER_LOG" "$dir/error.log" >&2 2>/dev/null || true
    return 1
  }
  # The load generator samples the single worker process, not the master.
  local workers
  for _ in $(seq 1 50); do
    workers=$(pgrep -P "$server_pid" || true)
    [[ -n $workers ]] && break
    sleep 0.1
  done
  [[ $(wc -w <<<"$workers") == 1 ]] || {
    log "expected one nginx worker under master $server_pid, found: ${workers:-none}"
    return 1
  }
  BROKER_PID=$workers
}

stop_server() {
  [[ -n ${server_pid:-} ]] || return 0
  if kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null || true
    for _ in $(seq 1 300); do
      kill -0 "$server_pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$server_pid" 2>/dev/null; then
      log "server $server_pid still running 30 s after SIGTERM: SIGKILL"
      kill -KILL "$server_pid" 2>/dev/null || true
    fi
  fi
  wait "$server_pid" 2>/dev/null || true
  if [[ -n ${NGINX_DIR:-} && -f $NGINX_DIR/error.log ]]; then
    cat "$NGINX_DIR/error.log" >>"$SERVER_LOG" 2>/dev/null || true
  fi
  server_pid=
  NGINX_DIR=
}

redis_unlink() { # pattern
  command -v redis-cli >/dev/null 2>&1 || return 0
  redis-cli -u "$REDIS_URL" --scan --pattern "$1" 2>/dev/null | xargs -r -n 500 redis-cli -u "$REDIS_URL" unlink >/dev/null 2>&1 || true
}

# ---------------------------------------------------------------------------------------------
# Runs.
# ---------------------------------------------------------------------------------------------
RUNS=$WORK/runs.jsonl
: >"$RUNS"
failed_runs=0

run_one() { # scenario target
  local sc=$1 target=$2 label="$1--$2" rc=0
  scenario "$sc"
  SERVER_LOG=$OUT/logs/$label.server.log
  local loadlog=$OUT/logs/$label.log
  local started
  started=$(date +%s)
  local ok=1
  NGINX_DIR=
  BROKER_PID=
  if [[ $target == agui-fanout ]]; then
    start_agui "$SC_BACKEND" || ok=0
  else
    NGINX_DIR=$WORK/nginx-$SC_BACKEND
    start_nchan "$SC_BACKEND" || ok=0
  fi
  local args=(--url "$URL" --broker-pid "${BROKER_PID:-0}" --out "$OUT/raw" --label "$label" --quiet)
  [[ $target == nchan ]] && args+=(--no-run-started --metrics-path "")
  # shellcheck disable=SC2206 # LOADGEN_ARGS is split on purpose
  [[ -n $LOADGEN_ARGS ]] && args+=($LOADGEN_ARGS)
  if [[ $ok == 1 ]]; then
    { printf '%q ' taskset -c "$LOADGEN_CPU" agui-loadtest "${args[@]}" "${SC_ARGS[@]}"; echo; } >"$loadlog"
    (
      ulimit -n "$NOFILE"
      exec taskset -c "$LOADGEN_CPU" "$LOADTEST" "${args[@]}" "${SC_ARGS[@]}"
    ) >>"$loadlog" 2>&1 || rc=$?
  else
    rc=3
    log "$label: the server did not start (see $SERVER_LOG)"
  fi
  stop_server
  local json=$OUT/raw/$label.json
  if [[ $SC_BACKEND == redis && $KEEP_REDIS_KEYS != 1 ]]; then
    if [[ $target == nchan ]]; then
      redis_unlink "$NS:*"
    elif [[ -f $json ]]; then
      local run_id
      run_id=$(jq -r '.env.run_id // empty' "$json")
      [[ -n $run_id ]] && redis_unlink "agui:{$run_id-*"
    fi
  fi
  local checks=null
  [[ -f $json ]] && checks=$(jq -c '.checks' "$json") || json=
  case $rc in
    0) log "$label: checks passed ($(($(date +%s) - started)) s)" ;;
    1) log "$label: checks FAILED: $(jq -r '.failures | join("; ")' <<<"$checks") ($(($(date +%s) - started)) s)" ;;
    *) failed_runs=$((failed_runs + 1))
      log "$label: load generator exit code $rc, see $loadlog"
      tail -n 5 "$loadlog" >&2 || true ;;
  esac
  # Paths relative to $OUT, so a compare.json copied into loadtest/report/ names no machine's
  # folders.
  jq -nc --arg scenario "$sc" --arg target "$target" --arg backend "$SC_BACKEND" --arg kind "$SC_KIND" \
    --argjson exit_code "$rc" --arg json "${json#"$OUT"/}" --arg log "${loadlog#"$OUT"/}" \
    --argjson checks "$checks" \
    --arg args "${SC_ARGS[*]}" \
    '{scenario:$scenario, target:$target, backend:$backend, kind:$kind, exit_code:$exit_code,
      result:(if $json == "" then null else $json end), log:$log, checks:$checks, args:$args}' >>"$RUNS"
}

log "output: $OUT"
log "scenarios: ${SCENARIO_LIST[*]}; targets: ${TARGET_LIST[*]}; $([[ $QUICK == 1 ]] && echo QUICK || echo full size)"
log "server on CPU $SERVER_CPU, load generator on CPU $LOADGEN_CPU, open files $NOFILE"
for sc in "${SCENARIO_LIST[@]}"; do
  for target in "${TARGET_LIST[@]}"; do
    scenario "$sc"
    log "$sc ($SC_BACKEND) against $target"
    run_one "$sc" "$target"
    sleep 1
  done
done

# ---------------------------------------------------------------------------------------------
# The table.
# ---------------------------------------------------------------------------------------------
cat >"$WORK/metrics.jq" <<'JQ'
# One result file -> [{metric, value, better}] for its kind; the same list for both targets.
def rnd(x; n): if x == null then null else ((x * pow(10; n)) | round) / pow(10; n) end;
def ms(x): if x == null then null else rnd(x / 1000; 2) end;
def us(ns): if ns == null then null else rnd(ns / 1000; 2) end;
def mib(k): if k == null then null else rnd(k / 1024; 1) end;
def row(m; v; b): {metric: m, value: v, better: b};
def checks: row("checks"; if .checks.ok then "passed" else "FAILED: " + (.checks.failures | join("; ")) end; null);
def cpu(s; prefix): [
  row(prefix + "broker CPU per delivery, user (µs)"; us(s.broker.user_ns_per_delivery); "lower"),
  row(prefix + "broker CPU per delivery, kernel (µs)"; us(s.broker.sys_ns_per_delivery); "lower"),
  row(prefix + "broker CPU per delivery, total (µs)"; us(s.broker.total_ns_per_delivery); "lower"),
  row(prefix + "broker CPU (cores)"; rnd(s.broker.process.cores; 2); null),
  row(prefix + "load generator CPU (cores)"; rnd(s.loadgen.cores; 2); null) ];
def single: .steps[0] as $s | [
  row("deliveries/s"; rnd($s.deliveries_per_s; 0); null),
  row("end-to-end latency p50 (ms)"; ms($s.latency.p50_us); "lower"),
  row("end-to-end latency p99 (ms)"; ms($s.latency.p99_us); "lower"),
  row("end-to-end latency p99.9 (ms)"; ms($s.latency.p999_us); "lower") ]
  + cpu($s; "")
  + [ row("broker RSS at the end (MiB)"; mib($s.broker.process.rss_end_kib); "lower"),
      row("publisher achieved rate (events/s)"; rnd($s.publish.achieved_rate; 0); null),
      row("POST round trip p99 (ms)"; ms($s.publish.post_latency.p99_us); "lower"),
      row("sustained (p99 ≤ 10 ms, all delivered)"; (if $s.sustained then "yes" else "no" end); null),
      checks ];
def sweep: .scenario_result.sweep as $w
  | ((.steps | map(select(.offered_rate == $w.best_sustained_rate)) | last) // null) as $b
  | ((.steps | map(select(.offered_rate == $w.first_failed_rate)) | last) // null) as $f
  | [ row("best sustained rate (events/s)"; $w.best_sustained_rate; "higher"),
      row("deliveries/s at that rate"; rnd($w.best_sustained_deliveries_per_s; 0); "higher"),
      row("p99 at that rate (ms)"; ms($b.latency.p99_us); "lower") ]
  + cpu($b; "at that rate: ")
  + [ row("first rate not sustained (events/s)"; $w.first_failed_rate; "higher"),
      row("why not"; (($f.not_sustained // []) | join("; ")); null),
      row("steps"; (.steps | map(.offered_rate | tostring) | join(", ")); null),
      checks ];
def idle: .scenario_result as $i | [
  row("connections open at the end"; $i.open_at_end; "higher"),
  row("broker RSS per idle connection (bytes)"; rnd($i.broker_rss_bytes_per_connection; 0); "lower"),
  row("... after the hold (bytes)"; rnd($i.broker_rss_bytes_per_connection_after_hold; 0); "lower"),
  row("broker RSS before connecting (MiB)"; mib($i.broker_rss_kib.before); "lower"),
  row("broker RSS with every connection (MiB)"; mib($i.broker_rss_kib.after_hold); "lower"),
  row("time to connect all (s)"; rnd(.connect.seconds; 2); "lower"),
  row("broker CPU while idle (cores)"; rnd($i.broker_cpu_during_hold.cores; 3); "lower"),
  checks ];
def storm: .scenario_result.storm as $s | .subscribers as $u | .steps[0] as $st | [
  row("subscribers that resumed"; $s.reconnected; "higher"),
  row("absorb time: last subscriber has a new event (s)"; rnd($s.absorb_s; 3); "lower"),
  row("reconnect p50 (ms)"; ms($s.reconnect_us.p50_us); "lower"),
  row("reconnect p99 (ms)"; ms($s.reconnect_us.p99_us); "lower"),
  row("catch-up p99 (ms)"; ms($s.catchup_us.p99_us); "lower"),
  row("gaps"; $u.gaps; "lower"),
  row("duplicates"; $u.duplicates; "lower"),
  row("inexact resumes (prelude instead of replay)"; $u.inexact_resumes; "lower"),
  row("missing at the end"; $u.missing_at_end; "lower"),
  row("connect errors"; $u.connect_errors; "lower"),
  row("end-to-end latency p99 over the step (ms)"; ms($st.latency.p99_us); "lower"),
  row("broker CPU per delivery over the step, total (µs)"; us($st.broker.total_ns_per_delivery); "lower"),
  checks ];
def growth(p): if p.rss_end_kib == null or p.rss_start_kib == null then null
  else mib(p.rss_end_kib - p.rss_start_kib) end;
def slow: .scenario_result.slow as $s
  | (.steps | map(select(.label == "baseline")) | first) as $b
  | (.steps | map(select(.label == "with-slow")) | first) as $w
  | (growth($b.broker.process)) as $gb
  | (if $s.broker_rss_peak_kib_with_slow == null or $w.broker.process.rss_start_kib == null then null
     else mib($s.broker_rss_peak_kib_with_slow - $w.broker.process.rss_start_kib) end) as $gw
  | [
  row("stalled subscribers"; $s.slow_subscribers; null),
  row("others' p99, nobody stalled (ms)"; ms($s.others_p99_us_baseline); "lower"),
  row("others' p99, 10% stalled (ms)"; ms($s.others_p99_us_with_slow); "lower"),
  row("others' p99 change (stalled / not)"; rnd($s.others_p99_ratio; 2); "lower"),
  row("broker RSS after the baseline (MiB)"; mib($s.broker_rss_baseline_end_kib); "lower"),
  row("broker RSS peak while stalled (MiB)"; mib($s.broker_rss_peak_kib_with_slow); "lower"),
  row("broker RSS growth over the baseline step (MiB, retention)"; $gb; null),
  row("broker RSS growth over the stalled step, to its peak (MiB)"; $gw; "lower"),
  row("extra growth with stalled subscribers (MiB)";
      (if $gb == null or $gw == null then null else rnd($gw - $gb; 1) end); "lower"),
  row("stalled subscribers reset by the broker"; $s.slow_group_resets; null),
  row("stalled streams closed by the broker"; $s.slow_group_peer_closes; null),
  row("broker CPU per delivery while stalled, total (µs)"; us(.steps[-1].broker.total_ns_per_delivery); "lower"),
  checks ];
def metrics(kind):
  if kind == "single" then single elif kind == "sweep" then sweep elif kind == "idle" then idle
  elif kind == "storm" then storm elif kind == "slow" then slow else [] end;
JQ

cat >"$WORK/table.jq" <<'JQ'
# runs (slurped, each with .data = its result file or null) -> rows of the comparison.
include "metrics";
def num: type == "number";
def ratio(a; b): if (a | num) and (b | num) and a > 0 and b > 0 then ((a / b * 100) | round) / 100 else null end;
def winner(a; b; dir):
  if dir == null or ((a | num) and (b | num) | not) then null
  elif a == b then "="
  elif (dir == "lower") == (a < b) then "agui-fanout" else "nchan" end;
group_by(.scenario) as $groups
| [ $order[] as $sc | $groups[] | select(.[0].scenario == $sc) ] as $ordered
| [ $ordered[]
    | (map(select(.target == "agui-fanout"))[0]) as $a
    | (map(select(.target == "nchan"))[0]) as $n
    | .[0] as $any
    | (if $a.data then ($a.data | metrics($any.kind)) else null end) as $am
    | (if $n.data then ($n.data | metrics($any.kind)) else null end) as $nm
    | ($am // $nm // [{metric: "run", value: null, better: null}]) as $tmpl
    | range(0; $tmpl | length) as $i
    | ($am[$i].value // null) as $av
    | ($nm[$i].value // null) as $nv
    | { scenario: $any.scenario, backend: $any.backend, metric: $tmpl[$i].metric,
        better_when: $tmpl[$i].better,
        "agui-fanout": (if $a == null then "not run" elif $a.data == null then "error (exit \($a.exit_code))" else $av end),
        nchan: (if $n == null then "not run" elif $n.data == null then "error (exit \($n.exit_code))" else $nv end),
        ratio: ratio($av; $nv),
        better: winner($av; $nv; $tmpl[$i].better) } ]
JQ

log "building the table"
# Attach each result file to its run.
while IFS= read -r line; do
  f=$(jq -r '.result // empty' <<<"$line")
  [[ -n $f ]] && f=$OUT/$f
  if [[ -n $f && -f $f ]]; then
    jq -c --slurpfile d "$f" '. + {data: $d[0]}' <<<"$line"
  else
    jq -c '. + {data: null}' <<<"$line"
  fi
done <"$RUNS" >"$WORK/runs-data.jsonl"

order_json=$(printf '%s\n' "${SCENARIO_LIST[@]}" | jq -R . | jq -sc .)
rows=$(jq -s --argjson order "$order_json" -L "$WORK" -f "$WORK/table.jq" "$WORK/runs-data.jsonl")

git_rev=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
git_dirty=$(git -C "$ROOT" status --porcelain 2>/dev/null | grep -q . && echo true || echo false)
nginx_version=$(nginx -v 2>&1 | sed 's/^nginx version: //')
nchan_version=$(dpkg-query -W -f '${Version}' libnginx-mod-nchan 2>/dev/null || echo unknown)
cpu_model=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' || echo unknown)

jq -n --argjson rows "$rows" --slurpfile runs "$RUNS" \
  --arg generated "$(date -u +%Y-%m-%dT%H:%M:%SZ)" --argjson quick "$QUICK" \
  --arg git "$git_rev" --argjson dirty "$git_dirty" --arg nginx "$nginx_version" \
  --arg nchan "$nchan_version" --arg cpu "$cpu_model" --argjson cpus "$(nproc)" \
  --argjson max_batch "$MAX_BATCH" --argjson publish_conns "$PUBLISH_CONNS" --arg mix "$MIX" \
  --arg nchan_buffer "$NCHAN_BUFFER" --arg nchan_timeout "$NCHAN_TIMEOUT" --arg nchan_shm "$NCHAN_SHM" \
  --arg redis "$REDIS_URL" --argjson nofile "$NOFILE" \
  --argjson server_cpu "$SERVER_CPU" --argjson loadgen_cpu "$LOADGEN_CPU" \
  '{generated: $generated, quick: ($quick == 1),
    machine: {cpu: $cpu, cpus: $cpus, server_cpu: $server_cpu, loadgen_cpu: $loadgen_cpu, nofile: $nofile},
    versions: {"agui-fanout": ($git + (if $dirty then " (dirty tree)" else "" end)), nginx: $nginx, nchan: $nchan},
    settings: {mix: $mix, max_batch: $max_batch, publish_conns: $publish_conns, nchan_message_buffer_length: $nchan_buffer,
               nchan_message_timeout: $nchan_timeout, nchan_shared_memory_size: $nchan_shm, redis: $redis,
               "agui-fanout": "defaults (retention.max_events 10000, queue 4096 events / 4 MiB), AGUI_LOG=warn"},
    runs: $runs, rows: $rows}' >"$OUT/compare.json"

{
  echo "# agui-fanout and nchan side by side"
  echo
  jq -r '"\(.generated), \(if .quick then "QUICK run (scaled down: not for conclusions)" else "full size" end). " +
    "agui-fanout \(.versions["agui-fanout"]), nginx \(.versions.nginx) + nchan \(.versions.nchan). " +
    "\(.machine.cpus) CPUs (\(.machine.cpu)): server on CPU \(.machine.server_cpu), load generator on CPU \(.machine.loadgen_cpu)."' \
    "$OUT/compare.json"
  echo
  echo "Event mix \`$MIX\`. Same load generator arguments for both (one event per POST: \`--max-batch $MAX_BATCH\`, $PUBLISH_CONNS publishing connections);"
  echo "nchan with one worker, \`nchan_message_buffer_length $NCHAN_BUFFER\`, \`nchan_message_timeout $NCHAN_TIMEOUT\`,"
  echo "its worker process sampled for CPU and RSS. Ratio = agui-fanout / nchan; \"better\" follows the metric's direction."
  echo
  echo "| scenario | metric | agui-fanout | nchan | ratio | better |"
  echo "|---|---|---|---|---|---|"
  jq -r '.rows[] | [ .scenario + (if .backend == "redis" then " (redis)" else "" end), .metric,
      (.["agui-fanout"] | if . == null then "–" else tostring end),
      (.nchan | if . == null then "–" else tostring end),
      (.ratio | if . == null then "" else ((. * 100 | round) as $c | "\($c / 100 | floor).\($c % 100 | tostring | if length < 2 then "0" + . else . end)×") end),
      (.better // "") ]
    | map(gsub("\\|"; "\\|")) | "| " + join(" | ") + " |"' "$OUT/compare.json"
  echo
  echo "Runs (load generator arguments, same for both targets):"
  echo
  jq -r '.runs | group_by(.scenario)[] | "- `\(.[0].scenario)` (\(.[0].backend)): `\(.[0].args)`" +
    (map(select(.exit_code > 1) | " \(.target): exit \(.exit_code)") | join(""))' "$OUT/compare.json"
  echo
  echo "Raw results in \`raw/\` (one JSON, Markdown and SVG per run), logs in \`logs/\`, nginx configurations beside this file."
} >"$OUT/compare.md"

echo
cat "$OUT/compare.md"
echo
log "wrote $OUT/compare.md and $OUT/compare.json"
[[ $failed_runs == 0 ]] || {
  log "$failed_runs run(s) could not be done"
  exit 1
}
