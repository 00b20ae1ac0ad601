# Start-up errors end the node at once with one clear line and leave the other nodes running: a
# gpu node whose port or data lane port is taken, a gpu node whose shards do not come, a cpu node
# and a --role all node whose KV memory cannot hold one page. Each of these once left actors running, and the
# process then waited for ever after printing nothing.
source "$(dirname "$0")/lib.bash" "$@"

MODEL=$SHARED/models/stories260K.gguf
port=$(free_port)
start gpu "$NODE" --role gpu --listen "127.0.0.1:$port" --model "$MODEL"
wait_log gpu "serving" 30

start taken "$NODE" --role gpu --listen "127.0.0.1:$port" --model "$MODEL"
finish taken 20
[[ $RC -eq 2 ]] || fail "a gpu node on a taken port exited with $RC"
expect_log taken "cannot listen on 127.0.0.1:$port"

lane_port=$(grep -Eo "data lane on port [0-9]+" "$WORK/gpu.err" | grep -Eo "[0-9]+$")
start lane_taken "$NODE" --role gpu --listen "127.0.0.1:$(free_port)" --model "$MODEL" --lane-port "$lane_port"
finish lane_taken 20
[[ $RC -eq 2 ]] || fail "a gpu node whose data lane port is taken exited with $RC"
expect_log lane_taken "data lane: cannot listen on 127.0.0.1:$lane_port"

start small "$NODE" --role cpu --join "127.0.0.1:$port" --shards 1 --kv-memory 1KiB
finish small 20
[[ $RC -eq 2 ]] || fail "a cpu node whose KV memory holds no page exited with $RC"
expect_log small "smaller than one page .*--kv-memory"
running gpu || fail "the gpu node stopped when a cpu node failed to start"

lonely_port=$(free_port)
start lonely "$NODE" --role gpu --listen "127.0.0.1:$lonely_port" --model "$MODEL" \
  --prompt "Once upon a time" --min-shards 1 --min-shards-wait 2
finish lonely 20
[[ $RC -eq 2 ]] || fail "a gpu node without its shards exited with $RC"
expect_log lonely "only 0 of 1 R-worker shards joined within 2 s"

start all "$NODE" --role all --model "$MODEL" --prompt "Once upon a time" --kv-memory 1KiB
finish all 20
[[ $RC -eq 2 ]] || fail "--role all with a KV memory below one page exited with $RC"
expect_log all "smaller than one page"
log "passed"
