#!/usr/bin/env bash
# Issue 10: 48 concurrent agents replaying the Claude-Code traces against one flashstate server per
# cache policy on the GPU (the ~2B Qwen3-Next preset), `flashstate bench compare`, same seed.
#
#   bash benchmarks/gpu/headline.sh policies   # flashstate, vllm, sglang, none (POLICIES= a subset)
#   bash benchmarks/gpu/headline.sh ablation   # ASC alone (LRU eviction), GDS alone (block-aligned
#                                              # checkpoints), ASC + GDS, ASC + GDS + host tier
#   runs of separate commands merge with `flashstate bench report DIR... --out DIR`
#
# Environment: DEVICE / DTYPE (default cuda / bfloat16; cpu / float32 for a smoke run), FLASHSTATE_TRACES
# (default .traces/claude-code: carry a copy, the set is not in the repo), RESULTS (default
# bench-results/headline; when OUT is set, as on the device machine, the results are also packed into
# $OUT/headline-<mode>.tgz, since only a few files come back from there), PRESET (default
# qwen3-next-2b), WARMUP / DURATION / DRAIN (seconds per run, default 30 / 90 / 30), KV_BYTES (KV + state
# budget, default 17G: about 70% of what the 48 agents hold at this scale, where the validated simulator
# puts vllm at the reference's ~30% hit rate; every policy is near its ceiling from 24G on), and any extra `bench compare` flags after the mode.
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
KV_BYTES="${KV_BYTES:-17G}"
PY="${PYTHON:-python3}"
model="$("$PY" -c "from flashstate.models.presets import preset_dir; print(preset_dir('$PRESET'))")"
serve="--device ${DEVICE:-cuda} --dtype ${DTYPE:-bfloat16} --max-num-seqs 48 --max-num-batched-tokens 8192 --kv-cache-memory-bytes $KV_BYTES"
common=(
  --model "$model" --workload "$TRACES" --seed 0 --agents 48 --warmup "$WARMUP" --duration "$DURATION" --drain "$DRAIN"
  --length-scale 0.25 --max-context 65536 --time-scale 0.05 --max-think-time 5 --max-output-tokens 512
  --server-timeout 900 --no-progress
)
case "$mode" in
  policies)
    "$PY" -m flashstate.cli bench compare --policies "${POLICIES:-flashstate,vllm,sglang,none}" \
      --serve-args "$serve" "${common[@]}" --out "$RESULTS/policies" "$@"
    ;;
  ablation)
    "$PY" -m flashstate.cli bench compare --policies "" --reference asc-only \
      --variant "asc-only=flashstate --prefix-cache-eviction lru" \
      --variant "gds-aligned=flashstate --mamba-checkpoint-placement aligned" \
      --variant "asc-gds=flashstate" \
      --variant "asc-gds-host=flashstate --host-cache memory --host-cache-bytes 64G" \
      --serve-args "$serve" "${common[@]}" --out "$RESULTS/ablation" "$@"
    ;;
  *)
    echo "headline.sh: unknown mode '$mode' (policies or ablation)" >&2
    exit 2
    ;;
esac
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/headline-$mode.tgz" -C "$RESULTS" "$mode"
fi
