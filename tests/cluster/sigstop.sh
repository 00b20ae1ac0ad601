# SIGSTOP of one of two cpu nodes mid-generation: the node hangs without closing its connection.
# With --timeout 2 its requests time out, its sequences move to the other node, and every request
# completes with exactly the tokens of the fault-free --role all run.
source "$(dirname "$0")/lib.bash" "$@"

N=300
prompts "$WORK/prompts.txt" 16
random_model "$WORK/model.gguf"
reference "$WORK/ref.json" "$WORK/model.gguf" "$WORK/prompts.txt" "$N"

port=$(free_port)
gpu_node gpu "$port" "$WORK/model.gguf" "$WORK/prompts.txt" "$N" --min-shards 2 --max-batch 4 \
  --timeout 2
cpu_node cpu-a "$port" --shards 1
cpu_node cpu-b "$port" --shards 1
wait_log gpu "shard cpu-a/shard-0 joined" 30
wait_log gpu "shard cpu-b/shard-0 joined" 30
sleep 1
running gpu || fail "the run ended before the stop; it must last longer"
kill -STOP "${PID[cpu-a]}"
log "stopped cpu-a (pid ${PID[cpu-a]})"
wait_log gpu "shard cpu-a/shard-0 (went down|stopped answering)" 8
log "the gpu node noticed the hang"
finish gpu 90
[[ $RC -eq 0 ]] || fail "gpu node exited with $RC"
same_tokens "$WORK/ref.json" "$WORK/gpu.out" 16
kill -CONT "${PID[cpu-a]}"
kill -KILL "${PID[cpu-a]}"
finish cpu-b 15
expect_log cpu-b "served [1-9][0-9]* attention requests"
log "passed"
