# One gpu node and two cpu nodes (1 and 2 shards; the first sizes its KV-cache for the gpu node's
# run and takes the memory as it writes, the second takes --kv-memory at start) generate the same
# greedy tokens as --role all,
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

# check_model MODEL PROMPTS N TAG CTX KV-SIZED [GPU-NODE EXTRA...]: KV-SIZED is cpu-TAG-a's
# capacity per shard for 256 sequences of CTX tokens.
check_model() {
  local model=$1 prompts=$2 n=$3 tag=$4 ctx=$5 kv_sized=$6
  shift 6
  reference "$WORK/$tag-ref.json" "$model" "$prompts" "$n"
  local port
  port=$(free_port)
  gpu_node "gpu-$tag" "$port" "$model" "$prompts" "$n" --min-shards 3 "$@"
  cpu_node_sized "cpu-$tag-a" "$port" --shards 1 --kv-commit lazy
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
  expect_log "cpu-$tag-a" "KV-cache of $kv_sized per shard, for 256 sequences of up to $ctx tokens .at most 1 GiB"
  expect_log "cpu-$tag-b" "KV-cache of 2 x 256 MiB in memory after"
  ! grep -q "in memory after" "$WORK/cpu-$tag-a.err" || fail "cpu-$tag-a took its KV-cache memory at start"
}

# stories260K: 5 layers x K and V x 4 kv heads x 8 x 2 bytes = 640 bytes a token; the random model
# 4 x 2 x 2 x 32 x 2 = 1 KiB a token.
check_model "$SHARED/models/stories260K.gguf" "$WORK/stories.txt" 96 stories 128 "20 MiB"
check_model "$WORK/random.gguf" "$WORK/random.txt" 200 random 512 "128 MiB"
check_model "$SHARED/models/stories260K.gguf" "$WORK/stories.txt" 96 stories-b16 128 "20 MiB" --block-tokens 16
expect_log gpu-stories-b16 "shard cpu-stories-b16-b/shard-1 joined (.* pages of 16 tokens)"
log "passed"
