# kill -9 of one of two cpu nodes mid-generation: its in-flight work fails over within seconds,
# its sequences are re-prefilled on the surviving node, and every request completes with exactly
# the tokens of the fault-free --role all run.
source "$(dirname "$0")/lib.bash" "$@"

N=300
prompts "$WORK/prompts.txt" 16
random_model "$WORK/model.gguf"
reference "$WORK/ref.json" "$WORK/model.gguf" "$WORK/prompts.txt" "$N"

port=$(free_port)
# --max-batch 4 makes the run last several seconds (four waves of sequences).
gpu_node gpu "$port" "$WORK/model.gguf" "$WORK/prompts.txt" "$N" --min-shards 2 --max-batch 4
cpu_node cpu-a "$port" --shards 1
cpu_node cpu-b "$port" --shards 1
wait_log gpu "shard cpu-a/shard-0 joined" 30
wait_log gpu "shard cpu-b/shard-0 joined" 30
sleep 1
running gpu || fail "the run ended before the kill; it must last longer"
kill -KILL "${PID[cpu-a]}"
log "killed cpu-a (pid ${PID[cpu-a]})"
wait_log gpu "shard cpu-a/shard-0 (went down|stopped answering)" 5
log "the gpu node noticed the loss"
running gpu || fail "the run ended right after the kill; it must last longer"
finish gpu 90
[[ $RC -eq 0 ]] || fail "gpu node exited with $RC"
same_tokens "$WORK/ref.json" "$WORK/gpu.out" 16
finish cpu-b 15
expect_log cpu-b "served [1-9][0-9]* attention requests"
log "passed"
