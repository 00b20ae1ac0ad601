# One gpu node and two cpu nodes (1 and 2 shards; the first takes its KV-cache memory as it writes,
# the second all at start) generate the same greedy tokens as --role all,
# on the shared stories260K model and on a random model from fastdecode-mkmodel; and with the gpu
# node's page size set to 16 tokens, which the cpu nodes take when they join (the softmax tiles
# are 16 keys either way, so the arithmetic is the same as the reference's 64-token pages).
source "$(dirname "$0")/lib.bash" "$@"

cat >"$WORK/stories.txt" <<'PROMPTS'
Once upon a time
The little dog
Lily wanted to
One day, a boy named Tom
The sun was
She looked at the big
They went to the park and
Mom said
PROMPTS
prompts "$WORK/random.txt" 8
random_model "$WORK/random.gguf"

# check_model MODEL PROMPTS N TAG [GPU-NODE EXTRA...]
check_model() {
  local model=$1 prompts=$2 n=$3 tag=$4
  shift 4
  reference "$WORK/$tag-ref.json" "$model" "$prompts" "$n"
  local port
  port=$(free_port)
  gpu_node "gpu-$tag" "$port" "$model" "$prompts" "$n" --min-shards 3 "$@"
  cpu_node "cpu-$tag-a" "$port" --shards 1 --kv-commit lazy
  cpu_node "cpu-$tag-b" "$port" --shards 2 --kv-memory 256MiB
  finish "gpu-$tag" 60
  [[ $RC -eq 0 ]] || fail "gpu node on $tag exited with $RC"
  expect_log "gpu-$tag" "shard cpu-$tag-a/shard-0 joined"
  expect_log "gpu-$tag" "shard cpu-$tag-b/shard-1 joined"
  same_tokens "$WORK/$tag-ref.json" "$WORK/gpu-$tag.out" "$(wc -l <"$prompts")"
  # The cpu nodes notice that the gpu node is gone and exit by themselves.
  finish "cpu-$tag-a" 15
  finish "cpu-$tag-b" 15
  expect_log "cpu-$tag-a" "lost the gpu node"
  expect_log "cpu-$tag-b" "KV-cache of 2 x 256 MiB in memory after"
  ! grep -q "in memory after" "$WORK/cpu-$tag-a.err" || fail "cpu-$tag-a took its KV-cache memory at start"
}

check_model "$SHARED/models/stories260K.gguf" "$WORK/stories.txt" 96 stories
check_model "$WORK/random.gguf" "$WORK/random.txt" 200 random
check_model "$SHARED/models/stories260K.gguf" "$WORK/stories.txt" 96 stories-b16 --block-tokens 16
expect_log gpu-stories-b16 "shard cpu-stories-b16-b/shard-1 joined (.* pages of 16 tokens)"
log "passed"
