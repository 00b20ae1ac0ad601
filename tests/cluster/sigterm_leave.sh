# SIGTERM to one of two cpu nodes mid-run: it moves its sequences away, exits 0 saying it left
# cleanly, and every request completes with the tokens of the fault-free --role all run.
source "$(dirname "$0")/lib.bash" "$@"

N=300
prompts "$WORK/prompts.txt" 16
random_model "$WORK/model.gguf"
reference "$WORK/ref.json" "$WORK/model.gguf" "$WORK/prompts.txt" "$N"

port=$(free_port)
gpu_node gpu "$port" "$WORK/model.gguf" "$WORK/prompts.txt" "$N" --min-shards 2 --max-batch 4
cpu_node cpu-a "$port" --shards 1
cpu_node cpu-b "$port" --shards 1
wait_log gpu "shard cpu-a/shard-0 joined" 30
wait_log gpu "shard cpu-b/shard-0 joined" 30
sleep 1
running gpu || fail "the run ended before the SIGTERM; it must last longer"
kill -TERM "${PID[cpu-a]}"
log "sent SIGTERM to cpu-a"
finish cpu-a 30
[[ $RC -eq 0 ]] || fail "cpu-a exited with $RC after SIGTERM"
expect_log cpu-a "left cleanly"
expect_log gpu "shard cpu-a/shard-0 is leaving"
running gpu || fail "the run ended before cpu-a left; it must last longer"
log "cpu-a left cleanly while the run went on"
finish gpu 90
[[ $RC -eq 0 ]] || fail "gpu node exited with $RC"
same_tokens "$WORK/ref.json" "$WORK/gpu.out" 16
log "passed"
