# A cpu node joins while generation runs: sequences admitted after it joined use it, and the
# outputs equal the fault-free --role all run.
source "$(dirname "$0")/lib.bash" "$@"

N=300
prompts "$WORK/prompts.txt" 16
random_model "$WORK/model.gguf"
reference "$WORK/ref.json" "$WORK/model.gguf" "$WORK/prompts.txt" "$N"

port=$(free_port)
gpu_node gpu "$port" "$WORK/model.gguf" "$WORK/prompts.txt" "$N" --min-shards 1 --max-batch 4
cpu_node cpu-a "$port" --shards 1
wait_log gpu "shard cpu-a/shard-0 joined" 30
sleep 1
running gpu || fail "the run ended before the second node joined; it must last longer"
cpu_node cpu-b "$port" --shards 1
wait_log gpu "shard cpu-b/shard-0 joined" 10
running gpu || fail "the run ended before the second node joined; it must last longer"
log "cpu-b joined mid-run"
finish gpu 90
[[ $RC -eq 0 ]] || fail "gpu node exited with $RC"
same_tokens "$WORK/ref.json" "$WORK/gpu.out" 16
finish cpu-a 15
finish cpu-b 15
expect_log cpu-a "served [1-9][0-9]* attention requests for [1-9][0-9]* sequences"
expect_log cpu-b "served [1-9][0-9]* attention requests for [1-9][0-9]* sequences"
log "$(grep -h "served" "$WORK/cpu-a.err" "$WORK/cpu-b.err" | tr '\n' ';')"
log "passed"
