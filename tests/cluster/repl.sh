# fastdecode-repl in a real terminal (tmux) against a gpu node and a cpu node: answers stream
# token by token, /temp changes sampling, Ctrl-C stops a generation (its KV-cache is freed) and
# clears a half-typed line, Ctrl-D quits, SIGTERM quits too (at the prompt, and during a generation
# once it is cancelled), and a node that dies is reported, not waited on.
source "$(dirname "$0")/lib.bash" "$@"

REPL=$BUILD/fastdecode-repl
TRACE=$BUILD/fastdecode-trace
for bin in "$REPL" "$TRACE"; do
  [[ -x $bin ]] || { echo "missing $bin (build it first)" >&2; exit 2; }
done
command -v tmux >/dev/null ||
  { echo "the repl test needs tmux (scripts/setup installs it)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "the repl test needs python3" >&2; exit 2; }

SOCK=fd-repl-$$  # a private tmux server, so no user session is touched
SESSION=repl0
TM() { tmux -L "$SOCK" -f /dev/null "$@"; }
repl_cleanup() {
  local rc=$?
  TM kill-server 2>/dev/null
  (exit "$rc")
  cleanup
}
trap repl_cleanup EXIT

# The whole pane, scrollback included, wrapped lines joined.
pane() { TM capture-pane -p -J -t "$SESSION" -S -2000; }
last_line() { pane | grep -v '^[[:space:]]*$' | tail -n 1; }
# Whether the REPL waits at an empty prompt.
PROMPT_RE='^>[[:space:]]*$'
idle() { [[ $(last_line) =~ $PROMPT_RE ]]; }
# wait_pane REGEX SECONDS
wait_pane() {
  local deadline=$((SECONDS + $2))
  until pane | grep -Eq -- "$1"; do
    if ((SECONDS >= deadline)); then
      pane | grep -v "^[[:space:]]*$" | tail -n 20 >&2
      fail "the REPL did not show /$1/ within $2 s"
    fi
    sleep 0.05
  done
}
wait_idle() {
  local deadline=$((SECONDS + $1))
  until idle; do
    if ((SECONDS >= deadline)); then
      pane | grep -v "^[[:space:]]*$" | tail -n 20 >&2
      fail "the REPL did not come back to its prompt within $1 s"
    fi
    sleep 0.05
  done
}
# The output after the last line "> TEXT" up to the final prompt (or the end so far).
answer_of() {
  pane | awk -v p="> $1" '$0 == p { out = ""; on = 1; next }
                          on { out = out $0 "\n" }
                          END { printf "%s", out }' | sed '${/^>[[:space:]]*$/d}'
}
typed() { pane | grep -cxF -- "> $1"; }
# send TEXT: types a line and waits until the terminal echoed it.
send() {
  local n
  n=$(typed "$1")
  TM send-keys -t "$SESSION" -l -- "$1"
  TM send-keys -t "$SESSION" Enter
  local deadline=$((SECONDS + 10))
  until (($(typed "$1") > n)); do
    ((SECONDS >= deadline)) && fail "the terminal did not echo '$1' within 10 s"
    sleep 0.02
  done
}
ask() {
  send "$1"
  wait_idle "${2:-30}"
}

# After the REPL: whether it left the terminal echoing, as libedit found it.
TTY_ECHO="stty -a | tr ' ;' '\\n\\n' | grep -qx echo && echo TTY-ECHO-ON || echo TTY-ECHO-OFF"
start_repl() {  # start_repl PORT [ARGS...]
  local port=$1
  shift
  SESSION=repl$((${SESSION#repl} + 1))  # a fresh session each time; the old one lingers
  # No `timeout` around the REPL: it would put it in a background process group, away from the
  # terminal. The watchdog below ends the tmux server instead should this script be killed.
  TM new-session -d -s "$SESSION" -x 200 -y 50 \
    "$REPL --connect 127.0.0.1:$port $*; echo REPL-EXIT=\$?; $TTY_ECHO; sleep 60"
  wait_pane "^connected to 127.0.0.1:$port" 20
  wait_idle 5
}

# wait_first_tokens TEXT: the answer to the line TEXT has begun, within 20 s.
wait_first_tokens() {
  local deadline=$((SECONDS + 20))
  until [[ -n $(answer_of "$1") ]]; do
    ((SECONDS >= deadline)) && fail "no answer to '$1' within 20 s"
    sleep 0.05
  done
}
# The REPL left with status 0 and the terminal echoing.
left_cleanly() {
  wait_pane "^REPL-EXIT=0$" 10
  wait_pane "^TTY-ECHO-ON$" 5
}
terminate_repl() {  # sends SIGTERM to the REPL connected to PORT
  local pid
  pid=$(pgrep -f -- "^$REPL --connect 127.0.0.1:$PORT") || fail "no REPL process to terminate"
  kill -TERM "$pid"
}

start_cluster() {  # start_cluster TAG MODEL: a gpu node and a cpu node; sets PORT
  PORT=$(free_port)
  start "gpu-$1" "$NODE" --role gpu --listen "127.0.0.1:$PORT" --model "$2"
  wait_log "gpu-$1" "serving .* on 127.0.0.1:$PORT" 30
  cpu_node "cpu-$1" "$PORT" --shards 1
  wait_log "gpu-$1" "shard cpu-$1/shard-0 joined" 30
}

start tmux-watchdog bash -c "sleep $((NODE_LIMIT - 5)); tmux -L $SOCK -f /dev/null kill-server"

# --- stories260K: sampling settings, greedy text, line editing -----------------------------
start_cluster stories "$SHARED/models/stories260K.gguf"
start_repl "$PORT" --temperature 0.8 -n 40
ask "/temp 0"
wait_pane "^temperature 0 \(greedy\)$" 2
ask "Once upon a time"
greedy=$(answer_of "Once upon a time")
[[ $greedy == "Once upon a time, there was a little girl named Lily"* ]] ||
  fail "greedy answer is '$greedy'"
log "greedy: ${greedy:0:80}"
ask "/temp 1.5"
ask "/seed 7"
ask "Once upon a time"
hot=$(answer_of "Once upon a time")
[[ $hot == "Once upon a time"* && $hot != "$greedy" ]] || fail "/temp 1.5 gave '$hot'"
log "temperature 1.5, seed 7: ${hot:0:80}"
ask "/temp 0"
ask "Once upon a time"
[[ $(answer_of "Once upon a time") == "$greedy" ]] || fail "back at /temp 0 the text differs"

# Ctrl-C at the prompt drops the half-typed line: "/stats" alone must run.
TM send-keys -t "$SESSION" -l -- "half typed"
sleep 0.2
TM send-keys -t "$SESSION" C-c
sleep 0.2
ask "/stats"
wait_pane "^[0-9]+ tokens in [0-9.]+ s: [0-9.]+ tokens/s .*time to first token [0-9.]+ ms" 2
pane | grep -q "half typed/stats" && fail "Ctrl-C at the prompt did not clear the line"
ask "/bogus"
wait_pane "^unknown command /bogus" 2

# Ctrl-D quits with status 0.
TM send-keys -t "$SESSION" C-d
left_cleanly
log "stories260K: greedy text, /temp, /seed, /stats, Ctrl-C at the prompt, Ctrl-D: ok"

# SIGTERM at the prompt, in the middle of a line, ends the REPL as Ctrl-D does: the terminal is
# restored and the shell that started it goes on.
start_repl "$PORT"
TM send-keys -t "$SESSION" -l -- "half typed"
sleep 0.2
terminate_repl
left_cleanly
log "SIGTERM at the prompt: the REPL left with status 0 and the terminal echoing"

# no_sequences_left NAME: the gpu node dropped every sequence, with no live sequence and no
# KV-cache on the shard (a trace of the cluster, recorded as NAME.json).
no_sequences_left() {
  "$TRACE" --connect "127.0.0.1:$PORT" --record "$WORK/$1.json" --duration 2.5 --quiet \
    2>"$WORK/trace.err" || fail "fastdecode-trace failed"
  python3 - "$WORK/$1.json" <<'PY'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
last = {}
for e in events:
    if e.get("ph") == "C" and e.get("cat") == "shard" and "sequences" in e.get("args", {}):
        last[e["tid"]] = e["args"]
if not last:
    sys.exit("no shard snapshot in the trace")
for args in last.values():
    if args["sequences"] != 0 or args.get("used_pages", 0) != 0:
        sys.exit("shard still holds %s" % args)
sched = [e["args"] for e in events if e.get("ph") == "C" and e.get("cat") == "scheduler"]
if sched and sched[-1].get("running", 0) != 0:
    sys.exit("the scheduler still runs %s" % sched[-1])
PY
}

# --- a random model with a long context: streaming, cancel, node loss -------------------------
"$MKMODEL" --out "$WORK/slow.gguf" --layers 4 --dim 256 --heads 8 --kv-heads 2 --ff 768 \
  --vocab 512 --ctx 2048 --seed 4 >/dev/null || fail "fastdecode-mkmodel failed"
start_cluster slow "$WORK/slow.gguf"
start_repl "$PORT" --temperature 0 -n 1500

# Tokens appear while the answer is generated: the text grows across captures.
send "streaming test"
declare -A seen=()
deadline=$((SECONDS + 60))
while ! idle; do
  len=$(answer_of "streaming test" | wc -c)
  ((len > 0)) && seen[$len]=1
  ((SECONDS >= deadline)) && fail "the streaming answer did not end within 60 s"
  sleep 0.02
done
final=$(answer_of "streaming test" | wc -c)
unset "seen[$final]"
((${#seen[@]} >= 3)) || fail "the answer appeared in ${#seen[@]} partial steps, not token by token"
log "the answer grew through ${#seen[@]} partial lengths before its $final bytes were complete"

# Ctrl-C during a generation cancels it; the REPL is ready for the next prompt.
send "cancel me"
wait_first_tokens "cancel me"
TM send-keys -t "$SESSION" C-c
wait_pane "^\[cancelled after [0-9]+ tokens\]$" 10
wait_idle 5
n=$(pane | sed -nE 's/^\[cancelled after ([0-9]+) tokens\]$/\1/p' | tail -n 1)
((n < 1500)) || fail "the cancelled answer still had $n tokens"
log "Ctrl-C stopped the answer after $n tokens"
no_sequences_left after-cancel || fail "the cancelled sequence still holds KV-cache"
log "after the cancel the shard holds no sequence and no pages"
ask "/max 5"
ask "after cancel"
[[ -n $(answer_of "after cancel") ]] || fail "no answer after the cancel"

# SIGTERM during a generation cancels it as Ctrl-C does, then ends the REPL with status 0 and the
# terminal as it was; the gpu node drops the sequence.
ask "/max 1500"
cancels=$(pane | grep -cE '^\[cancelled after [0-9]+ tokens\]$')
send "terminate me"
wait_first_tokens "terminate me"
terminate_repl
left_cleanly
(($(pane | grep -cE '^\[cancelled after [0-9]+ tokens\]$') == cancels + 1)) ||
  fail "SIGTERM during a generation did not cancel it"
no_sequences_left after-sigterm || fail "the sequence ended by SIGTERM still holds KV-cache"
log "SIGTERM during a generation cancelled it and ended the REPL; the shard holds no sequence"
start_repl "$PORT" --temperature 0 -n 1500

# A node that goes away is reported; the REPL does not hang.
kill -KILL "${PID[gpu-slow]}"
sleep 0.5
send "anyone there"
wait_pane "connection to 127.0.0.1:$PORT lost" 10
wait_pane "^REPL-EXIT=1$" 10
log "passed"
