# Shared helpers of the multi-process tests on loopback. Sourced by tests/cluster/*.sh as
#   source "$(dirname "$0")/lib.bash" "$@"     (arguments: BUILD_DIR SHARED_DIR)
# Every node runs under `timeout -s KILL`, and an EXIT trap kills whatever is still running, so
# no process outlives a test even when it fails or is interrupted.

set -u -o pipefail

[[ $# -ge 2 ]] || { echo "usage: bash $0 BUILD_DIR SHARED_DIR" >&2; exit 2; }
BUILD=$(cd "$1" && pwd)
SHARED=$(cd "$2" && pwd)
NODE=$BUILD/fastdecode-node
MKMODEL=$BUILD/fastdecode-mkmodel
NODE_LIMIT=${FD_NODE_LIMIT:-120}  # seconds any one process may live
for bin in "$NODE" "$MKMODEL"; do
  [[ -x $bin ]] || { echo "missing $bin (build it first)" >&2; exit 2; }
done
command -v jq >/dev/null || { echo "the cluster tests need jq" >&2; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/fd-cluster.XXXXXX")
declare -A WRAP=()  # name -> pid of the timeout wrapper
declare -A PID=()   # name -> pid of the node itself
TEST_NAME=$(basename "$0" .sh)

log() { echo "[$TEST_NAME $(date +%T.%N | cut -c1-12)] $*" >&2; }

fail() {
  echo "FAIL ($TEST_NAME): $*" >&2
  exit 1
}

cleanup() {
  local rc=$?
  local name
  for name in "${!PID[@]}"; do
    kill -CONT "${PID[$name]}" 2>/dev/null
    kill -KILL "${PID[$name]}" "${WRAP[$name]}" 2>/dev/null
  done
  wait 2>/dev/null
  if [[ $rc -ne 0 ]]; then
    local f
    for f in "$WORK"/*.err "$WORK"/*.out; do
      [[ -s $f ]] || continue
      echo "---- $(basename "$f") (last 30 lines) ----" >&2
      tail -n 30 "$f" | cut -c1-300 >&2
    done
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# A TCP port on 127.0.0.1 that nothing listens on now, below the kernel's ephemeral range: a port
# in it may be the local end of some connection, and then listening on it fails (a node's own
# connections did that to kill9 once: "cannot listen on 127.0.0.1:58222").
free_port() {
  local p i lo=32768 hi
  read -r lo hi < /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || true
  ((lo > 11024)) || lo=32768
  for i in $(seq 1 100); do
    p=$((10000 + (RANDOM * 32768 + RANDOM) % (lo - 10000)))
    if [[ -z $(ss -Htln "sport = :$p" 2>/dev/null) ]] &&
       ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  fail "no free port found"
}

# start NAME CMD [ARGS...]: runs CMD in the background, stdout in $WORK/NAME.out, stderr in
# $WORK/NAME.err; PID[NAME] is the process itself (CMD may be `env VAR=x prog`: env execs).
start() {
  local name=$1
  shift
  timeout -s KILL "$NODE_LIMIT" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  WRAP[$name]=$!
  local child="" i
  for i in $(seq 1 200); do
    child=$(pgrep -P "${WRAP[$name]}" | head -n1)
    [[ -n $child ]] && break
    kill -0 "${WRAP[$name]}" 2>/dev/null || break
    sleep 0.01
  done
  PID[$name]=${child:-${WRAP[$name]}}
}

running() { kill -0 "${WRAP[$1]}" 2>/dev/null; }

# finish NAME SECONDS: waits for NAME to exit and sets RC to its exit status; fails after SECONDS.
finish() {
  local name=$1 limit=$2 t=0
  while running "$name"; do
    ((t >= limit * 10)) && fail "$name still runs after $limit s"
    sleep 0.1
    t=$((t + 1))
  done
  RC=0
  wait "${WRAP[$name]}" || RC=$?
  unset "PID[$name]" "WRAP[$name]"
}

# wait_log NAME REGEX SECONDS: waits until NAME's stderr matches the extended regex.
wait_log() {
  local name=$1 re=$2 limit=$3 t=0
  until grep -Eq -- "$re" "$WORK/$name.err"; do
    ((t >= limit * 10)) && fail "$name did not print /$re/ within $limit s"
    running "$name" || grep -Eq -- "$re" "$WORK/$name.err" || fail "$name exited without printing /$re/"
    sleep 0.1
    t=$((t + 1))
  done
}

# expect_log NAME REGEX: NAME's stderr matches now.
expect_log() {
  grep -Eq -- "$2" "$WORK/$1.err" || fail "$1's stderr lacks /$2/"
}

# prompts FILE N: N distinct one-line prompts.
prompts() {
  local i
  for i in $(seq 1 "$2"); do
    echo "prompt number $i tells a story about item $((i * 7)) and $((i * i))"
  done >"$1"
}

# random_model FILE: the random model of the long fault runs (4 layers, dim 256, ctx 512).
random_model() {
  "$MKMODEL" --out "$1" --layers 4 --dim 256 --heads 8 --kv-heads 2 --ff 512 --vocab 512 \
    --ctx 512 --seed 1 >/dev/null || fail "fastdecode-mkmodel failed"
}

# reference OUT MODEL PROMPTS N: the fault-free single-process greedy run.
reference() {
  "$NODE" --role all --model "$2" --prompts "$3" -n "$4" --temperature 0 --json >"$1" \
    2>"$WORK/reference.err" || fail "the --role all reference run failed"
}

# same_tokens REF OUT N: OUT answers all N prompts without error, with REF's tokens.
same_tokens() {
  local ref=$1 out=$2 n=$3
  [[ $(wc -l <"$ref") -eq $n ]] || fail "reference has $(wc -l <"$ref") lines, not $n"
  [[ $(wc -l <"$out") -eq $n ]] || fail "$(basename "$out") has $(wc -l <"$out") lines, not $n"
  if jq -e 'has("error")' "$out" | grep -q true; then
    fail "$(basename "$out") has failed requests: $(jq -r 'select(has("error")) | .error' "$out" | sort | uniq -c)"
  fi
  local diffs
  diffs=$(diff <(jq -c '[.prompt, .tokens]' "$ref") <(jq -c '[.prompt, .tokens]' "$out") | grep -c '^>')
  [[ $diffs -eq 0 ]] || fail "$diffs of $n prompts got other tokens than the fault-free run"
  log "all $n prompts match the fault-free run token for token"
}

# gpu_node NAME PORT MODEL PROMPTS N [EXTRA...]: a gpu node that generates greedily and exits.
gpu_node() {
  local name=$1 port=$2 model=$3 prompts=$4 n=$5
  shift 5
  start "$name" "$NODE" --role gpu --listen "127.0.0.1:$port" --model "$model" \
    --prompts "$prompts" -n "$n" --temperature 0 --json "$@"
}

# cpu_node NAME PORT [EXTRA...]: 128 MiB of KV-cache per shard unless EXTRA sets --kv-memory. A cpu
# node takes it from the OS before it joins, and the default 1 GiB took up to 2 s on a 2-vCPU VM,
# longer than join_midrun leaves a late node to join.
cpu_node() {
  local name=$1 port=$2
  shift 2
  local memory=(--kv-memory 128MiB)
  [[ " $* " == *" --kv-memory "* ]] && memory=()
  cpu_node_sized "$name" "$port" "${memory[@]}" "$@"
}

# cpu_node_sized NAME PORT [EXTRA...]: a cpu node without --kv-memory, which sizes its KV-cache
# for what the gpu node's run can place on it.
cpu_node_sized() {
  local name=$1 port=$2
  shift 2
  start "$name" "$NODE" --role cpu --join "127.0.0.1:$port" --name "$name" "$@"
}
