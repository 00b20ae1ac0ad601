# The cluster secret: a cpu node with the wrong secret is refused with a clear error on both
# sides, the right one (by --token or FASTDECODE_TOKEN) joins, and a gpu node refuses to listen
# beyond loopback without a secret.
source "$(dirname "$0")/lib.bash" "$@"

printf 'Once upon a time\nThe little dog\n' >"$WORK/prompts.txt"
MODEL=$SHARED/models/stories260K.gguf
reference "$WORK/ref.json" "$MODEL" "$WORK/prompts.txt" 24

# check_secret TAG GPU_SECRET_HOW: GPU_SECRET_HOW is "flag" (--token) or "env" (FASTDECODE_TOKEN).
check_secret() {
  local tag=$1 how=$2 port
  port=$(free_port)
  local gpu=(env -u FASTDECODE_TOKEN "$NODE" --role gpu --listen "127.0.0.1:$port" --model "$MODEL"
             --prompts "$WORK/prompts.txt" -n 24 --temperature 0 --json --min-shards 1
             --min-shards-wait 60)
  if [[ $how == flag ]]; then
    start "gpu-$tag" "${gpu[@]}" --token "s3cret-$tag"
  else
    start "gpu-$tag" env FASTDECODE_TOKEN="s3cret-$tag" "${gpu[@]:3}"
  fi
  wait_log "gpu-$tag" "serving" 30
  local cpu=("$NODE" --role cpu --join "127.0.0.1:$port" --shards 1)
  # Wrong secret, and no secret at all.
  start "bad-$tag" env -u FASTDECODE_TOKEN "${cpu[@]}" --name "bad-$tag" --token wrong
  finish "bad-$tag" 30
  [[ $RC -ne 0 ]] || fail "a cpu node with the wrong secret exited 0"
  expect_log "bad-$tag" "refused this node.*wrong cluster secret"
  expect_log "gpu-$tag" "refused join of bad-$tag: wrong cluster secret"
  start "none-$tag" env -u FASTDECODE_TOKEN "${cpu[@]}" --name "none-$tag"
  finish "none-$tag" 30
  [[ $RC -ne 0 ]] || fail "a cpu node without a secret exited 0"
  expect_log "none-$tag" "wrong cluster secret"
  running "gpu-$tag" || fail "the gpu node did not keep waiting after refusing"
  # The right secret, given the other way than the gpu node got it.
  if [[ $how == flag ]]; then
    start "good-$tag" env FASTDECODE_TOKEN="s3cret-$tag" "${cpu[@]}" --name "good-$tag"
  else
    start "good-$tag" env -u FASTDECODE_TOKEN "${cpu[@]}" --name "good-$tag" --token "s3cret-$tag"
  fi
  finish "gpu-$tag" 60
  [[ $RC -eq 0 ]] || fail "gpu node exited with $RC with the right secret"
  same_tokens "$WORK/ref.json" "$WORK/gpu-$tag.out" 2
  finish "good-$tag" 15
}

check_secret flag flag
check_secret env env

# No secret, non-loopback address: refused before listening (the test never listens beyond
# loopback).
port=$(free_port)
start open env -u FASTDECODE_TOKEN "$NODE" --role gpu --listen "0.0.0.0:$port" --model "$MODEL"
finish open 30
[[ $RC -ne 0 ]] || fail "--listen 0.0.0.0 without a secret was accepted"
expect_log open "refusing to listen on 0.0.0.0:$port without a cluster secret"
log "passed"
