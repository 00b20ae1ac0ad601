# fastdecode-trace against a gpu node and two cpu nodes while REPL clients generate: the recording
# is valid Chrome Trace Event JSON with every actor kind and a process per node, each shard's
# track names the node it lives on (its --name, or host:pid by default), the live view prints
# figures with a node column, and the file stays valid when the console is stopped by SIGINT or by
# the loss of the node.
source "$(dirname "$0")/lib.bash" "$@"

REPL=$BUILD/fastdecode-repl
TRACE=$BUILD/fastdecode-trace
for bin in "$REPL" "$TRACE"; do
  [[ -x $bin ]] || { echo "missing $bin (build it first)" >&2; exit 2; }
done
command -v python3 >/dev/null || { echo "the trace test needs python3" >&2; exit 2; }

# check_trace FILE: parses FILE and checks every event; prints "kinds=... events=N", then the
# names of the processes and threads whose tracks have events, one per line.
check_trace() {
  python3 - "$1" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
events = doc["traceEvents"]
named = set()
kinds = set()
names = {}
used = set()
n = 0
for e in events:
    for field in ("name", "ph", "pid", "tid"):
        if field not in e:
            sys.exit("event without %s: %s" % (field, e))
    if e["ph"] == "M":
        if not isinstance(e.get("args", {}).get("name"), str):
            sys.exit("metadata event without a name: %s" % e)
        if e["name"] == "thread_name":
            named.add((e["pid"], e["tid"]))
            names[(e["pid"], e["tid"])] = e["args"]["name"]
        else:
            names[(e["pid"], None)] = e["args"]["name"]
        continue
    n += 1
    if not isinstance(e.get("ts"), (int, float)):
        sys.exit("event without a numeric ts: %s" % e)
    if e["ph"] == "X" and not isinstance(e.get("dur"), (int, float)):
        sys.exit("X event without dur: %s" % e)
    if e["ph"] == "X" and e["dur"] < 0:
        sys.exit("negative dur: %s" % e)
    if e["ph"] not in ("X", "C"):
        sys.exit("unexpected phase: %s" % e)
    if (e["pid"], e["tid"]) not in named:
        sys.exit("track without a thread_name before it: %s" % e)
    if not isinstance(e.get("args", {}), dict):
        sys.exit("args is not an object: %s" % e)
    kinds.add(e.get("cat"))
    used.add((e["pid"], e["tid"]))
    used.add((e["pid"], None))
print("kinds=%s events=%d" % (",".join(sorted(k for k in kinds if k)), n))
for key in sorted(used, key=str):
    if key not in names:
        sys.exit("pid %s has no process_name" % key[0])
    print(names[key])
PY
}

PORT=$(free_port)
start gpu "$NODE" --role gpu --listen "127.0.0.1:$PORT" --model "$SHARED/models/stories260K.gguf"
wait_log gpu "serving .* on 127.0.0.1:$PORT" 30
cpu_node cpu "$PORT" --shards 2
wait_log gpu "shard cpu/shard-1 joined" 30
# Without --name a cpu node is host:pid. Without --kv-memory its shard holds 20 MiB against the
# other node's 128 MiB: it gets sequences all the same, since the scheduler places each on the
# shard with the least KV in use (placed by the most free KV, it could get none of the three in
# flight, and did in 2 of 4 runs).
start cpu2 "$NODE" --role cpu --join "127.0.0.1:$PORT" --shards 1
wait_log gpu "shard [^ ]+:[0-9]+/shard-0 joined" 30
CPU2=$(sed -nE 's/.*shard ([^ ]+:[0-9]+)\/shard-0 joined.*/\1/p' "$WORK/gpu.err" | head -1)
[[ $CPU2 == "$(hostname):${PID[cpu2]}" ]] ||
  fail "the unnamed cpu node calls itself '$CPU2', not $(hostname):${PID[cpu2]}"

# Three REPL clients (stdin from a pipe) keep the batch busy while the console records.
for i in 1 2 3; do
  for j in $(seq 1 40); do
    echo "Once upon a time there was a dog number $i $j"
  done >"$WORK/p$i.txt"
done
start trace "$TRACE" --connect "127.0.0.1:$PORT" --record "$WORK/out.json" --duration 4 \
  --refresh 0.5
sleep 0.5
for i in 1 2 3; do
  start "repl$i" bash -c "exec '$REPL' --connect 127.0.0.1:$PORT -n 100 --seed $i <'$WORK/p$i.txt'"
done
finish trace 20
[[ $RC -eq 0 ]] || fail "fastdecode-trace --duration exited with $RC"
expect_log trace "[0-9]+ events written to .*out.json"
summary=$(check_trace "$WORK/out.json") || fail "out.json: $summary"
log "out.json: ${summary%%$'\n'*}"
# One process per node; shard threads carry their node's name.
for want in "node local" "node cpu" "node $CPU2" "node local / scheduler" \
  "node local / mini_batch-0" "node local / gpu_stream-0"; do
  grep -qxF -- "$want" <<<"$summary" || fail "out.json lacks the track '$want' ($summary)"
done
[[ $(grep -cE "^node cpu / shard [0-9]+$" <<<"$summary") -eq 2 ]] ||
  fail "out.json lacks the two shard tracks of node cpu ($summary)"
grep -qE "^node $CPU2 / shard [0-9]+$" <<<"$summary" ||
  fail "out.json lacks the shard track of node $CPU2 ($summary)"
grep -E "/ shard" <<<"$summary" | grep -qvE "^node (cpu|$CPU2) / " &&
  fail "a shard track is on no cpu node ($summary)"
for kind in scheduler mini_batch gpu_stream shard; do
  [[ $summary =~ kinds=([a-z_,]*) && ,${BASH_REMATCH[1]}, == *,$kind,* ]] ||
    fail "no $kind events in the recording ($summary)"
done
# The live view (plain text, stdout is a file) showed the pipeline at work.
grep -Eq "^tokens/s [1-9][0-9.]*   steps/s [1-9]" "$WORK/trace.out" ||
  fail "the live view never showed tokens/s and steps/s"
grep -Eq "^  local +mini_batch-[0-9]+ +step: " "$WORK/trace.out" ||
  fail "the live view lacks mini-batch steps on node local"
grep -Eq "^  cpu +shard [0-9]+ +R: " "$WORK/trace.out" ||
  fail "the live view lacks the R-part of node cpu's shards"
grep -Eq "^  $CPU2 +shard [0-9]+ +R: " "$WORK/trace.out" ||
  fail "the live view lacks the R-part of node $CPU2's shard"
for i in 1 2 3; do
  finish "repl$i" 60
  [[ $RC -eq 0 ]] || fail "REPL client $i exited with $RC"
  [[ $(grep -c "^Once upon a time there was a dog number $i" "$WORK/repl$i.out") -eq 40 ]] ||
    fail "REPL client $i did not answer all 40 prompts"
done

# SIGINT ends a recording without --duration with valid JSON.
start trace2 "$TRACE" --connect "127.0.0.1:$PORT" --record "$WORK/int.json" --quiet
start repl4 bash -c "exec '$REPL' --connect 127.0.0.1:$PORT -n 100 <'$WORK/p1.txt'"
sleep 2
kill -INT "${PID[trace2]}"
finish trace2 10
[[ $RC -eq 0 ]] || fail "fastdecode-trace exited with $RC after SIGINT"
summary=$(check_trace "$WORK/int.json") || fail "int.json after SIGINT: $summary"
log "int.json (SIGINT): ${summary%%$'\n'*}"
finish repl4 60

# Losing the node: the console says so, exits 1, and the file is still valid.
start trace3 "$TRACE" --connect "127.0.0.1:$PORT" --record "$WORK/lost.json" --quiet
start repl5 bash -c "exec '$REPL' --connect 127.0.0.1:$PORT -n 100 <'$WORK/p2.txt'"
sleep 1.5
kill -KILL "${PID[gpu]}"
finish trace3 10
[[ $RC -eq 1 ]] || fail "fastdecode-trace exited with $RC when the node died"
expect_log trace3 "connection to 127.0.0.1:$PORT lost"
summary=$(check_trace "$WORK/lost.json") || fail "lost.json: $summary"
finish repl5 10
[[ $RC -eq 1 ]] || fail "a piped REPL exited with $RC when the node died"
expect_log repl5 "connection to 127.0.0.1:$PORT lost"
log "passed"
