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
# The first batch is placed over both shards as soon as the gpu node starts generating.
wait_log gpu "gpu node: generating" 30
sleep 0.5
running gpu || fail "the run ended before the SIGTERM; it must last longer"
kill -TERM "${PID[cpu-a]}"
log "sent SIGTERM to cpu-a"
finish cpu-a 30
[[ $RC -eq 0 ]] || fail "cpu-a exited with $RC after SIGTERM"
expect_log cpu-a "left cleanly"
expect_log gpu "shard cpu-a/shard-0 is leaving; [1-9][0-9]* sequence"
# The scheduler answers a leave once no live sequence is on the shard, and counts those of the
# leave's start that are still live then: they run on the other shard now.
line=$(grep -E "cpu-a/shard-0 left; [0-9]+ of the [0-9]+ sequence" "$WORK/gpu.err") ||
  fail "the gpu node did not log that cpu-a/shard-0 left"
moved=$(sed -E 's/.* left; ([0-9]+) of the.*/\1/' <<<"$line")
((moved >= 1)) || fail "none of cpu-a's sequences was still running when it left: nothing moved"
log "cpu-a left cleanly; $moved of its sequences moved to cpu-b"
finish gpu 90
[[ $RC -eq 0 ]] || fail "gpu node exited with $RC"
same_tokens "$WORK/ref.json" "$WORK/gpu.out" 16
log "passed"
