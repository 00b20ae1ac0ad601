# The cpu role needs no CUDA: the binary links no CUDA library, and a cpu node started with
# LD_LIBRARY_PATH unset serves a gpu node.
source "$(dirname "$0")/lib.bash" "$@"

libs=$(env -u LD_LIBRARY_PATH ldd "$NODE") || fail "ldd $NODE failed"
if grep -Ei 'libcuda|libcudart|libcublas|libnvrtc|libnccl' <<<"$libs"; then
  fail "fastdecode-node links CUDA libraries"
fi
if grep -q 'not found' <<<"$libs"; then
  fail "fastdecode-node misses libraries without LD_LIBRARY_PATH: $(grep 'not found' <<<"$libs")"
fi

printf 'Once upon a time\nThe little dog\nLily wanted to\n' >"$WORK/prompts.txt"
MODEL=$SHARED/models/stories260K.gguf
reference "$WORK/ref.json" "$MODEL" "$WORK/prompts.txt" 32
port=$(free_port)
gpu_node gpu "$port" "$MODEL" "$WORK/prompts.txt" 32 --min-shards 1
start cpu env -u LD_LIBRARY_PATH -u CUDA_VISIBLE_DEVICES "$NODE" --role cpu \
  --join "127.0.0.1:$port" --shards 1 --name cpu
finish gpu 60
[[ $RC -eq 0 ]] || fail "gpu node exited with $RC"
same_tokens "$WORK/ref.json" "$WORK/gpu.out" 3
finish cpu 15
expect_log cpu "served [1-9][0-9]* attention requests"
log "passed"
