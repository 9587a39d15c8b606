#!/usr/bin/env bash
# Issue 10: 48 concurrent agents replaying the Claude-Code traces against one flashstate server per
# cache policy on the GPU (the ~2B Qwen3-Next preset), `flashstate bench compare`, same seed.
#
#   bash benchmarks/gpu/headline.sh policies   # flashstate, vllm, sglang, none (POLICIES= a subset)
#   bash benchmarks/gpu/headline.sh ablation   # ASC alone (LRU eviction), GDS alone (block-aligned
#                                              # checkpoints), ASC + GDS, ASC + GDS + host tier
#                                              # (VARIANTS= a subset)
#   runs of separate commands merge with `flashstate bench report DIR... --out DIR`
#
# Environment: DEVICE / DTYPE (default cuda / bfloat16; cpu / float32 for a smoke run), FLASHSTATE_TRACES
# (default .traces/claude-code: carry a copy, the set is not in the repo), RESULTS (default
# bench-results/headline; when OUT is set, as on the device machine, the results are also packed into
# $OUT/headline-<mode>.tgz, since only a few files come back from there), PRESET (default
# qwen3-next-2b), WARMUP / DURATION / DRAIN (seconds per run, default 30 / 90 / 30), KV_BYTES (KV + state
# budget; defaults: 17G for qwen3-next-2b, 13G for nemotron-h-2b, 11G for kimi-linear-2b, where the
# simulator puts vllm near the reference's ~30% hit rate, about 70% of what the 48 agents hold at this
# scale), HOST_BYTES (policies mode: flashstate runs with a host tier of this size, as `flashstate-host`),
# FLASHSTATE_ARGS (more serve flags for `flashstate-host`, e.g. --long-prefill-token-threshold 2048), SERVE_ARGS
# (more serve flags for every server: engine features, e.g. --no-mixed-step-graphs), GPUS (default
# 1: the runs one after another; N > 1 spreads them over GPUs 0..N-1, one server per GPU at a time, each
# measured alone on its card, then merges the results), AGENTS (default 48; also the servers'
# --max-num-seqs), LENGTH_SCALE / MAX_CONTEXT (default 0.25 / 65536; a real-size preset at real lengths:
# 1 and its max_model_len), KV_BYTES=card (no budget: what the weights leave), FRACTION (instead of KV_BYTES:
# that fraction of the agents' working set W at these flags, `flashstate working-set`, chosen before the
# run), TRACE_SPLIT (tune or validate: one half of the traces, for the replay and for W), and any extra
# `bench compare` flags after the mode.
set -euo pipefail
cd "$(dirname "$0")/../.."
mode="${1:?usage: headline.sh policies|ablation [bench compare flags]}"
shift
TRACES="${FLASHSTATE_TRACES:-.traces/claude-code}"
RESULTS="${RESULTS:-bench-results/headline}"
PRESET="${PRESET:-qwen3-next-2b}"
WARMUP="${WARMUP:-30}"
DURATION="${DURATION:-90}"
DRAIN="${DRAIN:-30}"
case "$PRESET" in  # where the simulator puts vllm near the reference's ~30% (docs/history/benchmarks-2026-11.md)
  qwen3-next-2b) default_kv=17G ;;
  nemotron-h-2b) default_kv=13G ;;
  kimi-linear-2b) default_kv=11G ;;
  *) default_kv="" ;;
esac
if [ -n "${FRACTION:-}" ] && [ -n "${KV_BYTES:-}" ]; then
  echo "headline.sh: set KV_BYTES or FRACTION, not both (KV_BYTES=$KV_BYTES, FRACTION=$FRACTION)" >&2
  exit 2
fi
KV_BYTES="${KV_BYTES:-$default_kv}"
GPUS="${GPUS:-1}"
AGENTS="${AGENTS:-48}"
PY="${PYTHON:-python3}"
split=()
[ -z "${TRACE_SPLIT:-}" ] || split=(--trace-split "$TRACE_SPLIT")
if [ -n "${FRACTION:-}" ]; then  # the budget named by its fraction of the working set
  KV_BYTES="$("$PY" -m flashstate.cli working-set "$TRACES" --model "$PRESET" --agents "$AGENTS" \
    --length-scale "${LENGTH_SCALE:-0.25}" --max-context "${MAX_CONTEXT:-65536}" --max-output-tokens 512 \
    --fractions "$FRACTION" "${split[@]}" | "$PY" -c 'import json, sys; print(next(iter(json.load(sys.stdin)["budgets"].values())))')"
  echo "headline.sh: budget $KV_BYTES bytes = $FRACTION x the working set${TRACE_SPLIT:+ of the $TRACE_SPLIT half}"
fi
if [ -z "$KV_BYTES" ]; then
  echo "headline.sh: no default KV_BYTES for preset $PRESET (set KV_BYTES; 'card': the memory weights leave)" >&2
  exit 2
fi
budget="--kv-cache-memory-bytes $KV_BYTES"
[ "$KV_BYTES" != card ] || budget=""  # no budget chosen: the card's memory, as a user runs it
if "$PY" -c "import sys; from flashstate.models.presets import DUMMY_ONLY; sys.exit('$PRESET' not in DUMMY_ONLY)"; then
  model="$PRESET"  # a real-size preset: random weights made on the device, never written to disk
  budget="$budget --load-format dummy"
else
  model="$("$PY" -c "from flashstate.models.presets import preset_dir; print(preset_dir('$PRESET'))")"
fi
serve="--device ${DEVICE:-cuda} --dtype ${DTYPE:-bfloat16} --max-num-seqs $AGENTS --max-num-batched-tokens 8192 $budget ${SERVE_ARGS:-}"
common=(
  --model "$model" --workload "$TRACES" --seed 0 --agents "$AGENTS" --warmup "$WARMUP" --duration "$DURATION" --drain "$DRAIN"
  --length-scale "${LENGTH_SCALE:-0.25}" --max-context "${MAX_CONTEXT:-65536}" --time-scale 0.05 --max-think-time 5
  --max-output-tokens 512 --server-timeout 900 --no-progress "${split[@]}"
)
# one run: its name, then its `bench compare` selection
runs=()
case "$mode" in
  policies)
    IFS=, read -r -a names <<< "${POLICIES:-flashstate,vllm,sglang,none}"
    reference=""
    for p in "${names[@]}"; do
      if [ "$p" = flashstate ] && [ -n "${HOST_BYTES:-}" ]; then  # the full flashstate: with its host tier
        runs+=("flashstate-host|--variant flashstate-host=flashstate --host-cache memory --host-cache-bytes $HOST_BYTES ${FLASHSTATE_ARGS:-}")
      else
        runs+=("$p|--policies $p")
      fi
      [ "$p" != vllm ] || reference=vllm
    done
    [ -n "$reference" ] || reference="${runs[0]%%|*}"
    ;;
  ablation)
    runs=(
      "asc-only|--variant asc-only=flashstate --prefix-cache-eviction lru"
      "gds-aligned|--variant gds-aligned=flashstate --mamba-checkpoint-placement aligned"
      "asc-gds|--variant asc-gds=flashstate"
      # the host store is page-locked at start-up (64G: 72G with the arena's slack); the simulator meets
      # every target at 64G and puts TTFT p90 just short of 8x at 32G (docs/history/benchmarks-2026-11.md)
      "asc-gds-host|--variant asc-gds-host=flashstate --host-cache memory --host-cache-bytes 64G"
    )
    reference=asc-only
    if [ -n "${VARIANTS:-}" ]; then  # a subset, by name
      picked=()
      for run in "${runs[@]}"; do if [[ ",$VARIANTS," == *",${run%%|*},"* ]]; then picked+=("$run"); fi; done
      runs=("${picked[@]}")
      reference="${runs[0]%%|*}"
    fi
    ;;
  *)
    echo "headline.sh: unknown mode '$mode' (policies or ablation)" >&2
    exit 2
    ;;
esac
out="$RESULTS/$mode"

compare() {  # compare GPU DIR REFERENCE RUN...: the runs one after another on one GPU, results in DIR
  local gpu="$1" dir="$2" ref="$3" policies="" variants=()
  shift 3
  for run in "$@"; do
    local spec="${run#*|}"
    case "$spec" in
      --policies\ *) policies="${policies:+$policies,}${spec#--policies }" ;;
      --variant\ *) variants+=(--variant "${spec#--variant }") ;;
    esac
  done
  CUDA_VISIBLE_DEVICES="$gpu" "$PY" -m flashstate.cli bench compare --policies "$policies" "${variants[@]}" \
    --reference "$ref" --serve-args "$serve" "${common[@]}" --out "$dir" "${extra[@]}"
}

extra=("$@")
if [ "$GPUS" -le 1 ]; then
  compare "${CUDA_VISIBLE_DEVICES:-0}" "$out" "$reference" "${runs[@]}"
else
  mkdir -p "$out"
  pids=()
  for ((g = 0; g < GPUS; g++)); do
    part=()
    for ((i = g; i < ${#runs[@]}; i += GPUS)); do part+=("${runs[$i]}"); done
    [ ${#part[@]} -gt 0 ] || continue
    compare "$g" "$out/gpu$g" "${part[0]%%|*}" "${part[@]}" > "$out/gpu$g.log" 2>&1 &
    pids+=($!)
  done
  status=0
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  cat "$out"/gpu*.log
  [ "$status" -eq 0 ] || { echo "headline.sh: a GPU's runs failed (logs above)" >&2; exit 1; }
  "$PY" -m flashstate.cli bench report "$out"/gpu*/ --reference "$reference" --out "$out"
fi
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/headline-$mode.tgz" -C "$RESULTS" "$mode"
fi
