#!/usr/bin/env bash
# Issue 10: 48 concurrent agents replaying the Claude-Code traces against one flashstate server per
# cache policy on the GPU (the ~2B Qwen3-Next preset), `flashstate bench compare`, same seed.
#
#   bash benchmarks/gpu/headline.sh policies   # flashstate, vllm, sglang, none
#   bash benchmarks/gpu/headline.sh ablation   # ASC alone (LRU eviction), ASC + GDS, ASC + GDS + host tier
#   (GDS over block-aligned checkpoints needs an aligned placement for the flashstate policy: not yet)
#
# Environment: FLASHSTATE_TRACES (default .traces/claude-code: carry a copy, the set is not in the repo),
# RESULTS (default bench-results/headline; when OUT is set, as on the device machine, the results are
# also packed into $OUT/headline-<mode>.tgz, since only a few files come back from there), PRESET
# (default qwen3-next-2b), DURATION (measured seconds per run, default 90), KV_BYTES (KV + state budget,
# default 8G: well below the working set of 48 agents at this scale), and any extra `bench compare`
# flags as arguments after the mode.
set -euo pipefail
cd "$(dirname "$0")/../.."
mode="${1:?usage: headline.sh policies|ablation [bench compare flags]}"
shift
TRACES="${FLASHSTATE_TRACES:-.traces/claude-code}"
RESULTS="${RESULTS:-bench-results/headline}"
PRESET="${PRESET:-qwen3-next-2b}"
DURATION="${DURATION:-90}"
KV_BYTES="${KV_BYTES:-8G}"
PY="${PYTHON:-python3}"
model="$("$PY" -c "from flashstate.models.presets import preset_dir; print(preset_dir('$PRESET'))")"
serve="--device cuda --dtype bfloat16 --max-num-seqs 48 --max-num-batched-tokens 8192 --kv-cache-memory-bytes $KV_BYTES"
common=(
  --model "$model" --workload "$TRACES" --seed 0 --agents 48 --warmup 30 --duration "$DURATION" --drain 30
  --length-scale 0.25 --max-context 65536 --time-scale 0.05 --max-think-time 5 --max-output-tokens 512
  --server-timeout 900 --no-progress
)
case "$mode" in
  policies)
    "$PY" -m flashstate.cli bench compare --policies flashstate,vllm,sglang,none --reference vllm \
      --serve-args "$serve" "${common[@]}" --out "$RESULTS/policies" "$@"
    ;;
  ablation)
    "$PY" -m flashstate.cli bench compare --policies "" --reference asc-only \
      --variant "asc-only=flashstate --prefix-cache-eviction lru" \
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
