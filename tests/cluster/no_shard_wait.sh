# The only cpu node dies mid-run. The gpu node's requests wait for a shard and say so; with no
# shard joining within --shard-wait they fail with the "no R-worker shard" error, and when a new
# cpu node joins in time they complete with the tokens of the fault-free --role all run.
source "$(dirname "$0")/lib.bash" "$@"

N=300
prompts "$WORK/prompts.txt" 8
random_model "$WORK/model.gguf"
reference "$WORK/ref.json" "$WORK/model.gguf" "$WORK/prompts.txt" "$N"

# start_and_kill NAME SHARD_WAIT: a gpu node whose only cpu node is killed after 0.5 s.
start_and_kill() {
  local gpu=$1 port
  port=$(free_port)
  gpu_node "$gpu" "$port" "$WORK/model.gguf" "$WORK/prompts.txt" "$N" --min-shards 1 \
    --max-batch 4 --shard-wait "$2"
  cpu_node "$gpu-cpu" "$port" --shards 2
  wait_log "$gpu" "shard $gpu-cpu/shard-1 joined" 30
  sleep 0.5
  running "$gpu" || fail "the run ended before the kill; it must last longer"
  kill -KILL "${PID[$gpu-cpu]}"
  KILLED_AT=$(date +%s.%N)
  log "killed the only cpu node of $gpu"
  wait_log "$gpu" "waiting for R-worker shards" 15
  PORT=$port
}

# 1. Nobody joins: every request fails after --shard-wait 3 with a clear error.
start_and_kill gpu-1 3
finish gpu-1 30
waited=$(awk -v a="$KILLED_AT" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
[[ $RC -eq 1 ]] || fail "gpu-1 exited with $RC, not 1 (failed requests)"
# Nothing may give up before --shard-wait has passed since the shard went (after the kill).
awk -v w="$waited" 'BEGIN { exit !(w >= 3) }' ||
  fail "gpu-1 gave up $waited s after the kill, before --shard-wait 3"
[[ $(wc -l <"$WORK/gpu-1.out") -eq 8 ]] || fail "gpu-1 did not answer every prompt"
failed=$(jq -r 'select(.error != null) | .error' "$WORK/gpu-1.out" | grep -c "no R-worker shard")
((failed >= 1)) || fail "no request failed with the 'no R-worker shard' error"
if jq -e 'select(.error != null and (.error | test("no R-worker shard") | not))' "$WORK/gpu-1.out" |
   grep -q .; then
  fail "some request failed with another error"
fi
log "$failed requests failed with: $(jq -r 'select(.error != null) | .error' "$WORK/gpu-1.out" | head -n1)"
# Requests that had finished before the kill keep their tokens. (The right side is quoted: unquoted,
# [[ == ]] reads a token list such as [452,90] as a glob bracket expression, never equal.)
while IFS= read -r line; do
  prompt=$(jq -r .prompt <<<"$line")
  got=$(jq -c .tokens <<<"$line")
  want=$(jq -c --arg p "$prompt" 'select(.prompt == $p) | .tokens' "$WORK/ref.json")
  [[ -n $want && $got == "$want" ]] || fail "finished request '$prompt' differs from the fault-free run"
done < <(jq -c 'select(.error == null)' "$WORK/gpu-1.out")

# 2. A new cpu node joins within the wait: everything completes as if nothing happened.
start_and_kill gpu-2 30
sleep 1
running gpu-2 || fail "gpu-2 ended while no shard was there"
cpu_node gpu-2-new "$PORT" --shards 1
wait_log gpu-2 "shard gpu-2-new/shard-0 joined" 30
finish gpu-2 60
[[ $RC -eq 0 ]] || fail "gpu-2 exited with $RC"
same_tokens "$WORK/ref.json" "$WORK/gpu-2.out" 8
log "passed"
