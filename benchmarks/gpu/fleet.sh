#!/usr/bin/env bash
# Issue 33 on the GPU: what a fleet costs and what sharing recovers. 48 agents replay the Claude-Code traces
# with the headline's flags (headline.sh) against, one variant after another on one card:
#   one           one `flashstate serve` with the whole budget: KV_BYTES of KV + state, a HOST_BYTES host tier
#   fleet         two replicas sharing the card behind vllm-router (cache_aware), each with half of both
#                 budgets, each host tier its own (`--host-cache memory`)
#   fleet-shared  the same two replicas on one Mooncake master (`flashstate fleet --shared-host-cache`),
#                 each contributing half of HOST_BYTES to the pool: a replica restores what the other wrote
#
#   VARIANTS="one fleet fleet-shared" bash benchmarks/gpu/fleet.sh
#   flashstate bench report $RESULTS/one $RESULTS/fleet $RESULTS/fleet-shared --out $RESULTS/report
#
# Environment as in headline.sh: FLASHSTATE_TRACES, RESULTS (default bench-results/fleet), PRESET, WARMUP /
# DURATION / DRAIN, KV_BYTES (default 17G), HOST_BYTES (default 64G), AGENTS (default 48). Each variant's
# start-up (to the router's or the server's /health) is printed and kept in $RESULTS/<variant>/startup_s.
set -euo pipefail
cd "$(dirname "$0")/../.."
TRACES="${FLASHSTATE_TRACES:-.traces/claude-code}"
RESULTS="${RESULTS:-bench-results/fleet}"
PRESET="${PRESET:-qwen3-next-2b}"
WARMUP="${WARMUP:-30}" DURATION="${DURATION:-90}" DRAIN="${DRAIN:-30}"
KV_BYTES="${KV_BYTES:-17G}" HOST_BYTES="${HOST_BYTES:-64G}" AGENTS="${AGENTS:-48}"
PY="${PYTHON:-python3}"
PORT=8100
half() { "$PY" -c "from flashstate.args import human_readable_int as b; print(b('$1') // 2)"; }
model="$("$PY" -c "from flashstate.models.presets import preset_dir; print(preset_dir('$PRESET'))")"
serve=(--device "${DEVICE:-cuda}" --dtype "${DTYPE:-bfloat16}" --max-num-seqs "$AGENTS" --max-num-batched-tokens 8192)
replay=(
  --workload "$TRACES" --seed 0 --agents "$AGENTS" --warmup "$WARMUP" --duration "$DURATION" --drain "$DRAIN"
  --length-scale 0.25 --max-context 65536 --time-scale 0.05 --max-think-time 5 --max-output-tokens 512
  --retries 3 --no-progress
)

wait_health() {  # wait_health PID: until :$PORT/health answers 200 (or PID exits)
  local t0=$SECONDS
  until curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; do
    kill -0 "$1" 2> /dev/null || { echo "fleet.sh: the server exited before /health" >&2; return 1; }
    sleep 1
  done
  echo $((SECONDS - t0))
}

run_variant() {
  local name="$1" dir="$RESULTS/$1" pid startup
  mkdir -p "$dir"
  case "$name" in
    one)
      setsid "$PY" -m flashstate.cli serve "$model" "${serve[@]}" --port "$PORT" --kv-cache-memory-bytes "$KV_BYTES" \
        --host-cache memory --host-cache-bytes "$HOST_BYTES" > "$dir/server.log" 2>&1 &
      ;;
    fleet)
      setsid "$PY" -m flashstate.cli fleet --replicas 2 --policy cache_aware --port "$PORT" --out "$dir/logs" -- \
        "$model" "${serve[@]}" --kv-cache-memory-bytes "$(half "$KV_BYTES")" \
        --host-cache memory --host-cache-bytes "$(half "$HOST_BYTES")" > "$dir/fleet.log" 2>&1 &
      ;;
    fleet-shared)
      setsid "$PY" -m flashstate.cli fleet --replicas 2 --policy cache_aware --port "$PORT" --out "$dir/logs" \
        --shared-host-cache --host-cache-bytes "$(half "$HOST_BYTES")" -- \
        "$model" "${serve[@]}" --kv-cache-memory-bytes "$(half "$KV_BYTES")" > "$dir/fleet.log" 2>&1 &
      ;;
    *) echo "fleet.sh: unknown variant '$name' (one, fleet, fleet-shared)" >&2; return 2 ;;
  esac
  pid=$!
  startup="$(wait_health "$pid")" || { kill -- -"$pid" 2> /dev/null || true; return 1; }
  echo "$startup" > "$dir/startup_s"
  echo "fleet.sh: $name healthy after ${startup} s"
  "$PY" -m flashstate.cli bench run --url "http://127.0.0.1:$PORT" --label "$name" "${replay[@]}" --out "$dir" \
    || echo "fleet.sh: $name's replay failed" >&2
  kill -TERM -- -"$pid" 2> /dev/null || true
  for _ in $(seq 60); do kill -0 "$pid" 2> /dev/null || break; sleep 1; done
  kill -KILL -- -"$pid" 2> /dev/null || true
}

for v in ${VARIANTS:-one fleet fleet-shared}; do
  run_variant "$v"
done
# On the device machine only a few files come back from $OUT: the results go back as one archive too
# (keep RESULTS outside $OUT there).
if [ -n "${OUT:-}" ]; then
  tar -czf "$OUT/fleet.tgz" -C "$RESULTS" .
fi
